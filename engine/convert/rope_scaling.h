#pragma once
// Scaled RoPE (linear, llama3, YaRN) as checkpoints state it, turned into what the runtime
// reads: per-pair frequency divisors (the rope_freqs tensor) and YaRN's attention factor.

#include <optional>
#include <vector>

namespace colibri {

struct rope_scaling {
    enum class kind { none, linear, llama3, yarn };
    kind type = kind::none;
    double factor = 1.0;
    double original_ctx = 0.0;     ///< llama3, yarn: original_max_position_embeddings
    double low_freq_factor = 1.0;  ///< llama3
    double high_freq_factor = 4.0; ///< llama3
    double beta_fast = 32.0;       ///< yarn: the ramp's bounds, in rotations
    double beta_slow = 1.0;
    bool truncate = true;                   ///< yarn: the ramp's bounds rounded outwards to whole pairs
    std::optional<double> attention_factor; ///< yarn; by default from factor, mscale, mscale_all_dim
    double mscale = 0.0, mscale_all_dim = 0.0;
};

/// Divisors of pair i's frequency theta^(-2i/head_dim), i < head_dim / 2, as Hugging Face
/// transformers computes the scaled frequencies; empty for kind::none.
std::vector<float> rope_freq_factors(const rope_scaling& s, double theta, int head_dim);
/// The factor RoPE's cos and sin are multiplied by: YaRN's attention factor, else 1.
float rope_attn_factor(const rope_scaling& s);

} // namespace colibri
