#pragma once
/// Owns the timers that tell a hung worker from a slow one: start-up to ready, liveness
/// probes (ping/pong) while it lives, and per-job progress. It only reports a hang; the
/// supervisor kills and restarts.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "colibri/protocol/errors.hpp"
#include "colibri/protocol/worker_messages.hpp"
#include "config.hpp"

namespace colibri::daemon {

class watchdog {
public:
    using clock = std::chrono::steady_clock;

    struct handlers {
        /// Sends a liveness probe to the worker.
        std::function<void(const protocol::worker::ping_msg& ping)> send_ping;
        /// The worker hangs; `code` is what its job ends with (timeout, or worker_crashed at start-up).
        std::function<void(const std::string& reason, protocol::error_code code)> on_hang;
    };

    watchdog(boost::asio::io_context& io, const watchdog_config& cfg, handlers h);
    watchdog(const watchdog&) = delete;
    watchdog& operator=(const watchdog&) = delete;

    /// A new worker was spawned: it must be ready within start_timeout_ms.
    void worker_started();
    /// It is ready: probes its liveness every ping_interval_ms from now on.
    void worker_ready();
    /// It answered probe `n`.
    void pong(std::uint64_t n);
    /// `job` started or showed progress: it must show more within progress_timeout_ms.
    void job_alive(std::uint64_t job);
    /// The job ended; no progress is expected.
    void job_ended();
    /// The worker was asked to exit: no more start-up or liveness checks (a job's progress still is).
    void worker_stopping();
    /// The worker is gone: every check ends.
    void worker_gone();

private:
    void schedule_ping();
    void on_ping_tick();

    watchdog_config cfg_;
    handlers h_;
    boost::asio::steady_timer start_timer_;
    boost::asio::steady_timer progress_timer_;
    boost::asio::steady_timer ping_timer_;

    std::uint64_t generation_ = 0; ///< bumped per worker; stale timer handlers compare it
    bool starting_ = false;        ///< between worker_started and worker_ready
    bool probing_ = false;         ///< liveness probes run
    std::uint64_t job_ = 0;        ///< the job whose progress is watched; 0 when none

    std::uint64_t ping_n_ = 0;
    bool ping_outstanding_ = false;
    clock::time_point ping_sent_;
};

} // namespace colibri::daemon
