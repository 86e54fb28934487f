#pragma once
// K-quant tiles (q4_k, q5_k, q6_k) with int8 activations on 256-bit vectors: the AVX2
// table's, and with VNNI (vpdpbusd on 256 bits) the AVX-512 table's. Included after
// vec_x86.h by files built with at least AVX2 + FMA + F16C. The arithmetic is vec.h's:
// exact integer sums per 32-element sub-block, scaled in f32 into one lane per sub-block.

#include "cpu/vec_x86.h"

namespace colibri {
namespace {

// Sums of four products of unsigned bytes u (<= 63) and signed bytes s (|s| <= 127) in
// each int32 lane (pairs of products fit in int16 for maddubs).
template <bool Vnni>
inline __m256i dot_u8s8(__m256i u, __m256i s) {
    if constexpr (Vnni) {
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
    } else {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    }
}

// [a lo + a hi | b lo + b hi] of two half_sums4 results: eight whole sums.
inline __m256i join_halves(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Each 16-bit lane of v shifted left by k (k < 0: right by -k).
inline __m256i shift16(__m256i v, int k) {
    return k >= 0 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(k)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(-k));
}

// The scales (low 8 bytes) and mins (high 8 bytes) of a q4_k / q5_k super-block, one byte
// per sub-block (format::k_scale_min, eight at a time).
inline void k_scales_mins(const uint8_t* packed, __m256i& sc, __m256i& m) {
    constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    uint32_t u[3];
    std::memcpy(u, packed, 12);
    const uint64_t s = uint64_t(u[0] & k1) | uint64_t((u[2] & k2) | (((u[0] >> 6) & k3) << 4)) << 32;
    const uint64_t n = uint64_t(u[1] & k1) | uint64_t(((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4)) << 32;
    sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(s)));
    m = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(n)));
}

// The eight activation blocks of a super-block: their scales and their sums.
inline __m256 k_x_scales(const block_q8_x* x) {
    return _mm256_setr_ps(x[0].d, x[1].d, x[2].d, x[3].d, x[4].d, x[5].d, x[6].d, x[7].d);
}
inline __m256i k_x_sums(const block_q8_x* x) {
    return _mm256_setr_epi32(x[0].sum, x[1].sum, x[2].sum, x[3].sum, x[4].sum, x[5].sum, x[6].sum, x[7].sum);
}

template <class Block>
[[gnu::always_inline]] inline void prefetch_k_block(const Block& b) { // always inlined: see prefetch_rows
    const char* ahead = reinterpret_cast<const char*>(&b) + prefetch_bytes;
    for (size_t line = 0; line * 64 < sizeof(Block); ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
}

// One q4_k / q5_k super-block of a row against T tokens' activation blocks xs[t][0..7].
template <class Block, int T, bool Vnni>
inline void q45_k_block(const Block& b, const block_q8_x* const xs[T], const __m256 xd[T], __m256 acc[T]) {
    constexpr bool five = std::is_same_v<Block, format::block_q5_k>;
    __m256i sc, m;
    k_scales_mins(b.scales, sc, m);
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i q[8]; // sub-block j's values, 0..15 (0..31 for q5_k)
    for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
        q[2 * c] = _mm256_and_si256(v, low);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if constexpr (five) { // bit j of qh[l] into bit 4 of sub-block j's element l
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
        for (int j = 0; j < 8; ++j) q[j] = _mm256_or_si256(q[j], _mm256_and_si256(shift16(h, 4 - j), _mm256_set1_epi8(0x10)));
    }
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d)), dmin = _mm256_set1_ps(_cvtsh_ss(b.dmin));
    for (int t = 0; t < T; ++t) {
        __m256i p[8];
        for (int j = 0; j < 8; ++j) p[j] = dot_u8s8<Vnni>(q[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs)));
        const __m256i a = _mm256_mullo_epi32(join_halves(half_sums4(p), half_sums4(p + 4)), sc);
        const __m256i mins = _mm256_mullo_epi32(k_x_sums(xs[t]), m);
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd[t]), _mm256_cvtepi32_ps(a), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, xd[t]), _mm256_cvtepi32_ps(mins), acc[t]);
    }
}

