#include "sd_notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace colibri::daemon {

sd_notifier::sd_notifier() {
    if (const char* usec = std::getenv("WATCHDOG_USEC")) {
        const char* pid = std::getenv("WATCHDOG_PID");
        const long long v = std::strtoll(usec, nullptr, 10);
        if (v > 0 && (!pid || std::strtol(pid, nullptr, 10) == ::getpid()))
            watchdog_ = std::chrono::microseconds(v / 2);
    }
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("WATCHDOG_PID");
    const char* sock = std::getenv("NOTIFY_SOCKET");
    if (!sock || !*sock) return;
    addr_ = sock;
    ::unsetenv("NOTIFY_SOCKET");
    if ((addr_[0] != '/' && addr_[0] != '@') || addr_.size() >= sizeof(sockaddr_un::sun_path)) {
        addr_.clear();
        return;
    }
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0); // never block the daemon
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
    return ::sendto(fd_, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
                    len) == static_cast<ssize_t>(state.size());
}

} // namespace colibri::daemon
