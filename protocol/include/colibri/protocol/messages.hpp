#pragma once
/// Protocol v1 message types: what a client may ask and what the daemon answers.
/// docs/protocol.md is the normative description; field names live in codec.cpp only.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace colibri::protocol {

/// The protocol version this library speaks.
inline constexpr int protocol_version = 1;

/// Why a completion ended (the "finish_reason" of a done event).
enum class finish_reason { stop, length, cancelled, timeout, error };

std::string_view to_string(finish_reason reason);
std::optional<finish_reason> finish_reason_from_string(std::string_view name);

/// Test-only fault injection, honoured only when the daemon runs with it enabled.
enum class fault_kind {
    none,
    crash,       ///< SIGSEGV after `after_tokens` pieces
    abort,       ///< SIGABRT
    kill,        ///< SIGKILL to itself
    exit,        ///< _exit(3)
    hang,        ///< stop making progress (sleep forever) but keep answering pings
    slow,        ///< sleep `delay_ms` before every piece
    device_error ///< the engine's device fails (as on a CUDA error): the worker reports it and restarts
};

std::string_view to_string(fault_kind kind);
std::optional<fault_kind> fault_kind_from_string(std::string_view name);

struct fault_spec {
    fault_kind kind = fault_kind::none;
    int after_tokens = 0; ///< pieces emitted before the fault triggers
    int delay_ms = 0;     ///< for `slow`: delay before each piece
    bool operator==(const fault_spec&) const = default;
};

/// op "hello": the version handshake.
struct hello_request {
    int protocol = protocol_version; ///< the version the client speaks
    std::string client;              ///< free-form client name, for logs
    bool operator==(const hello_request&) const = default;
};

/// Another file's text given as context for a completion.
struct context_file {
    std::string filename; ///< "" when none
    std::string text;
    bool operator==(const context_file&) const = default;
};

/// op "complete": generate a continuation of `prompt`.
struct complete_request {
    std::string prompt;
    std::string suffix; ///< fill-in-the-middle: text after the cursor ("" when none)
    /// An editor buffer or client; a newer request in the same session cancels this one.
    std::string session;
    int max_tokens = 128;        ///< 0: only process the prompt into the cache (warm-up)
    int max_lines = 0;           ///< end before line max_lines + 1; 0: no limit
    bool stop_on_dedent = false; ///< end before a line indented less than the cursor's line
    int min_indent = 0;          ///< end before a line indented by fewer characters; 0: no limit
    /// Other files' text placed before the prompt (the end that fits the context is kept).
    std::vector<context_file> context;
    bool speculative = true; ///< drafts from the context (the same tokens, fewer steps)
    float temperature = 0.8f;
    float top_p = 0.95f;
    int top_k = 40;
    float min_p = 0.05f;
    float repeat_penalty = 1.0f;       ///< 1: off
    std::optional<std::uint64_t> seed; ///< the daemon picks (and reports) one when absent
    std::vector<std::string> stop;
    bool stream = true;
    std::optional<std::int64_t> timeout_ms; ///< the daemon's default when absent
    fault_spec fault;                       ///< "debug_fault"; kind none unless enabled
    bool operator==(const complete_request&) const = default;
};

/// op "cancel": stop the request with id `target` on the same connection.
struct cancel_request {
    nlohmann::json target;
    bool operator==(const cancel_request&) const = default;
};

struct health_request {
    bool operator==(const health_request&) const = default;
};
struct status_request {
    bool operator==(const status_request&) const = default;
};

using request_body = std::variant<hello_request, complete_request, cancel_request, health_request, status_request>;

/// One parsed request line. `id` is a string or an integer, echoed as given.
struct request {
    nlohmann::json id;
    request_body body;
    bool operator==(const request&) const = default;
};

/// Limits applied while validating a request.
struct request_limits {
    std::size_t max_id_bytes = 256;
    std::size_t max_session_bytes = 256;
    int max_tokens = 4096;
    std::size_t max_stop = 16;
    std::size_t max_stop_bytes = 256;
    std::size_t max_context_files = 256;
    bool allow_fault_injection = false;
};

/// Token counts of one completion.
struct usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;
    int drafted_tokens = 0;  ///< drafted from the context and verified
    int accepted_tokens = 0; ///< of those, kept
    bool operator==(const usage&) const = default;
};

/// Milliseconds spent in each phase of one completion.
struct timings {
    double queued_ms = 0;
    double prefill_ms = 0;
    double decode_ms = 0;
    double ttft_ms = 0; ///< from acceptance to the first piece (0 when none)
};

/// The final line of a completion that was not an error.
struct done_event {
    finish_reason reason = finish_reason::stop;
    protocol::usage usage;
    protocol::timings timings;
    std::uint64_t seed = 0;
    std::optional<std::string> text; ///< the whole completion, for stream:false
};

} // namespace colibri::protocol
