#include "colibri/protocol/errors.hpp"

#include <array>
#include <utility>

namespace colibri::protocol {
namespace {

constexpr std::array<std::pair<error_code, std::string_view>, 11> k_error_names{{
    {error_code::invalid_json, "invalid_json"},
    {error_code::invalid_request, "invalid_request"},
    {error_code::unknown_op, "unknown_op"},
    {error_code::unsupported_protocol, "unsupported_protocol"},
    {error_code::too_large, "too_large"},
    {error_code::busy, "busy"},
    {error_code::forbidden, "forbidden"},
    {error_code::worker_crashed, "worker_crashed"},
    {error_code::timeout, "timeout"},
    {error_code::unavailable, "unavailable"},
    {error_code::internal, "internal"},
}};

} // namespace

std::string_view to_string(error_code code) {
    for (const auto& [c, name] : k_error_names)
        if (c == code) return name;
    return "internal";
}

std::optional<error_code> error_code_from_string(std::string_view name) {
    for (const auto& [c, n] : k_error_names)
        if (n == name) return c;
    return std::nullopt;
}

} // namespace colibri::protocol
