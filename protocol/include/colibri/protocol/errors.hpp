#pragma once
/// Stable error codes of protocol v1. The names are part of the wire format: never rename.

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace colibri::protocol {

enum class error_code {
    invalid_json,         ///< the line is not valid JSON (or not UTF-8)
    invalid_request,      ///< not an object, or a field missing, mistyped, unknown or out of range
    unknown_op,           ///< "op" names no operation
    unsupported_protocol, ///< the client asked for a protocol version the server lacks
    too_large,            ///< the line exceeds the size limit (the connection is closed)
    busy,                 ///< the queue or a connection limit is full
    forbidden,            ///< the peer's credentials are not allowed
    worker_crashed,       ///< the engine worker died while running the request
    timeout,              ///< the worker made no progress for too long
    unavailable,          ///< no worker can serve (crash loop, shutting down)
    internal              ///< anything else; a bug
};

/// Wire name of a code ("invalid_json", ...).
std::string_view to_string(error_code code);

/// Inverse of to_string; nullopt for an unknown name.
std::optional<error_code> error_code_from_string(std::string_view name);

/// Thrown by decoders on malformed input; carries the code to report.
class protocol_error : public std::runtime_error {
public:
    protocol_error(error_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
    error_code code() const noexcept { return code_; }

private:
    error_code code_;
};

} // namespace colibri::protocol
