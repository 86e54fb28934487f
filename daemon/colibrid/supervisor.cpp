// The supervisor: the worker's life cycle and restart policy.
#include "supervisor.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "log.hpp"

namespace colibri::daemon {

namespace asio = boost::asio;
namespace w = protocol::worker;
using protocol::error_code;

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("supervisor");
    return log;
}

std::chrono::milliseconds ms(int v) { return std::chrono::milliseconds(v); }

} // namespace

std::string_view to_string(worker_state state) {
    switch (state) {
    case worker_state::starting: return "starting";
    case worker_state::ready: return "idle";
    case worker_state::busy: return "busy";
    case worker_state::restarting: return "restarting";
    case worker_state::unavailable: return "unavailable";
    case worker_state::stopping: return "stopping";
    case worker_state::stopped: return "stopped";
    }
    return "unknown";
}

supervisor::supervisor(asio::io_context& io, worker_launch launch, watchdog_config cfg, handlers h)
    : launch_(std::move(launch)), cfg_(cfg), h_(std::move(h)), sigchld_(io, SIGCHLD), restart_timer_(io),
      stop_timer_(io),
      channel_(io, {.on_message = [this](w::from_worker& msg) { handle_message(msg); },
                    .on_violation = [this](const std::string& why) { kill_worker(why, error_code::worker_crashed); },
                    .on_broken = [this] { proc_.kill(); }}),
      watchdog_(io, cfg,
                {.send_ping = [this](const w::ping_msg& ping) { channel_.send(ping); },
                 .on_hang = [this](const std::string& why, error_code code) { kill_worker(why, code); }}) {}

void supervisor::start() {
    wait_sigchld();
    spawn();
}

void supervisor::set_state(worker_state s) {
    if (s == state_) return;
    state_ = s;
    if (h_.on_state) h_.on_state(s);
}

void supervisor::spawn() {
    try {
        proc_ = worker_process::spawn(launch_);
    } catch (const std::system_error& e) {
        // Out of descriptors or processes: treat like a crash so that backoff applies.
        logger()->error("{}", e.what());
        worker_exited(W_EXITCODE(126, 0));
        return;
    }
    job_ = 0;
    kill_reason_.clear();
    kill_code_ = error_code::worker_crashed;
    fatal_message_.clear();
    channel_.open(proc_.take_socket());
    set_state(worker_state::starting);

    if (const int err = proc_.exec_error()) {
        fatal_message_ = "cannot execute worker '" + launch_.exe + "': " + std::strerror(err);
        logger()->error("{}", fatal_message_);
        return; // the child exits with 127; reap() reports it
    }
    logger()->info("worker started (pid {}, restart {})", proc_.pid(), restarts_);
    watchdog_.worker_started();
    channel_.start();
}

void supervisor::handle_message(w::from_worker& msg) {
    std::visit(
        [this](auto& m) {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, w::ready_msg>) {
                if (state_ != worker_state::starting) return;
                model_info_ = std::move(m.info);
                // The cache counters change with every job: kept apart from the model's description.
                cache_stats_ = model_info_.value("cache", nlohmann::json());
                model_info_.erase("cache");
                set_state(worker_state::ready);
                logger()->info("worker ready (pid {})", proc_.pid());
                watchdog_.worker_ready();
                if (h_.on_ready) h_.on_ready();
            } else if constexpr (std::is_same_v<T, w::piece_msg>) {
                if (m.job != job_) return;
                watchdog_.job_alive(job_);
                if (h_.on_piece) h_.on_piece(m.job, m.text);
            } else if constexpr (std::is_same_v<T, w::done_msg> || std::is_same_v<T, w::error_msg>) {
                if (m.job != job_ || job_ == 0) return;
                job_ = 0;
                watchdog_.job_ended();
                if constexpr (std::is_same_v<T, w::done_msg>) consecutive_failures_ = 0;
                // a worker that said it is going (fatal) takes no more work: the queue waits
                // for its successor
                if (state_ == worker_state::busy && fatal_message_.empty()) set_state(worker_state::ready);
                if (!m.upstreams.is_null()) upstream_stats_ = m.upstreams;
                if constexpr (std::is_same_v<T, w::done_msg>) {
                    if (!m.cache.is_null()) cache_stats_ = m.cache;
                    if (h_.on_done) h_.on_done(m);
                } else {
                    if (h_.on_error) h_.on_error(m);
                }
                if (state_ == worker_state::ready && h_.on_ready) h_.on_ready();
            } else if constexpr (std::is_same_v<T, w::pong_msg>) {
                watchdog_.pong(m.n);
            } else if constexpr (std::is_same_v<T, w::progress_msg>) {
                if (m.job == job_ && job_ != 0) watchdog_.job_alive(job_);
            } else {
                fatal_message_ = m.message;
                if (state_ == worker_state::starting) logger()->error("worker cannot start: {}", m.message);
                else logger()->error("worker is going: {}", m.message);
            }
        },
        msg);
}

