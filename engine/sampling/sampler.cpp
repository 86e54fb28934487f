#include "sampling/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace colibri {

void xorshift64s::reseed(uint64_t seed) {
    // splitmix64 step: spreads any seed (0 included) into a non-zero state
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    state_ = z != 0 ? z : 0x2545F4914F6CDD1Dull;
}

uint64_t xorshift64s::next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
}

sampler::sampler(int n_vocab)
    : n_vocab_(n_vocab), work_(static_cast<size_t>(n_vocab)), idx_(static_cast<size_t>(n_vocab)),
      prob_(static_cast<size_t>(n_vocab)) {}

void sampler::set_params(const sampling_params& p) {
    auto bad = [](const char* what) { throw error(errc::invalid_argument, what); };
    if (!std::isfinite(p.temperature) || p.temperature < 0) bad("temperature must be a number >= 0");
    if (p.top_k < 0) bad("top_k must be >= 0");
    if (!(p.top_p > 0 && p.top_p <= 1)) bad("top_p must be in (0, 1]");
    if (!(p.min_p >= 0 && p.min_p <= 1)) bad("min_p must be in [0, 1]");
    if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0) bad("repeat_penalty must be > 0");
    if (p.repeat_last_n < 0) bad("repeat_last_n must be >= 0");
    p_ = p;
    rng_.reseed(p.seed);
}

int32_t sampler::sample(const float* logits, std::span<const int32_t> recent) {
    std::copy_n(logits, n_vocab_, work_.data());

    // repetition penalty over the recent window
    if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0) {
        const size_t n = std::min(recent.size(), static_cast<size_t>(p_.repeat_last_n));
        for (int32_t id : recent.subspan(recent.size() - n)) {
            if (id < 0 || id >= n_vocab_) continue;
            float& l = work_[id];
            l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
        }
    }

    // greedy: first index of the maximum
    if (p_.temperature <= 0.0f) {
        return static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
    }

    // candidates sorted by logit, cut to top-k
    std::iota(idx_.begin(), idx_.end(), 0);
    int n = n_vocab_;
    auto by_logit = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
    if (p_.top_k > 0 && p_.top_k < n) {
        std::partial_sort(idx_.begin(), idx_.begin() + p_.top_k, idx_.end(), by_logit);
        n = p_.top_k;
    } else {
        std::sort(idx_.begin(), idx_.end(), by_logit);
    }

    // softmax with temperature
    const float max = work_[idx_[0]];
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        prob_[i] = std::exp((work_[idx_[i]] - max) / p_.temperature);
        sum += prob_[i];
    }
    for (int i = 0; i < n; ++i) prob_[i] /= sum;

    // top-p: the smallest prefix whose mass reaches top_p
    if (p_.top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < n; ++i) {
            cum += prob_[i];
            if (cum >= p_.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    // min-p: drop what is far less likely than the best
    if (p_.min_p > 0.0f) {
        const float floor = p_.min_p * prob_[0];
        int keep = 1;
        while (keep < n && prob_[keep] >= floor) ++keep;
        n = keep;
    }

    // draw
    float total = 0.0f;
    for (int i = 0; i < n; ++i) total += prob_[i];
    float r = rng_.uniform() * total;
    for (int i = 0; i < n; ++i) {
        r -= prob_[i];
        if (r < 0.0f) return idx_[i];
    }
    return idx_[n - 1];
}

} // namespace colibri
