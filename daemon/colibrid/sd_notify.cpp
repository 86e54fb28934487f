#include "sd_notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if COLIBRI_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace colibri::daemon {

namespace {

std::optional<std::chrono::microseconds> read_watchdog() {
#if COLIBRI_HAVE_LIBSYSTEMD
    std::uint64_t usec = 0;
    if (::sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
        return std::chrono::microseconds(static_cast<long long>(usec / 2));
    return std::nullopt;
#else
    const char* usec = std::getenv("WATCHDOG_USEC");
    if (!usec) return std::nullopt;
    const char* pid = std::getenv("WATCHDOG_PID");
    const long long v = std::strtoll(usec, nullptr, 10);
    if (v > 0 && (!pid || std::strtol(pid, nullptr, 10) == ::getpid())) return std::chrono::microseconds(v / 2);
    return std::nullopt;
#endif
}

} // namespace

sd_notifier::sd_notifier() : watchdog_(read_watchdog()) {
    const char* sock = std::getenv("NOTIFY_SOCKET");
    if (!sock || !*sock) return;
    addr_ = sock;
    if ((addr_[0] != '/' && addr_[0] != '@') || addr_.size() >= sizeof(sockaddr_un::sun_path)) {
        addr_.clear();
        return;
    }
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    enabled_ = fd_ >= 0;
}

sd_notifier::~sd_notifier() {
    if (fd_ >= 0) ::close(fd_);
}

bool sd_notifier::notify(const std::string& state) const {
    if (fd_ < 0) return false;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, addr_.data(), addr_.size());
    if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0'; // abstract namespace
    const socklen_t len =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + addr_.size() + (addr_[0] == '@' ? 0 : 1));
    // Non-blocking: when the receiver's queue is full the message is dropped, the event
    // loop never waits (the next STATUS or WATCHDOG follows soon anyway).
    return ::sendto(fd_, state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                    reinterpret_cast<const sockaddr*>(&addr), len) == static_cast<ssize_t>(state.size());
}

} // namespace colibri::daemon
