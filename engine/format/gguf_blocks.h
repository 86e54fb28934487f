#pragma once
// The GGUF block types kept as read (format::is_read_only: q4_1, q5_0, q5_1, iq4_nl, iq4_xs,
// q2_k, q3_k):
// their blocks in f32, and their values as the integers the int8 kernels multiply.

#include "format/format.h"

#include <cstdint>

namespace colibri::format {

/// Elements of one block of read-only type t: 32, or 256 for a super-block (iq4_xs, q2_k, q3_k).
int read_only_block_elements(dtype t);

/// One block of read-only type t in f32, as llama.cpp and the gguf package compute it.
void read_only_block_to_f32(dtype t, const uint8_t* block, float* out);

/// A 32-element block of q4_1, q5_0, q5_1 or iq4_nl as integers: x_i = d (q_i - offset) + m.
/// q holds nibbles (q4_1), 5-bit values (q5_0, q5_1) or iq4_values (iq4_nl, signed).
struct block32_ints {
    int8_t q[32];
    float d, m;
    int offset;
    bool has_min; // q4_1, q5_1
};
block32_ints block32_to_ints(dtype t, const uint8_t* block);

/// Sub-block j (0..7) of an iq4_xs super-block: its scale less 32 (x = d ls iq4_values[q]).
inline int iq4_xs_scale(const block_iq4_xs& b, int j) {
    return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}

/// Sub-block k (0..15, 16 elements each) of a q3_k super-block: its scale less 32.
inline int q3_k_scale(const block_q3_k& b, int k) {
    const int lo = k < 8 ? b.scales[k] & 15 : b.scales[k - 8] >> 4;
    return (lo | (((b.scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32;
}

/// Element e = 128 h + 32 j + l's 2-bit value in a q2_k / q3_k super-block's qs.
inline int k_low2(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }

} // namespace colibri::format
