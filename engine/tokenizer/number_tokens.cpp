#include "tokenizer/number_tokens.h"

namespace colibri {

number_tokens::number_tokens(const std::function<int32_t(std::string_view)>& id_of) {
    id_.fill(-1);
    char digits[4];
    for (int width = 1; width <= 3; ++width) {
        for (int value = 0, end = width == 1 ? 10 : width == 2 ? 100 : 1000; value < end; ++value) {
            for (int i = width - 1, v = value; i >= 0; --i, v /= 10) digits[i] = char('0' + v % 10);
            const int32_t id = id_of(std::string_view(digits, size_t(width)));
            if (id < 0) continue;
            id_[size_t(offset[width] + value)] = id;
            index_.emplace(id, offset[width] + value);
        }
    }
}

std::optional<int> number_tokens::step(int32_t from, int32_t to) const {
    const auto a = index_.find(from), b = index_.find(to);
    if (a == index_.end() || b == index_.end()) return std::nullopt;
    if (width(a->second) != width(b->second)) return std::nullopt;
    return b->second - a->second;
}

int32_t number_tokens::stepped(int32_t id, int step) const {
    const auto it = index_.find(id);
    if (it == index_.end()) return -1;
    const int index = it->second, w = width(index);
    return index + step >= offset[w] && index + step < offset[w + 1] ? id_[size_t(index + step)] : -1;
}

} // namespace colibri
