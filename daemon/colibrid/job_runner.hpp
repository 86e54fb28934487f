#pragma once
/// Where the scheduler's jobs go: the worker's supervisor, or a fake in tests. It runs one
/// job at a time; results come back through the scheduler's supervisor::handlers.

#include <cstdint>
#include <string>

#include "colibri/protocol/worker_messages.hpp"

namespace colibri::daemon {

class job_runner {
public:
    virtual ~job_runner() = default;
    /// A job may be run now.
    virtual bool idle() const = 0;
    /// The worker keeps failing: new work is refused for a while.
    virtual bool unavailable() const = 0;
    /// Why the worker last failed ("" if it never did).
    virtual const std::string& last_crash_reason() const = 0;
    /// Runs a job. Precondition: idle().
    virtual void run(const protocol::worker::run_msg& msg) = 0;
    /// Asks the worker to stop `job` at its next piece.
    virtual void cancel(std::uint64_t job) = 0;
};

} // namespace colibri::daemon
