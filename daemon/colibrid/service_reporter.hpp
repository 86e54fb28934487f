#pragma once
/// What colibrid tells systemd: READY=1 once it can answer, STATUS= lines (model,
/// requests served, worker restarts), WATCHDOG=1 pings from a timer of the event loop
/// (so a wedged loop stops pinging and systemd's watchdog restarts the service), and
/// STOPPING=1 on shutdown. Does nothing when the daemon does not run under systemd.

#include <chrono>
#include <functional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "sd_notify.hpp"

namespace colibri::daemon {

class service_reporter {
public:
    /// `status_text` describes the daemon now; it is polled every `refresh` and sent
    /// when it changed.
    service_reporter(boost::asio::io_context& io, sd_notifier& notifier, std::function<std::string()> status_text,
                     std::chrono::milliseconds refresh = std::chrono::seconds(1));
    service_reporter(const service_reporter&) = delete;
    service_reporter& operator=(const service_reporter&) = delete;

    /// Starts the watchdog pings and the status refresh.
    void start();
    /// Sends the status now when it changed.
    void update();
    /// READY=1 (once) with the current status.
    void ready();
    bool announced_ready() const { return ready_; }
    /// STOPPING=1 with the current status; stops pinging.
    void stopping();

private:
    void schedule_watchdog();
    void schedule_refresh();

    sd_notifier& notifier_;
    std::function<std::string()> status_text_;
    std::chrono::milliseconds refresh_;
    boost::asio::steady_timer watchdog_timer_;
    boost::asio::steady_timer refresh_timer_;
    std::chrono::steady_clock::time_point watchdog_due_;
    std::string last_status_;
    bool ready_ = false;
    bool stopping_ = false;
};

} // namespace colibri::daemon