void supervisor::run(const w::run_msg& msg) {
    job_ = msg.job;
    set_state(worker_state::busy);
    channel_.send(msg);
    watchdog_.job_alive(job_);
}

void supervisor::cancel(std::uint64_t job) {
    if (job != 0 && job == job_) channel_.send(w::cancel_msg{job});
}

void supervisor::kill_worker(const std::string& reason, error_code code) {
    if (!proc_.running()) return;
    if (kill_reason_.empty()) {
        kill_reason_ = reason;
        kill_code_ = code;
        logger()->warn("killing worker (pid {}): {}", proc_.pid(), reason);
    }
    proc_.kill();
}

void supervisor::wait_sigchld() {
    sigchld_.async_wait([this](boost::system::error_code ec, int) {
        if (ec) return;
        reap();
        wait_sigchld();
    });
}

void supervisor::reap() {
    // Signals coalesce: reap every child that is ready.
    for (;;) {
        int status = 0;
        const pid_t p = ::waitpid(-1, &status, WNOHANG);
        if (p <= 0) return;
        if (p == proc_.pid()) worker_exited(status);
    }
}

void supervisor::worker_exited(int status) {
    const pid_t old_pid = proc_.pid();
    proc_.reaped();
    channel_.close(); // silences every handler of the dead worker
    watchdog_.worker_gone();
    const std::uint64_t lost_job = job_;
    job_ = 0;

    if (state_ == worker_state::stopping) {
        logger()->info("worker (pid {}) stopped: {}", old_pid, describe_exit_status(status));
        stop_timer_.cancel();
        set_state(worker_state::stopped);
        if (auto done = std::move(on_stopped_)) done();
        return;
    }

    std::string reason = !kill_reason_.empty() ? kill_reason_ : describe_exit_status(status);
    if (!fatal_message_.empty()) reason = fatal_message_ + " (" + reason + ")";
    const error_code code = kill_reason_.empty() ? error_code::worker_crashed : kill_code_;
    last_crash_reason_ = reason;
    const auto now = clock::now();
    last_crash_time_ = now;
    crash_times_.push_back(now);
    while (!crash_times_.empty() && now - crash_times_.front() > ms(cfg_.crash_loop_window_ms))
        crash_times_.pop_front();
    ++consecutive_failures_;
    ++restarts_;
    logger()->error("worker (pid {}) failed: {}", old_pid, reason);

    if (lost_job != 0 && h_.on_job_lost) h_.on_job_lost(lost_job, code, reason);

    int delay_ms;
    if (static_cast<int>(crash_times_.size()) >= cfg_.crash_loop_threshold) {
        set_state(worker_state::unavailable);
        delay_ms = cfg_.crash_loop_retry_ms;
        logger()->error("worker failed {} times within {} ms; unavailable, next attempt in {} ms", crash_times_.size(),
                        cfg_.crash_loop_window_ms, delay_ms);
        if (h_.on_unavailable) h_.on_unavailable(reason);
    } else {
        set_state(worker_state::restarting);
        const int shift = std::min(consecutive_failures_ - 1, 20);
        delay_ms = static_cast<int>(
            std::min<long long>(static_cast<long long>(cfg_.restart_backoff_ms) << shift, cfg_.restart_backoff_max_ms));
        logger()->info("restarting worker in {} ms", delay_ms);
    }
    restart_timer_.expires_after(ms(delay_ms));
    restart_timer_.async_wait([this](boost::system::error_code ec) {
        if (ec || (state_ != worker_state::restarting && state_ != worker_state::unavailable)) return;
        spawn();
    });
}

void supervisor::shutdown(std::function<void()> done) {
    restart_timer_.cancel();
    if (!proc_.running()) {
        set_state(worker_state::stopped);
        if (done) done();
        return;
    }
    on_stopped_ = std::move(done);
    set_state(worker_state::stopping);
    watchdog_.worker_stopping();
    channel_.send(w::shutdown_msg{});
    const pid_t pid = proc_.pid();
    stop_timer_.expires_after(ms(2000));
    stop_timer_.async_wait([this, pid](boost::system::error_code ec) {
        if (ec || proc_.pid() != pid) return;
        logger()->warn("worker (pid {}) did not exit; killing it", pid);
        proc_.kill();
    });
}

} // namespace colibri::daemon
