#pragma once
/// The queue between connections and the single worker: fair round-robin across
/// connections, a bounded length, per-request deadlines, cancellation, and the turning
/// of worker results into client events. Every accepted job ends with exactly one
/// final event (done or error) unless its client has gone.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>

#include "colibri/protocol/codec.hpp"
#include "colibri/protocol/worker_messages.hpp"
#include "config.hpp"
#include "job.hpp"
#include "job_runner.hpp"
#include "supervisor.hpp"

namespace colibri::daemon {

/// Running totals for the status op.
struct scheduler_stats {
    std::uint64_t served = 0;     ///< ended with done (stop or length)
    std::uint64_t cancelled = 0;  ///< by the client, a newer request in its session, or shutdown
    std::uint64_t superseded = 0; ///< of those: by a newer request in the same session
    std::uint64_t timed_out = 0;
    std::uint64_t failed = 0;   ///< ended with an error event
    std::uint64_t rejected = 0; ///< busy / unavailable at submission
    std::uint64_t tokens_generated = 0;
    std::uint64_t tokens_drafted = 0, tokens_accepted = 0; ///< speculative decoding's drafts, and those kept
    double decode_ms = 0;                                  ///< sum over served requests
};

class scheduler {
public:
    explicit scheduler(const daemon_config& cfg);

    /// Must be called before anything else; the runner (the supervisor) reports back
    /// through the handlers.
    void attach(job_runner& runner) { runner_ = &runner; }
    supervisor::handlers make_handlers();

    /// Queues a job; on rejection returns the error (busy, unavailable) and keeps nothing.
    std::optional<protocol::request_error> submit(const std::shared_ptr<job>& j);

    /// Explicit cancel: the job ends with done/cancelled. `notify` false: the client has
    /// gone, end it silently.
    void cancel(const std::shared_ptr<job>& j, bool notify);

    /// The client has what it asked for (an HTTP time limit): the job ends now with
    /// finish_reason length, counted as served.
    void end_early(const std::shared_ptr<job>& j);

    /// Shutdown: refuse new work (unavailable).
    void stop_accepting() { accepting_ = false; }
    /// Shutdown after the grace period: every remaining job ends cancelled.
    void cancel_all();

    std::size_t queue_depth() const { return queued_; }
    std::size_t in_flight() const { return queued_ + (running_ ? 1 : 0); }
    const scheduler_stats& stats() const { return stats_; }

    /// Called whenever the last job finishes (used by shutdown).
    std::function<void()> on_drained;

private:
    void pump();
    void finish(const std::shared_ptr<job>& j, const nlohmann::json& final_event);
    void remove_from_queue(const std::shared_ptr<job>& j);
    void on_deadline(const std::shared_ptr<job>& j);
    nlohmann::json done_event_for(const job& j, protocol::finish_reason reason,
                                  const protocol::worker::done_msg* result) const;

    // Handlers from the supervisor.
    void on_piece(std::uint64_t seq, std::string_view text);
    void on_done(const protocol::worker::done_msg& msg);
    void on_error(const protocol::worker::error_msg& msg);
    void on_job_lost(std::uint64_t seq, protocol::error_code code, const std::string& reason);
    void on_unavailable(const std::string& reason);

    const daemon_config& cfg_;
    job_runner* runner_ = nullptr;
    bool accepting_ = true;

    // Fairness: one FIFO per connection, served round-robin.
    std::unordered_map<const void*, std::deque<std::shared_ptr<job>>> queues_;
    std::deque<const void*> order_;
    std::size_t queued_ = 0;
    std::shared_ptr<job> running_; ///< the job the worker runs, until it finishes for its client
    /// The newest request of each named session; a newer one cancels it.
    std::unordered_map<std::string, std::weak_ptr<job>> sessions_;
    std::uint64_t next_seq_ = 1;
    std::mt19937_64 seed_rng_;
    scheduler_stats stats_;
};

} // namespace colibri::daemon
