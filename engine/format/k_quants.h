#pragma once
// K-quant super-blocks (q4_k, q5_k, q6_k: 256 elements each, format.h), to f32 and from f32.

#include "format/format.h"

#include <cstdint>

namespace colibri::format {

/// One super-block of `t` in f32, as llama.cpp computes it: (d sc) q - (dmin m), or
/// (d sc) (q - 32) for q6_k.
void k_block_to_f32(dtype t, const uint8_t* block, float* out);

/// Quantises 256 values into one super-block of `t`. Each sub-block's scale (and min) is
/// the least-squares fit, weighted towards large values, best over a sweep of candidate
/// scales; the scales are then quantised (6 bits against d and dmin, or 8 for q6_k) and the
/// values quantised again against what is stored.
void k_block_from_f32(dtype t, const float* x, uint8_t* block);

} // namespace colibri::format
