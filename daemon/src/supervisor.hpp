#pragma once
/// Owns the engine worker process: spawns it on a socketpair, exchanges framed worker
/// messages, watches liveness (ping/pong) and per-job progress, and restarts it with
/// backoff. A crash loop makes it `unavailable` for a while instead of spinning.

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "colibri/protocol/line_framer.hpp"
#include "colibri/protocol/worker_messages.hpp"
#include "config.hpp"

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

/// How to start the worker: executable and arguments (the supervisor appends --fd 3).
struct worker_launch {
    std::string exe;
    std::vector<std::string> args;
};

/// Human description of a wait() status: "exited with status 3", "killed by signal 11 (SIGSEGV)".
std::string describe_exit_status(int status);

class supervisor {
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
    ~supervisor();

    void start();
    /// Runs a job. Precondition: state() == ready.
    void run(const protocol::worker::run_msg& msg);
    /// Asks the worker to stop `job` at its next piece; the worker stays busy until it answers.
    void cancel(std::uint64_t job);
    /// Asks the worker to exit (SIGKILL after a grace period); calls `done` once it is reaped.
    void shutdown(std::function<void()> done);

    worker_state state() const { return state_; }
    bool idle() const { return state_ == worker_state::ready; }
    pid_t pid() const { return pid_; }
    /// Worker failures so far (each one is followed by a restart).
    int restarts() const { return restarts_; }
    const std::string& last_crash_reason() const { return last_crash_reason_; }
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
    void do_read();
    void handle_line(std::string_view line);
    void send(const protocol::worker::to_worker& msg);
    void do_write();
    void kill_worker(const std::string& reason, protocol::error_code code);
    void wait_sigchld();
    void reap();
    void worker_exited(int status);
    void arm_progress();
    void schedule_ping();
    void on_ping_tick();

    boost::asio::io_context& io_;
    worker_launch launch_;
    watchdog_config cfg_;
    handlers h_;

    boost::asio::signal_set sigchld_;
    boost::asio::steady_timer start_timer_;
    boost::asio::steady_timer progress_timer_;
    boost::asio::steady_timer ping_timer_;
    boost::asio::steady_timer restart_timer_;
    boost::asio::steady_timer stop_timer_;
    std::unique_ptr<boost::asio::local::stream_protocol::socket> sock_;

    worker_state state_ = worker_state::stopped;
    pid_t pid_ = -1;
    std::uint64_t generation_ = 0; ///< bumped per spawn; stale async handlers compare it
    std::uint64_t job_ = 0;        ///< job the worker runs; 0 when none
    protocol::line_framer framer_;
    std::array<char, 16384> read_buf_{};
    std::deque<std::string> out_;
    std::string writing_;
    bool write_active_ = false;

    std::uint64_t ping_n_ = 0;
    bool ping_outstanding_ = false;
    clock::time_point ping_sent_;

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
