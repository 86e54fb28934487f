// The worker watchdog: start-up, liveness and progress deadlines.
#include "watchdog.hpp"

namespace colibri::daemon {

using protocol::error_code;
namespace w = protocol::worker;

namespace {

std::chrono::milliseconds ms(int v) { return std::chrono::milliseconds(v); }

} // namespace

watchdog::watchdog(boost::asio::io_context& io, const watchdog_config& cfg, handlers h)
    : cfg_(cfg), h_(std::move(h)), start_timer_(io), progress_timer_(io), ping_timer_(io) {}

void watchdog::worker_started() {
    ++generation_;
    starting_ = true;
    probing_ = false;
    job_ = 0;
    ping_outstanding_ = false;
    const auto gen = generation_;
    start_timer_.expires_after(ms(cfg_.start_timeout_ms));
    start_timer_.async_wait([this, gen](boost::system::error_code ec) {
        if (ec || gen != generation_ || !starting_) return;
        if (h_.on_hang)
            h_.on_hang("did not become ready within " + std::to_string(cfg_.start_timeout_ms) + " ms",
                       error_code::worker_crashed);
    });
}

void watchdog::worker_ready() {
    starting_ = false;
    start_timer_.cancel();
    probing_ = true;
    schedule_ping();
}

void watchdog::pong(std::uint64_t n) {
    if (n == ping_n_) ping_outstanding_ = false;
}

void watchdog::job_alive(std::uint64_t job) {
    job_ = job;
    const auto gen = generation_;
    progress_timer_.expires_after(ms(cfg_.progress_timeout_ms));
    progress_timer_.async_wait([this, gen, job](boost::system::error_code ec) {
        if (ec || gen != generation_ || job != job_ || job_ == 0) return;
        if (h_.on_hang)
            h_.on_hang("no progress for " + std::to_string(cfg_.progress_timeout_ms) + " ms", error_code::timeout);
    });
}

void watchdog::job_ended() {
    job_ = 0;
    progress_timer_.cancel();
}

void watchdog::worker_stopping() {
    starting_ = false;
    probing_ = false;
    start_timer_.cancel();
    ping_timer_.cancel();
}

void watchdog::worker_gone() {
    ++generation_; // invalidates every handler armed for the dead worker
    starting_ = false;
    probing_ = false;
    job_ = 0;
    start_timer_.cancel();
    progress_timer_.cancel();
    ping_timer_.cancel();
}

void watchdog::schedule_ping() {
    const auto gen = generation_;
    ping_timer_.expires_after(ms(cfg_.ping_interval_ms));
    ping_timer_.async_wait([this, gen](boost::system::error_code ec) {
        if (ec || gen != generation_) return;
        on_ping_tick();
    });
}

void watchdog::on_ping_tick() {
    if (!probing_) return;
    const auto now = clock::now();
    if (ping_outstanding_) {
        if (now - ping_sent_ >= ms(cfg_.liveness_timeout_ms)) {
            if (h_.on_hang)
                h_.on_hang("no answer to the liveness probe for " + std::to_string(cfg_.liveness_timeout_ms) + " ms",
                           error_code::timeout);
            return;
        }
    } else {
        ping_outstanding_ = true;
        ping_sent_ = now;
        if (h_.send_ping) h_.send_ping(w::ping_msg{++ping_n_});
    }
    schedule_ping();
}

} // namespace colibri::daemon
