#pragma once
// Enum values and their names, both ways, from one table of {value, name} pairs per enum.

#include <optional>
#include <string_view>
#include <utility>

namespace colibri {

template <class E>
using enum_name_pair = std::pair<E, std::string_view>;

/// The name of `value` in `table`, or `otherwise` when the table lacks it.
template <class Table, class E>
constexpr std::string_view enum_name(const Table& table, E value, std::string_view otherwise) {
    for (const auto& [v, name] : table) {
        if (v == value) return name;
    }
    return otherwise;
}

/// The value named `name` in `table`, if any.
template <class Table>
constexpr auto enum_value(const Table& table, std::string_view name)
    -> std::optional<typename Table::value_type::first_type> {
    for (const auto& [v, n] : table) {
        if (n == name) return v;
    }
    return std::nullopt;
}

} // namespace colibri
