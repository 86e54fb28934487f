#pragma once
/// Keeps one engine worker running: composes its process, channel and watchdog, turns
/// worker messages into scheduler callbacks, and owns the restart policy (backoff; a crash
/// loop makes it `unavailable` for a while instead of spinning).

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "colibri/protocol/worker_messages.hpp"
#include "config.hpp"
#include "job_runner.hpp"
#include "watchdog.hpp"
#include "worker_channel.hpp"
#include "worker_process.hpp"

namespace colibri::daemon {

enum class worker_state {
    starting,    ///< spawned, loading the model
    ready,       ///< idle, can take a job
    busy,        ///< running a job
    restarting,  ///< dead, waiting out the backoff
    unavailable, ///< crash loop: waiting longer before the next attempt
    stopping,
    stopped
};

std::string_view to_string(worker_state state);

class supervisor final : public job_runner {
public:
    using clock = std::chrono::steady_clock;

    /// Callbacks into the scheduler. They may call back into the supervisor.
    struct handlers {
        std::function<void()> on_ready; ///< a job may be run now
        std::function<void(std::uint64_t job, std::string_view text)> on_piece;
        std::function<void(const protocol::worker::done_msg&)> on_done;
        std::function<void(const protocol::worker::error_msg&)> on_error;
        /// The worker died or was killed while running `job`.
        std::function<void(std::uint64_t job, protocol::error_code code, const std::string& reason)> on_job_lost;
        /// Entered the crash-loop state; queued work should be failed.
        std::function<void(const std::string& reason)> on_unavailable;
        /// Any state change (for systemd STATUS and logs).
        std::function<void(worker_state)> on_state;
    };

    supervisor(boost::asio::io_context& io, worker_launch launch, watchdog_config cfg, handlers h);
    supervisor(const supervisor&) = delete;
    supervisor& operator=(const supervisor&) = delete;

    void start();
    /// Runs a job. Precondition: state() == ready.
    void run(const protocol::worker::run_msg& msg) override;
    /// Asks the worker to stop `job` at its next piece; the worker stays busy until it answers.
    void cancel(std::uint64_t job) override;
    /// Asks the worker to exit (SIGKILL after a grace period); calls `done` once it is reaped.
    void shutdown(std::function<void()> done);

    worker_state state() const { return state_; }
    bool idle() const override { return state_ == worker_state::ready; }
    bool unavailable() const override { return state_ == worker_state::unavailable; }
    pid_t pid() const { return proc_.pid(); }
    /// Worker failures so far (each one is followed by a restart).
    int restarts() const { return restarts_; }
    const std::string& last_crash_reason() const override { return last_crash_reason_; }
    std::optional<clock::time_point> last_crash_time() const { return last_crash_time_; }
    const nlohmann::json& model_info() const { return model_info_; }
    /// The worker's KV-cache counters: from its ready message, then after each job (so a
    /// restarted worker reports its cold cache).
    const nlohmann::json& cache_stats() const { return cache_stats_; }
    /// A forwarding worker's upstreams, as of its last job (null: none yet, or a local engine).
    const nlohmann::json& upstream_stats() const { return upstream_stats_; }

private:
    void spawn();
    void set_state(worker_state s);
    void handle_message(protocol::worker::from_worker& msg);
    void kill_worker(const std::string& reason, protocol::error_code code);
    void wait_sigchld();
    void reap();
    void worker_exited(int status);

    worker_launch launch_;
    watchdog_config cfg_;
    handlers h_;

    boost::asio::signal_set sigchld_;
    boost::asio::steady_timer restart_timer_;
    boost::asio::steady_timer stop_timer_;
    worker_channel channel_;
    watchdog watchdog_;
    worker_process proc_; ///< last member: the worker is killed and reaped first

    worker_state state_ = worker_state::stopped;
    std::uint64_t job_ = 0; ///< job the worker runs; 0 when none

    std::string kill_reason_; ///< set when the supervisor itself killed the worker
    protocol::error_code kill_code_ = protocol::error_code::worker_crashed;
    std::string fatal_message_; ///< from a worker that could not start, or that is going (its device failed)

    int restarts_ = 0;
    int consecutive_failures_ = 0;
    std::deque<clock::time_point> crash_times_;
    std::string last_crash_reason_;
    std::optional<clock::time_point> last_crash_time_;
    nlohmann::json model_info_ = nlohmann::json::object();
    nlohmann::json cache_stats_;
    nlohmann::json upstream_stats_;
    std::function<void()> on_stopped_;
};

} // namespace colibri::daemon
