#pragma once
// 256-bit helpers shared by the x86 tables (vec_avx2.cpp, vec_avx512.cpp): included only by
// files built with at least AVX2 + FMA + F16C. Everything here has internal linkage, so
// no copy compiled for a wider instruction set can be picked by the linker for another file.

#include "cpu/vec.h"

#include <cstdint>
#include <immintrin.h>

namespace colibri {
namespace {

// How far ahead of the reads the row kernels ask for weights: the hardware prefetchers
// alone leave a decode step waiting on memory.
constexpr int prefetch_bytes = 512;

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <class Block>
inline void row_pointers(const void* rows, size_t stride, const Block* w[4]) {
    for (int r = 0; r < 4; ++r) w[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + r * stride);
}

// The f16 scales of block ib in each of the four rows, for both halves of a q8_0 block:
// [rows 0-3 | rows 0-3].
inline __m256 q8_0_scales(const format::block_q8_0* const w[4], int64_t ib) {
    const uint64_t h = uint64_t(w[0][ib].d) | uint64_t(w[1][ib].d) << 16 | uint64_t(w[2][ib].d) << 32 |
                       uint64_t(w[3][ib].d) << 48;
    const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(h)));
    return _mm256_set_m128(d4, d4);
}

// One q8_0 block's sums [rows 0-3 of elements 0-15 | rows 0-3 of elements 16-31], scaled
// and added to acc: the arithmetic order every table keeps (vec.h).
inline __m256 q8_0_accumulate(__m256 dw, __m256i sums, const block_q8_x& xb, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb.d)), _mm256_cvtepi32_ps(sums), acc);
}

// q4_0 takes two blocks at a time, one per 128-bit half (Pair), or an odd last block alone
// in the low half. The eight f16 scales [rows 0-3 of block ib | rows 0-3 of block ib + 1],
// converted at once.
template <bool Pair>
inline __m256 q4_0_scales(const format::block_q4_0* const w[4], int64_t ib) {
    __m128i h = _mm_cvtsi32_si128(w[0][ib].d);
    h = _mm_insert_epi16(h, w[1][ib].d, 1);
    h = _mm_insert_epi16(h, w[2][ib].d, 2);
    h = _mm_insert_epi16(h, w[3][ib].d, 3);
    if (Pair) {
        h = _mm_insert_epi16(h, w[0][ib + 1].d, 4);
        h = _mm_insert_epi16(h, w[1][ib + 1].d, 5);
        h = _mm_insert_epi16(h, w[2][ib + 1].d, 6);
        h = _mm_insert_epi16(h, w[3][ib + 1].d, 7);
    }
    return _mm256_cvtph_ps(h);
}

// Elements 0-15 (i = 0) or 16-31 (i = 1) of two activation blocks, one per 128-bit half.
inline __m256i q4_0_x_half(const block_q8_x& x0, const block_q8_x& x1, int i) {
    const auto half = [i](const block_q8_x& b) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * i)); };
    return _mm256_set_m128i(half(x1), half(x0));
}

// The exact sums of the nibbles with two activation blocks [rows 0-3 of x0 | rows 0-3 of
// x1], less the -8 offsets (8 * sum(x)), scaled and added to acc.
template <bool Pair>
inline __m256 q4_0_accumulate(__m256 dw, __m256i nibble_sums, const block_q8_x& x0, const block_q8_x& x1, __m256 acc) {
    // [d, sum] of both blocks: the scales spread over each half, the offsets likewise
    const __m256i ds = _mm256_castsi128_si256(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&x0)),
                                                                 _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&x1))));
    const __m256 dx = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(ds, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)));
    __m256i offset = _mm256_slli_epi32(_mm256_permutevar8x32_epi32(ds, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3)), 3);
    if (!Pair) offset = _mm256_blend_epi32(offset, _mm256_setzero_si256(), 0xF0);
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(nibble_sums, offset)), acc);
}

// out[t * 4 + r] = lane r + lane r + 4 of acc[t]: the two partial sums of each row.
template <int T>
inline void store_tile(const __m256 acc[T], float* out) {
    for (int t = 0; t < T; ++t) {
        _mm_storeu_ps(out + 4 * t, _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1)));
    }
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// A tile kernel for a fixed token count, and the dispatch over 1-4 tokens.
using tile_fn = void (*)(const void*, size_t, const block_q8_x*, size_t, int64_t, float*);
template <const tile_fn (&Tiles)[4]>
void dispatch_tile(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n, float* out) {
    Tiles[clamp_int(n_tok, 1, 4) - 1](rows, stride, x, x_stride, n, out);
}

} // namespace
} // namespace colibri
