#pragma once
/// The HTTP dialects colibrid speaks, as pure translations: llama-server's /infill and
/// /completion, and OpenAI's /v1/completions. Request bodies become complete requests of
/// the socket protocol (validated by its codec); protocol events become response bodies
/// and Server-Sent Events. No I/O here.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "colibri/protocol/codec.hpp"
#include "colibri/protocol/messages.hpp"

namespace colibri::daemon {

enum class http_api { infill, completion, openai_completion };

/// A completion asked over HTTP.
struct http_completion {
    http_api api = http_api::completion;
    protocol::complete_request req; ///< always streamed to the front, which shapes the reply
    bool stream = false;            ///< the client's choice: SSE or one JSON body
    /// llama-server's t_max_predict_ms: once decoding has taken this long, the completion ends
    /// with the next piece that holds a newline (stop_type "limit"); 0: no limit.
    double max_predict_ms = 0;
    bool include_usage = false; ///< OpenAI stream_options.include_usage
    std::string model;          ///< OpenAI: echoed back
    /// llama-server's response_fields: the final reply holds only these paths ("timings/prompt_n"),
    /// each under its whole path as a key; empty: the whole reply.
    std::vector<std::string> response_fields;
};

/// Parses a request body. Unknown fields are ignored as llama-server and OpenAI servers
/// ignore them; fields that would change the output and are not supported (grammars,
/// logprobs, n > 1 ...) are refused. `max_tokens` is the daemon's limit, used when the
/// client asks for no limit (n_predict -1).
std::variant<http_completion, protocol::request_error> parse_http_completion(http_api api, std::string_view body,
                                                                             const protocol::request_limits& limits);

/// What a finished completion reports, gathered from its events.
struct http_outcome {
    std::string text;
    protocol::finish_reason reason = protocol::finish_reason::stop;
    bool time_limited = false; ///< ended by max_predict_ms
    protocol::usage usage;
    protocol::timings timings;
};

/// Identity of one reply, fixed when the request arrives.
struct http_reply {
    http_api api = http_api::completion;
    std::string model;                        ///< the model's name (OpenAI "model", llama-server "model")
    std::string id;                           ///< OpenAI "cmpl-..."
    std::int64_t created = 0;                 ///< Unix seconds
    nlohmann::json settings;                  ///< llama-server's "generation_settings"
    std::vector<std::string> response_fields; ///< http_completion's
};

/// llama-server's generation_settings for a request (llama.vim reads n_ctx from it).
nlohmann::json http_generation_settings(const protocol::complete_request& req, int n_ctx);

/// The whole reply of a non-streamed completion.
nlohmann::json http_final_body(const http_reply& r, const http_outcome& o);
/// One SSE event ("data: ...\n\n") for a piece of streamed text.
std::string http_piece_event(const http_reply& r, std::string_view text, int n_predicted);
/// The SSE events that end a streamed completion (OpenAI's end with "data: [DONE]").
std::string http_final_events(const http_reply& r, const http_outcome& o, bool include_usage);

/// HTTP status for a protocol error code.
unsigned http_status(protocol::error_code code);
/// An error body: {"error": {"code": status, "message": ..., "type": ...}}, the shape
/// llama-server and OpenAI servers share.
nlohmann::json http_error_body(unsigned status, std::string_view type, std::string_view message);
/// A server-sent event with a JSON payload.
std::string sse_event(const nlohmann::json& payload);

} // namespace colibri::daemon
