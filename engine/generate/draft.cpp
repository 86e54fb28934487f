#include "generate/draft.h"

#include <algorithm>

namespace colibri {

uint64_t ngram_drafter::key(std::span<const int32_t> gram) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (const int32_t t : gram) h = (h ^ uint32_t(t)) * 0x100000001B3ull + (h >> 29);
    return h;
}

void ngram_drafter::reset() {
    for (auto& m : ends_) m.clear();
    indexed_ = 0;
    copy_ = len_ = 0;
    misses_ = 0;
}

std::vector<int32_t> ngram_drafter::draft(std::span<const int32_t> tokens, int k) {
    if (tokens.size() < indexed_) reset(); // a different text
    const size_t len = tokens.size();
    // index the n-grams that end before the last position: the suffix itself is not an
    // earlier occurrence of itself
    for (; indexed_ < len; ++indexed_) {
        for (int n = min_n; n <= max_n && size_t(n) <= indexed_; ++n) {
            ends_[size_t(n - min_n)][key(tokens.subspan(indexed_ - size_t(n), size_t(n)))] = uint32_t(indexed_);
        }
    }
    // the copy read on: each new token against the one at its place in the source
    for (; copy_ != 0 && len_ < len; ++len_, ++copy_) misses_ = tokens[copy_] == tokens[len_] ? 0 : misses_ + 1;
    if (misses_ >= max_misses) copy_ = 0;
    len_ = len;
    // the longest suffix seen before: what followed it (only positions indexed before this
    // call's last token, so never the suffix's own end); else the copy, if it holds
    size_t from = 0;
    for (int n = max_n; n >= min_n && from == 0; --n) {
        if (size_t(n) > len) continue;
        const auto& m = ends_[size_t(n - min_n)];
        const auto it = m.find(key(tokens.subspan(len - size_t(n), size_t(n))));
        if (it != m.end() && it->second < len) {
            from = it->second;
            misses_ = 0;
        }
    }
    if (from == 0) from = copy_;
    if (from == 0 || k <= 0) return {};
    copy_ = from;
    const size_t to = std::min(len, from + size_t(k));
    return {tokens.begin() + std::ptrdiff_t(from), tokens.begin() + std::ptrdiff_t(to)};
}

} // namespace colibri
