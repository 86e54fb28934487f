#pragma once
// Numbers of decoded messages, checked: a float or an out-of-range integer converted to
// an integer type is undefined behaviour, so a field that is not a whole number in range
// is a protocol_error naming it.

#include "colibri/protocol/errors.hpp"

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace colibri::protocol {

/// j[key] (which must exist) as a whole number in [0, max].
inline std::uint64_t whole_number(const nlohmann::json& j, const char* key,
                                  std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
    const nlohmann::json& v = j.at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
        throw protocol_error(error_code::internal, std::string("'") + key + "' is not a non-negative integer");
    }
    const std::uint64_t x = v.get<std::uint64_t>();
    if (x > max) throw protocol_error(error_code::internal, std::string("'") + key + "' is out of range");
    return x;
}

/// A token count: j[key] in [0, INT32_MAX]; `fallback` when absent, if given.
inline int token_count(const nlohmann::json& j, const char* key, int fallback = -1) {
    if (fallback >= 0 && !j.contains(key)) return fallback;
    return static_cast<int>(whole_number(j, key, std::numeric_limits<std::int32_t>::max()));
}

} // namespace colibri::protocol
