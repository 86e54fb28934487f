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
    steps_.clear();
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
    // the copy read on: each new token against the one drafted from its place in the source
    // (a number stepped from the source's: the step, for copies of it)
    for (; copy_ != 0 && len_ < len; ++len_, ++copy_) {
        misses_ = drafted(tokens, copy_) == tokens[len_] ? 0 : misses_ + 1;
        if (numbers_ == nullptr || tokens[copy_] == tokens[len_]) continue;
        if (const auto step = numbers_->step(tokens[copy_], tokens[len_])) steps_[len_] = *step;
    }
    if (misses_ >= max_misses) copy_ = 0;
    len_ = len;
    // the longest suffix seen before: what followed it (only positions indexed before this
    // call's last token, so never the suffix's own end); else the copy, if it holds (one
    // token repeats too often to outrank it)
    size_t from = 0;
    int matched = 0;
    for (int n = max_n; n >= min_n && from == 0; --n) {
        if (size_t(n) > len || (n == 1 && copy_ != 0)) continue;
        const auto& m = ends_[size_t(n - min_n)];
        const auto it = m.find(key(tokens.subspan(len - size_t(n), size_t(n))));
        if (it != m.end() && it->second < len) {
            from = it->second;
            matched = n;
        }
    }
    // a copy whose source ends in the same suffix (short of max_n tokens) stays: as long a
    // match as the latest one, and one that has come true
    int run = 0;
    if (copy_ != 0 && from != 0 && matched < max_n) {
        while (run < matched && size_t(run) < copy_ && tokens[len - 1 - size_t(run)] == tokens[copy_ - 1 - size_t(run)])
            ++run;
    }
    if (from == 0 || (matched < max_n && run == matched)) from = copy_;
    else misses_ = 0; // a new copy
    copy_ = from;
    if (from == 0 || k <= 0) return {};
    // a copy that reaches the end of the text goes on from its own start: a loop of a few
    // tokens drafts as far as a longer one
    std::vector<int32_t> out(static_cast<size_t>(k));
    for (size_t i = 0; i < out.size(); ++i) out[i] = from + i < len ? drafted(tokens, from + i) : out[from + i - len];
    return out;
}

int32_t ngram_drafter::drafted(std::span<const int32_t> tokens, size_t p) const {
    const auto it = steps_.find(p);
    if (it == steps_.end()) return tokens[p];
    const int32_t id = numbers_->stepped(tokens[p], it->second);
    return id >= 0 ? id : tokens[p];
}

void draft_policy::timed(int n, double ms) {
    if (n < 1 || n > max_k + 1 || !(ms > 0)) return;
    // a size not timed for a while: its time halfway back to the next smaller size's, so that
    // a time spoilt by a pause is tried again once drafts would pay at the lower cost (and
    // not at all while no drafts are kept)
    for (int m = 2; m <= max_k + 1; ++m) {
        if (m == n || ms_[size_t(m)] == 0 || ++since_[size_t(m)] < forget_after) continue;
        since_[size_t(m)] = 0;
        double ref = 0;
        for (int below = m - 1; below >= 1 && ref == 0; --below) ref = ms_[size_t(below)];
        // no lower than 5% over the smaller size: drafts that are never kept are never tried
        if (ref > 0) ms_[size_t(m)] = std::max(std::min(ms_[size_t(m)], (ms_[size_t(m)] + ref) / 2), ref * 1.05);
        guessed_[size_t(m)] = true;
    }
    since_[size_t(n)] = 0;
    // a lowered time was a guess: the next pass of that size says what it costs now
    double& t = ms_[size_t(n)];
    t = t == 0 || guessed_[size_t(n)] ? ms : 0.7 * t + 0.3 * ms;
    guessed_[size_t(n)] = false;
}

void draft_policy::judged(int drafted, int accepted) {
    if (drafted <= 0) return;
    // the tokens kept, then the first one refused (if any); the older passes fade
    kept_[copying_] = fade * kept_[copying_] + accepted;
    missed_[copying_] = fade * missed_[copying_] + (accepted < drafted ? 1 : 0);
    copying_ = accepted == drafted;
}

int draft_policy::length(int room) const {
    if (fixed_ >= 0) return std::max(0, std::min(room, fixed_));
    // sizes up to one past the largest timed one, and that one only while most drafts are
    // kept: a size not timed yet costs what the nearest smaller one does (a pass costs no
    // less for more tokens), so passes grow one token at a time while the drafts pay;
    // nothing timed yet: a plain step first
    const double p = acceptance();
    std::array<double, max_k + 2> t{};
    int sizes = 0;
    for (int n = 1; n <= max_k + 1; ++n) {
        t[size_t(n)] = ms_[size_t(n)] > 0 ? ms_[size_t(n)] : t[size_t(n - 1)];
        if (ms_[size_t(n)] > 0) sizes = p >= 0.5 ? n + 1 : n;
    }
    if (t[1] == 0) return 0;
    int best = 0;
    double best_rate = 0, expected = 0, reach = 1; // tokens a pass of k drafts yields: 1 + p + ... + p^k
    for (int k = 0; k <= std::min({room, max_k, sizes - 1}); ++k) {
        expected += reach;
        reach *= p;
        const double cost = t[size_t(k + 1)];
        if (expected / cost > best_rate * (k == 0 ? 1.0 : 1.02)) { // a longer draft by a margin over noise
            best_rate = expected / cost;
            best = k;
        }
    }
    return best;
}

} // namespace colibri
