#include "sampling/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
      prob_(static_cast<size_t>(n_vocab)), weight_(static_cast<size_t>(n_vocab)), keys_(static_cast<size_t>(n_vocab)),
      spare_(static_cast<size_t>(n_vocab)) {}

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
    penalised_.reserve(static_cast<size_t>(std::min(p.repeat_last_n, 1 << 16))); // not per token
}

namespace {

// The largest of n values, NaNs passed over (-inf when there is none): vectors of
// independent lanes. std::max_element's running position makes every step wait on the
// last (3.5 ns a value here; this 0.1).
float max_of(const float* v, int n) {
    int i = 0;
    float m = -std::numeric_limits<float>::infinity();
#if defined(__SSE2__)
    __m128 a = _mm_set1_ps(m), b = a, c = a, d = a;
    for (; i + 16 <= n; i += 16) { // maxps gives its second operand when either is NaN
        a = _mm_max_ps(_mm_loadu_ps(v + i), a);
        b = _mm_max_ps(_mm_loadu_ps(v + i + 4), b);
        c = _mm_max_ps(_mm_loadu_ps(v + i + 8), c);
        d = _mm_max_ps(_mm_loadu_ps(v + i + 12), d);
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d)));
    for (float x : lanes) m = x > m ? x : m;
#endif
    for (; i < n; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

} // namespace

int32_t argmax(const float* v, int n) {
    // the largest by chunks, then its first position in the first chunk that holds it
    constexpr int chunk = 1024;
    float best = -std::numeric_limits<float>::infinity();
    int at = 0;
    for (int c = 0; c < n; c += chunk) {
        const float m = max_of(v + c, std::min(chunk, n - c));
        if (m > best) {
            best = m;
            at = c;
        }
    }
    for (int i = at; i < n; ++i) {
        if (v[i] == best) return i;
    }
    return 0; // every value NaN
}

int32_t sampler::sample(const float* logits, std::span<const int32_t> recent) {
    const float* l = logits;
    // repetition penalty over the recent window, on a copy
    if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0) {
        std::copy_n(logits, n_vocab_, work_.data());
        const size_t n = std::min(recent.size(), static_cast<size_t>(p_.repeat_last_n));
        penalised_.assign(recent.end() - static_cast<std::ptrdiff_t>(n), recent.end());
        std::sort(penalised_.begin(), penalised_.end()); // each token once, however often it came
        penalised_.erase(std::unique(penalised_.begin(), penalised_.end()), penalised_.end());
        for (int32_t id : penalised_) {
            if (id < 0 || id >= n_vocab_) continue;
            float& v = work_[id];
            v = v > 0 ? v / p_.repeat_penalty : v * p_.repeat_penalty;
        }
        l = work_.data();
    }

    if (p_.temperature <= 0.0f) return argmax(l, n_vocab_); // greedy: the first maximum

    // candidates in order of logit, then of id, with their probabilities (softmax with
    // temperature over the top-k, or over every token)
    int n = p_.top_k > 0 && p_.top_k < n_vocab_ ? top_k_candidates(l, p_.top_k) : all_candidates(l);
    if (n == 0) return draw_any(); // neither top-p nor min-p cuts: drawn from every token in id order

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

