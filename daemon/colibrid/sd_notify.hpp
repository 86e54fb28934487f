#pragma once
/// systemd service notifications (READY=1, STATUS=, WATCHDOG=1, STOPPING=1), a no-op when
/// the daemon does not run under systemd.
///
/// The datagram goes to $NOTIFY_SOCKET from a non-blocking socket of our own rather than
/// through libsystemd's sd_notify(), which blocks while the receiver's queue is full: the
/// event loop must never wait on the service manager. libsystemd, when the daemon is
/// built with it, reads the watchdog settings (sd_watchdog_enabled) and takes activated
/// sockets (sd_listen_fds, in listen_socket.cpp).
///
/// The environment is left as systemd set it; worker_process removes NOTIFY_SOCKET,
/// WATCHDOG_* and LISTEN_* from the worker's environment.

#include <chrono>
#include <optional>
#include <string>

namespace colibri::daemon {

class sd_notifier {
public:
    /// Reads NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID.
    sd_notifier();
    sd_notifier(const sd_notifier&) = delete;
    sd_notifier& operator=(const sd_notifier&) = delete;
    ~sd_notifier();

    /// true when there is a notification socket to talk to.
    bool enabled() const { return enabled_; }

    /// Sends "KEY=VALUE\n..." lines; false when not under systemd or the send failed.
    bool notify(const std::string& state) const;

    /// Half the systemd watchdog period, when the service has one (WATCHDOG_USEC set
    /// and WATCHDOG_PID, when set, naming this process).
    std::optional<std::chrono::microseconds> watchdog_interval() const { return watchdog_; }

private:
    bool enabled_ = false;
    int fd_ = -1;
    std::string addr_;
    std::optional<std::chrono::microseconds> watchdog_;
};

/// The variables through which systemd talks to the main process only; never passed on
/// to child processes.
inline constexpr const char* service_environment_variables[] = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
                                                                "LISTEN_PID",    "LISTEN_FDS",    "LISTEN_FDNAMES"};

} // namespace colibri::daemon
