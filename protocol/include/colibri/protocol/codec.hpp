#pragma once
/// JSON encoding and validating decoding of protocol v1 lines.

#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "colibri/protocol/errors.hpp"
#include "colibri/protocol/messages.hpp"

namespace colibri::protocol {

/// Why a line was rejected. `id` is the request's id when it could be read, else null.
struct request_error {
    nlohmann::json id;
    error_code code;
    std::string message;
};

/// Parses and validates one request line (without its '\n'). Never throws on bad input.
std::variant<request, request_error> parse_request(std::string_view line, const request_limits& limits = {});

/// Client side: the JSON object of a request (inverse of parse_request).
nlohmann::json to_json(const request& req);

/// Serialises without throwing: invalid UTF-8 is replaced by U+FFFD.
std::string dump_line(const nlohmann::json& j);

// Server events. Each returns the JSON object; frame(dump_line(...)) puts it on the wire.

nlohmann::json make_hello_event(const nlohmann::json& id, std::string_view server_version);
nlohmann::json make_piece_event(const nlohmann::json& id, std::string_view text);
nlohmann::json make_done_event(const nlohmann::json& id, const done_event& done);
/// An error; `reason` is set for a completion that was accepted and then failed.
nlohmann::json make_error_event(const nlohmann::json& id, error_code code, std::string_view message,
                                std::optional<finish_reason> reason = std::nullopt);
nlohmann::json make_cancel_event(const nlohmann::json& id, const nlohmann::json& target, bool found);

/// Names of the event types ("event" field).
namespace event {
inline constexpr std::string_view hello = "hello";
inline constexpr std::string_view piece = "piece";
inline constexpr std::string_view done = "done";
inline constexpr std::string_view error = "error";
inline constexpr std::string_view cancel = "cancel";
inline constexpr std::string_view health = "health";
inline constexpr std::string_view status = "status";
} // namespace event

/// Client side: reads a done event back (throws protocol_error when malformed).
done_event parse_done_event(const nlohmann::json& j);

} // namespace colibri::protocol