// The k best tokens into idx_ (best first) and their softmax among themselves into prob_:
// one pass keeping a heap of the k best so far. A token displaces the worst kept only if
// its logit is higher: at an equal logit its later id ranks it lower.
int sampler::top_k_candidates(const float* l, int k) {
    auto better = [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    int32_t* h = idx_.data();
    std::iota(h, h + k, 0);
    std::make_heap(h, h + k, better); // the worst kept first
    float worst = l[h[0]];
    constexpr int block = 64; // most blocks hold no better token: a few vector maxima
    for (int i = k; i < n_vocab_; i += block) {
        const int end = std::min(n_vocab_, i + block);
        if (!(max_of(l + i, end - i) > worst)) continue;
        for (int j = i; j < end; ++j) {
            if (!(l[j] > worst)) continue;
            std::pop_heap(h, h + k, better);
            h[k - 1] = j;
            std::push_heap(h, h + k, better);
            worst = l[h[0]];
        }
    }
    std::sort_heap(h, h + k, better);
    const float max = l[h[0]];
    float sum = 0.0f;
    for (int c = 0; c < k; ++c) {
        prob_[c] = std::exp((l[h[c]] - max) / p_.temperature);
        sum += prob_[c];
    }
    for (int c = 0; c < k; ++c) prob_[c] /= sum;
    return k;
}

// A stable radix sort of the high 32 bits, a byte at a time from the lowest: ties stay in
// the order they came in. A byte that every key shares is skipped (a flat distribution's
// logits share their top bits).
void sort_by_high_half(uint64_t* keys, uint64_t* spare, int n) {
    uint64_t* from = keys;
    uint64_t* to = spare;
    for (int shift = 32; shift < 64; shift += 8) {
        int count[257] = {};
        for (int i = 0; i < n; ++i) ++count[((from[i] >> shift) & 0xFF) + 1];
        if (*std::max_element(count + 1, count + 257) == n) continue;
        for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
        for (int i = 0; i < n; ++i) to[count[(from[i] >> shift) & 0xFF]++] = from[i];
        std::swap(from, to);
    }
    if (from != keys) std::copy(from, from + n, keys);
}

// Every token a candidate (no top-k): each token's weight exp((logit - max) / T) into
// weight_, their sum, and then only the tokens that top-p or min-p could keep go into
// idx_ and prob_ (sorted, normalised by the sum over every token). Returns 0 when neither
// cuts anything (weight_ and sum_ are then the distribution to draw from).
int sampler::all_candidates(const float* l) {
    const float max = l[argmax(l, n_vocab_)];
    // weights by binary exponent (bucket b: [2^-b, 2^(1-b)); the best weighs 1): the top-p
    // prefix ends in the bucket where their mass, from the top, first reaches top_p
    constexpr int buckets = 128;
    double mass[buckets] = {};
    double sum = 0;
    for (int i = 0; i < n_vocab_; ++i) {
        const float w = std::exp((l[i] - max) / p_.temperature);
        weight_[i] = w;
        sum += w;
        mass[std::clamp(127 - int(std::bit_cast<uint32_t>(w) >> 23), 0, buckets - 1)] += w; // w in [0, 1], or NaN
    }
    sum_ = sum;
    // The cuts below are made on float sums of the sorted candidates, which may run a
    // little past the exact ones: a bucket lower for top-p, half the weight for min-p.
    float floor = p_.min_p / 2; // min-p keeps weights of at least min_p
    if (p_.top_p < 1.0f) {
        double cum = 0;
        int b = 0;
        while (b < buckets - 1 && (cum += mass[b]) < p_.top_p * sum) ++b;
        floor = std::max(floor, std::ldexp(1.0f, -b - 1));
    }
    if (floor <= 0.0f) return 0;
    // sorted as one 64-bit key each, the logit's bits ordered downwards above the id: a third
    // of the time of a comparison through the logits (a flat distribution keeps most tokens)
    int n = 0;
    for (int i = 0; i < n_vocab_; ++i) {
        if (!(weight_[i] >= floor)) continue;
        const uint32_t b = l[i] == 0.0f ? 0u : std::bit_cast<uint32_t>(l[i]); // -0 ranks as +0
        const uint32_t up = b & 0x80000000u ? ~b : b | 0x80000000u;           // the floats' order as integers
        keys_[n++] = uint64_t(~up) << 32 | uint32_t(i);
    }
    // (made in id order: a radix sort keeps that order among equal logits; a comparison
    // sort is faster for a few hundred)
    if (n > 512) sort_by_high_half(keys_.data(), spare_.data(), n);
    else std::sort(keys_.begin(), keys_.begin() + n);
    const float inv = static_cast<float>(1.0 / sum);
    for (int c = 0; c < n; ++c) {
        idx_[c] = static_cast<int32_t>(keys_[c] & 0xFFFFFFFFu);
        prob_[c] = weight_[idx_[c]] * inv;
    }
    return n;
}

// A draw from every token by weight, in id order.
int32_t sampler::draw_any() {
    double r = rng_.uniform() * sum_;
    for (int i = 0; i < n_vocab_; ++i) {
        r -= weight_[i];
        if (r < 0) return i;
    }
    return n_vocab_ - 1;
}

} // namespace colibri