// One q6_k super-block of a row against T tokens' activation blocks. The values less 32 go
// through the unsigned side as |w|, the activations taking w's sign.
template <int T, bool Vnni>
inline void q6_k_block(const format::block_q6_k& b, const block_q8_x* const xs[T], const __m256 xd[T], __m256 acc[T]) {
    // the 16 scales in the order of the half sums: [0 2 4 6 | 1 3 5 7] and [8 10 12 14 | 9 11 13 15]
    const __m128i s8 = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)),
                                        _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
    const __m256i sc0 = _mm256_cvtepi8_epi32(s8), sc1 = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(s8, s8));
    const __m256i low = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
    __m256i w[8], u[8]; // sub-block j = 4h + k: its values less 32, and their magnitudes
    for (int h = 0; h < 2; ++h) {
        const __m256i ql[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32))};
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
        for (int k = 0; k < 4; ++k) {
            const __m256i lo = _mm256_and_si256(k < 2 ? ql[k] : _mm256_srli_epi16(ql[k - 2], 4), low);
            const __m256i hi = _mm256_and_si256(shift16(qh, 4 - 2 * k), bits45);
            w[4 * h + k] = _mm256_sub_epi8(_mm256_or_si256(lo, hi), offset);
            u[4 * h + k] = _mm256_sign_epi8(w[4 * h + k], w[4 * h + k]);
        }
    }
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
    for (int t = 0; t < T; ++t) {
        __m256i p[8];
        for (int j = 0; j < 8; ++j) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs));
            p[j] = dot_u8s8<Vnni>(u[j], _mm256_sign_epi8(x, w[j]));
        }
        const __m256i a = join_halves(_mm256_mullo_epi32(half_sums4(p), sc0), _mm256_mullo_epi32(half_sums4(p + 4), sc1));
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd[t]), _mm256_cvtepi32_ps(a), acc[t]);
    }
}

// A K-quant tile for a fixed token count T: four rows (`stride` bytes apart) by T tokens.
template <class Block, int T, bool Vnni>
void tile_k_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    const Block* w[4];
    for (int r = 0; r < 4; ++r) w[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + r * stride);
    __m256 acc[4][T];
    for (int r = 0; r < 4; ++r) {
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        const block_q8_x* xs[T];
        __m256 xd[T];
        for (int t = 0; t < T; ++t) {
            xs[t] = x + size_t(t) * x_stride + size_t(8 * s);
            xd[t] = k_x_scales(xs[t]);
        }
        for (int r = 0; r < 4; ++r) {
            prefetch_k_block(w[r][s]);
            if constexpr (std::is_same_v<Block, format::block_q6_k>) q6_k_block<T, Vnni>(w[r][s], xs, xd, acc[r]);
            else q45_k_block<Block, T, Vnni>(w[r][s], xs, xd, acc[r]);
        }
    }
    for (int t = 0; t < T; ++t) {
        for (int r = 0; r < 4; ++r) out[t * 4 + r] = hsum(acc[r][t]); // vec_reference.cpp's sum8
    }
}

template <class Block, bool Vnni>
void tile_k(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n, float* out) {
    switch (clamp_int(n_tok, 1, 4)) {
    case 1: tile_k_t<Block, 1, Vnni>(rows, stride, x, x_stride, n, out); break;
    case 2: tile_k_t<Block, 2, Vnni>(rows, stride, x, x_stride, n, out); break;
    case 3: tile_k_t<Block, 3, Vnni>(rows, stride, x, x_stride, n, out); break;
    default: tile_k_t<Block, 4, Vnni>(rows, stride, x, x_stride, n, out); break;
    }
}

} // namespace
} // namespace colibri
