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
    float repeat_penalty = 1.0f; ///< 1: off; llama.cpp style (divide positive logits)
    int repeat_last_n = 64;   ///< how many recent tokens the penalty looks at
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

class sampler {
public:
    explicit sampler(int n_vocab);
    /// Validates and sets the parameters and reseeds; throws colibri::error on a bad value.
    void set_params(const sampling_params& p);
    /// Picks the next token from logits [n_vocab]; `recent` are the latest tokens (the
    /// penalty looks at the last repeat_last_n of them).
    int32_t sample(const float* logits, std::span<const int32_t> recent);

private:
    int n_vocab_;
    sampling_params p_;
    xorshift64s rng_;
    std::vector<float> work_;   // [n_vocab] adjusted logits
    std::vector<int32_t> idx_;  // [n_vocab] candidate ids
    std::vector<float> prob_;   // [n_vocab] candidate probabilities
};

} // namespace colibri
