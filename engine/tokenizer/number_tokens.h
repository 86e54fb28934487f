#pragma once
// The tokens of a vocabulary that spell a number of one to three ASCII digits, by width and
// value: drafts step a number the way the text stepped it before (v3 after v2).

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace colibri {

/// "7", "42", "007": each token's number, and the token of each number of each width.
class number_tokens {
public:
    number_tokens() = default;
    /// From a vocabulary's lookup of a piece's id (-1: none).
    explicit number_tokens(const std::function<int32_t(std::string_view)>& id_of);
    /// The step from the number `from` spells to the one `to` spells, when both are numbers of
    /// the same width.
    std::optional<int> step(int32_t from, int32_t to) const;
    /// The token spelling id's number plus step in as many digits, or -1.
    int32_t stepped(int32_t id, int step) const;

private:
    static constexpr int offset[5] = {0, 0, 10, 110, 1110}; // by width: the first index of its values
    static int width(int index) { return index < offset[2] ? 1 : index < offset[3] ? 2 : 3; }
    std::unordered_map<int32_t, int> index_; // id -> offset[width] + value
    std::array<int32_t, offset[4]> id_{};    // index -> id (-1: not a token)
};

} // namespace colibri
