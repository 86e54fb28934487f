#include "service_reporter.hpp"

#include "log.hpp"

namespace colibri::daemon {

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("systemd");
    return log;
}

} // namespace

service_reporter::service_reporter(boost::asio::io_context& io, sd_notifier& notifier,
                                   std::function<std::string()> status_text, std::chrono::milliseconds refresh)
    : notifier_(notifier), status_text_(std::move(status_text)), refresh_(refresh), watchdog_timer_(io),
      refresh_timer_(io) {}

void service_reporter::start() {
    if (!notifier_.enabled()) return;
    if (auto interval = notifier_.watchdog_interval())
        logger()->info("systemd watchdog: pinging every {} ms", interval->count() / 1000);
    update();
    schedule_watchdog();
    schedule_refresh();
}

void service_reporter::update() {
    if (!notifier_.enabled()) return;
    std::string text = status_text_();
    if (text == last_status_) return;
    last_status_ = text;
    notifier_.notify("STATUS=" + text);
}

void service_reporter::ready() {
    if (ready_) return;
    ready_ = true;
    if (!notifier_.enabled()) return;
    last_status_ = status_text_();
    notifier_.notify("READY=1\nSTATUS=" + last_status_);
}

void service_reporter::stopping() {
    if (stopping_) return;
    stopping_ = true;
    watchdog_timer_.cancel();
    refresh_timer_.cancel();
    if (!notifier_.enabled()) return;
    last_status_ = status_text_();
    notifier_.notify("STOPPING=1\nSTATUS=" + last_status_);
}

void service_reporter::schedule_watchdog() {
    const auto interval = notifier_.watchdog_interval();
    if (!interval || stopping_) return;
    watchdog_due_ = std::chrono::steady_clock::now() + *interval;
    watchdog_timer_.expires_at(watchdog_due_);
    watchdog_timer_.async_wait([this](boost::system::error_code ec) {
        if (ec || stopping_) return;
        // This handler runs only when the event loop does: a loop stuck in a handler
        // never gets here, the pings stop and systemd's watchdog acts.
        const auto late = std::chrono::steady_clock::now() - watchdog_due_;
        if (late > *notifier_.watchdog_interval())
            logger()->warn("the event loop stalled for {} ms",
                           std::chrono::duration_cast<std::chrono::milliseconds>(late).count());
        notifier_.notify("WATCHDOG=1");
        schedule_watchdog();
    });
}

void service_reporter::schedule_refresh() {
    if (stopping_) return;
    refresh_timer_.expires_after(refresh_);
    refresh_timer_.async_wait([this](boost::system::error_code ec) {
        if (ec || stopping_) return;
        update();
        schedule_refresh();
    });
}

} // namespace colibri::daemon
