#pragma once
/// systemd service notifications (READY=1, STATUS=, WATCHDOG=1, STOPPING=1) written
/// directly to $NOTIFY_SOCKET; a no-op when the daemon does not run under systemd.

#include <chrono>
#include <optional>
#include <string>

namespace colibri::daemon {

class sd_notifier {
public:
    /// Reads and clears NOTIFY_SOCKET / WATCHDOG_USEC so that the worker does not inherit them.
    sd_notifier();
    sd_notifier(const sd_notifier&) = delete;
    sd_notifier& operator=(const sd_notifier&) = delete;
    ~sd_notifier();

    /// Sends "KEY=VALUE\n..." lines; false when not under systemd or the send failed.
    bool notify(const std::string& state) const;

    /// Half the systemd watchdog period, when the service has one.
    std::optional<std::chrono::microseconds> watchdog_interval() const { return watchdog_; }

private:
    int fd_ = -1;
    std::string addr_;
    std::optional<std::chrono::microseconds> watchdog_;
};

} // namespace colibri::daemon
