#pragma once
/// Messages between colibrid (the supervisor) and its engine worker, over a socketpair.
/// Same framing as the client protocol (one JSON object per line, "t" names the type),
/// but private to the two processes: it may change with every release.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "colibri/protocol/errors.hpp"
#include "colibri/protocol/messages.hpp"

namespace colibri::protocol::worker {

/// Supervisor → worker: run one completion. `job` is the supervisor's sequence number.
struct run_msg {
    std::uint64_t job = 0;
    complete_request req; ///< id-less copy of the client's request; stream/timeout unused
    std::uint64_t seed = 0;
};
/// Supervisor → worker: stop job `job` at the next piece.
struct cancel_msg {
    std::uint64_t job = 0;
};
/// Supervisor → worker: liveness probe; answered by pong with the same n.
struct ping_msg {
    std::uint64_t n = 0;
};
/// Supervisor → worker: finish the current job and exit.
struct shutdown_msg {};

using to_worker = std::variant<run_msg, cancel_msg, ping_msg, shutdown_msg>;

/// Worker → supervisor: the model is loaded; `info` describes it (free-form object).
struct ready_msg {
    nlohmann::json info;
};
struct piece_msg {
    std::uint64_t job = 0;
    std::string text;
};
struct done_msg {
    std::uint64_t job = 0;
    finish_reason reason = finish_reason::stop;
    usage tokens;
    double prefill_ms = 0;
    double decode_ms = 0;
    nlohmann::json cache;     ///< the worker's KV-cache slot counters after the job (null: none)
    nlohmann::json upstreams; ///< a forwarding worker's upstreams after the job (null: none)
};
/// The job failed without killing the worker (bad argument, context full, ...).
struct error_msg {
    std::uint64_t job = 0;
    error_code code = error_code::internal;
    std::string message;
    nlohmann::json upstreams; ///< as in done_msg
};
struct pong_msg {
    std::uint64_t n = 0;
};
/// The job is alive but has no piece yet (sent while the prompt is processed).
struct progress_msg {
    std::uint64_t job = 0;
};
/// The worker cannot work at all (model failed to load); it exits after sending this.
struct fatal_msg {
    std::string message;
};

using from_worker = std::variant<ready_msg, piece_msg, done_msg, error_msg, pong_msg, fatal_msg, progress_msg>;

/// One line without '\n'.
std::string encode(const to_worker& msg);
std::string encode(const from_worker& msg);

/// Throw protocol_error (code internal) on a malformed line.
to_worker decode_to_worker(std::string_view line);
from_worker decode_from_worker(std::string_view line);

} // namespace colibri::protocol::worker
