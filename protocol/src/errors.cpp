#include "colibri/protocol/errors.hpp"

#include "colibri/enum_names.hpp"

#include <array>

namespace colibri::protocol {
namespace {

constexpr std::array<enum_name_pair<error_code>, 11> k_error_names{{
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

std::string_view to_string(error_code code) { return enum_name(k_error_names, code, "internal"); }

std::optional<error_code> error_code_from_string(std::string_view name) { return enum_value(k_error_names, name); }

} // namespace colibri::protocol
