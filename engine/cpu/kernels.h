#pragma once
// The maths of each operation in plain C++, one row at a time: what the kernel tables and
// the CUDA kernels are tested against, and the CPU backend's kernels where no table has
// one. All accumulate in f32 unless noted.

#include "format/format.h"

#include <cstddef>
#include <cstdint>

namespace colibri::kernels {

/// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], for one row of n.  (out may alias x)
void rmsnorm(float* out, const float* x, const float* w, int n, float eps);

/// out[i] = (x[i] - mean(x)) / sqrt(var(x) + eps) * w[i] + b[i], for one row of n.  (out may alias x)
void layernorm(float* out, const float* x, const float* w, const float* b, int n, float eps);

/// Dot product of one stored row (type t, n elements) with an f32 vector; a q4_0x8 or
/// q8_0x8 row in its q4_0 or q8_0 form (format::x8_row).
float dot_row(format::dtype t, const void* row, const float* x, int64_t n);

/// Rotary embedding, "rotate half" (NeoX / Hugging Face) layout, on one head of head_dim.
/// Rotates pairs (i, i + head_dim/2) of one head by pos * theta^(-2i/head_dim) / freq_factors[i]
/// (freq_factors null: 1), cos and sin multiplied by attn_factor.
void rope_head(float* x, int head_dim, int pos, float theta, const float* freq_factors = nullptr,
               float attn_factor = 1.0f);

/// Attention of n_q query heads (head_dim apart) sharing one key/value head over n cached
/// rows from element `first` of the caches (f16 or f32), the scores capped:
/// s = softmax(cap * tanh(scale * q . k / cap)), out = sum s v. scores: n_q * n floats.
void attend_softcapped(const float* q, int n_q, const void* k_cache, const void* v_cache, bool f16, int64_t first,
                       int n, int head_dim, float scale, float cap, float* scores, float* out);

/// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);

/// x[i] = gelu(x[i]) in its tanh approximation (PyTorch's gelu(approximate="tanh")).
void gelu(float* x, int64_t n);

/// gate[i] = gelu(gate[i]) * up[i], gelu as above
void geglu(float* gate, const float* up, int64_t n);

} // namespace colibri::kernels
