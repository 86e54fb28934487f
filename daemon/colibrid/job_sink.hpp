#pragma once
/// Where a job's events go: a socket connection (NDJSON lines) or an HTTP exchange
/// (a JSON body or Server-Sent Events). The scheduler knows nothing else of its clients.

#include <string>

#include <nlohmann/json.hpp>

namespace colibri::daemon {

class job_sink {
public:
    virtual ~job_sink() = default;
    /// One event of a job (piece, done or error) in the socket protocol's shape.
    virtual void send(const nlohmann::json& event) = 0;
    /// The job with this key has ended; its final event, if any, was sent just before.
    virtual void forget(const std::string& key) = 0;
};

} // namespace colibri::daemon
