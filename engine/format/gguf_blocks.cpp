#include "format/gguf_blocks.h"

#include "core/error.h"
#include "core/half.h"

#include <cstring>

namespace colibri::format {

int read_only_block_elements(dtype t) { return t == dtype::iq4_xs || t == dtype::q2_k || t == dtype::q3_k ? qk_k : qk; }

namespace {

// Nibbles of qs[16]: element i the low nibble of qs[i], element i + 16 the high one.
void nibbles(const uint8_t* qs, int8_t* q) {
    for (int i = 0; i < 16; ++i) {
        q[i] = static_cast<int8_t>(qs[i] & 15);
        q[i + 16] = static_cast<int8_t>(qs[i] >> 4);
    }
}

// Bit i of qh[4] as element i's fifth bit.
void fifth_bits(const uint8_t* qh, int8_t* q) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(q[i] | int(((h >> i) & 1) << 4));
}

} // namespace

block32_ints block32_to_ints(dtype t, const uint8_t* block) {
    block32_ints b{};
    switch (t) {
    case dtype::q4_1: {
        const auto& k = *reinterpret_cast<const block_q4_1*>(block);
        nibbles(k.qs, b.q);
        b.d = f16_to_f32(k.d);
        b.m = f16_to_f32(k.m);
        b.has_min = true;
        return b;
    }
    case dtype::q5_0: {
        const auto& k = *reinterpret_cast<const block_q5_0*>(block);
        nibbles(k.qs, b.q);
        fifth_bits(k.qh, b.q);
        b.d = f16_to_f32(k.d);
        b.offset = 16;
        return b;
    }
    case dtype::q5_1: {
        const auto& k = *reinterpret_cast<const block_q5_1*>(block);
        nibbles(k.qs, b.q);
        fifth_bits(k.qh, b.q);
        b.d = f16_to_f32(k.d);
        b.m = f16_to_f32(k.m);
        b.has_min = true;
        return b;
    }
    case dtype::iq4_nl: {
        const auto& k = *reinterpret_cast<const block_iq4_nl*>(block);
        nibbles(k.qs, b.q);
        for (int8_t& v : b.q) v = iq4_values[v];
        b.d = f16_to_f32(k.d);
        return b;
    }
    default: break;
    }
    COLIBRI_ASSERT(false);
    return b;
}

void read_only_block_to_f32(dtype t, const uint8_t* block, float* out) {
    if (t == dtype::q2_k) { // as llama.cpp: (d sc) q - (dmin m)
        const auto& b = *reinterpret_cast<const block_q2_k*>(block);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        for (int e = 0; e < qk_k; ++e) {
            const float dl = d * static_cast<float>(b.scales[e / 16] & 15),
                        ml = dmin * static_cast<float>(b.scales[e / 16] >> 4);
            out[e] = dl * static_cast<float>(k_low2(b.qs, e)) - ml;
        }
        return;
    }
    if (t == dtype::q3_k) { // as llama.cpp: (d (ls - 32)) q
        const auto& b = *reinterpret_cast<const block_q3_k*>(block);
        const float d = f16_to_f32(b.d);
        for (int e = 0; e < qk_k; ++e) {
            const int q = k_low2(b.qs, e) - ((b.hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
            out[e] = (d * static_cast<float>(q3_k_scale(b, e / 16))) * static_cast<float>(q);
        }
        return;
    }
    if (t == dtype::iq4_xs) {
        const auto& b = *reinterpret_cast<const block_iq4_xs*>(block);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 8; ++j) {
            const float dl = d * static_cast<float>(iq4_xs_scale(b, j));
            int8_t q[32];
            nibbles(b.qs + 16 * j, q);
            for (int i = 0; i < 32; ++i) out[32 * j + i] = dl * iq4_values[q[i]];
        }
        return;
    }
    const block32_ints b = block32_to_ints(t, block);
    for (int i = 0; i < 32; ++i) {
        out[i] = b.has_min ? b.d * b.q[i] + b.m : b.d * static_cast<float>(b.q[i] - b.offset); // as llama.cpp
    }
}

} // namespace colibri::format
