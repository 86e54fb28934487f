#pragma once
// Token sampling: repetition penalty, then (as Hugging Face) temperature, top-k, top-p,
// min-p, and a draw from a seeded xorshift64* generator. Greedy when temperature is 0.
// No allocation per token: buffers are sized for the vocabulary at construction.

#include <cstdint>
#include <span>
#include <vector>

namespace colibri {

struct sampling_params {
    float temperature = 0.8f; ///< 0: greedy (arg-max)
    int top_k = 40;           ///< 0: off
    float top_p = 0.95f;      ///< 1: off
    float min_p = 0.05f;      ///< 0: off; drops tokens below min_p * p(most likely)
    float repeat_penalty =
        1.0f; ///< 1: off; as llama.cpp and Hugging Face: each recent token once, positive logits divided, negative multiplied
    int repeat_last_n = 64; ///< how many recent tokens the penalty looks at
    uint64_t seed = 0;
};

/// xorshift64* with a splitmix64-scrambled seed (any seed, zero included, works).
class xorshift64s {
public:
    explicit xorshift64s(uint64_t seed = 0) { reseed(seed); }
    void reseed(uint64_t seed);
    uint64_t next();
    /// Uniform in [0, 1).
    float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

private:
    uint64_t state_ = 1;
};

/// The first position of the largest of n >= 1 values (NaNs are never the largest; all
/// NaN: 0).
int32_t argmax(const float* v, int n);

/// keys[0, n) in increasing order, given in increasing order of their low 32 bits: the
/// result is std::sort's (the sampler's candidates: the logit's order above the id).
/// `spare` holds n keys.
void sort_by_high_half(uint64_t* keys, uint64_t* spare, int n);

class sampler {
public:
    explicit sampler(int n_vocab);
    /// Validates and sets the parameters and reseeds; throws colibri::error on a bad value.
    void set_params(const sampling_params& p);
    /// Picks the next token from logits [n_vocab]; `recent` are the latest tokens (the
    /// penalty looks at the last repeat_last_n of them).
    int32_t sample(const float* logits, std::span<const int32_t> recent);

private:
    int top_k_candidates(const float* logits, int k);
    int all_candidates(const float* logits);
    int32_t draw_any();

    int n_vocab_;
    sampling_params p_;
    xorshift64s rng_;
    std::vector<float> work_;        // [n_vocab] adjusted logits
    std::vector<int32_t> penalised_; // the recent tokens, each once
    std::vector<int32_t> idx_;       // [n_vocab] candidate ids
    std::vector<float> prob_;        // [n_vocab] candidate probabilities
    std::vector<float> weight_;      // [n_vocab] without top-k: every token's exp((logit - max) / T)
    double sum_ = 0;                 // and their sum
    std::vector<uint64_t> keys_;     // [n_vocab] the candidates to sort
    std::vector<uint64_t> spare_;    // [n_vocab] the radix sort's other half
};

} // namespace colibri
