#pragma once
// 256-bit helpers shared by the x86 tables (kernel_table_avx2.cpp, kernel_table_avx512.cpp): included only by
// files built with at least AVX2 + FMA + F16C. Everything here has internal linkage, so
// no copy compiled for a wider instruction set can be picked by the linker for another file.

#include "cpu/kernel_table.h"

#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <type_traits>

// Unrolls the small fixed loop that follows completely. A block kernel's accumulator
// arrays stay in registers only when every loop over them is unrolled; GCC's own limits
// leave the larger ones as loops over memory.
#define COLIBRI_UNROLL _Pragma("GCC unroll 16")

namespace colibri {
namespace {

// How far ahead of the reads the row kernels ask for weights: the hardware prefetchers
// alone leave a decode step waiting on memory.
constexpr int prefetch_bytes = 512;

template <class Block>
inline void row_pointers(const void* rows, size_t stride, const Block* w[4]) {
    for (int r = 0; r < 4; ++r) w[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + r * stride);
}

// The f16 scales of block ib in four rows, packed in 64 bits.
template <class Block>
inline uint64_t scales4_bits(const Block* const w[4], int64_t ib) {
    uint64_t h =
        uint64_t(w[0][ib].d) | uint64_t(w[1][ib].d) << 16 | uint64_t(w[2][ib].d) << 32 | uint64_t(w[3][ib].d) << 48;
    // kept in a general register: vectorised, these loads become seven vpinsrw, which load
    // the vector pipes the tiles need
    __asm__("" : "+r"(h));
    return h;
}

// The f16 scales of block ib in each of the four rows, for both halves of a q8_0 block:
// [rows 0-3 | rows 0-3].
inline __m256 q8_0_scales(const format::block_q8_0* const w[4], int64_t ib) {
    const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(scales4_bits(w, ib))));
    return _mm256_set_m128(d4, d4);
}

// One q8_0 block's sums [rows 0-3 of elements 0-15 | rows 0-3 of elements 16-31], scaled
// and added to acc: the arithmetic order every table keeps (kernel_table.h).
inline __m256 q8_0_accumulate(__m256 dw, __m256i sums, const block_q8_x& xb, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb.d)), _mm256_cvtepi32_ps(sums), acc);
}

// q4_0 takes two blocks at a time, one per 128-bit half (Pair), or an odd last block alone
// in the low half. The eight f16 scales [rows 0-3 of block ib | rows 0-3 of block ib + 1],
// converted at once.
template <bool Pair>
inline __m256 q4_0_scales(const format::block_q4_0* const w[4], int64_t ib) {
    const uint64_t lo = scales4_bits(w, ib), hi = Pair ? scales4_bits(w, ib + 1) : 0;
    return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo)));
}

// Two 16-byte pieces in one vector, [a | b], where b lies 16 or more bytes after a (the
// nibbles of two adjacent q4_0 blocks, the halves of two adjacent activation blocks): two
// loads and a blend, which any vector pipe runs, where a lane insert takes the one pipe
// that the tiles' shuffles crowd.
inline __m256i two_pieces(const void* a, const void* b) {
    const __m256i lo = _mm256_loadu_si256(static_cast<const __m256i*>(a));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint8_t*>(b) - 16));
    return _mm256_blend_epi32(lo, hi, 0xF0);
}

// The nibbles of block ib and, for a Pair, block ib + 1 of one row, one block per 128-bit
// half (zeros for the missing block).
template <bool Pair>
inline __m256i q4_0_nibbles(const format::block_q4_0* w, int64_t ib) {
    if (Pair) return two_pieces(w[ib].qs, w[ib + 1].qs); // reads within the two blocks
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[ib].qs)));
}

// Elements 0-15 (i = 0) or 16-31 (i = 1) of activation blocks x[0] and, for a Pair, x[1],
// one per 128-bit half (the low half's again without a Pair).
template <bool Pair>
inline __m256i q4_0_x_half(const block_q8_x* x, int i) {
    if (Pair) return two_pieces(x[0].qs + 16 * i, x[1].qs + 16 * i); // reads within x[0] and x[1]
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[0].qs + 16 * i));
    return _mm256_set_m128i(h, h);
}

// The exact sums of the nibbles with the activation blocks [rows 0-3 of x[0] | rows 0-3 of
// x[1]], less the -8 offsets (8 * sum(x)), scaled and added to acc.
template <bool Pair>
inline __m256 q4_0_accumulate(__m256 dw, __m256i nibble_sums, const block_q8_x* x, __m256 acc) {
    // the scales and the offsets of both blocks, each spread over its half
    const __m256 dx = _mm256_blend_ps(_mm256_broadcast_ss(&x[0].d), _mm256_broadcast_ss(&x[Pair ? 1 : 0].d), 0xF0);
    const __m256i sums = _mm256_blend_epi32(_mm256_set1_epi32(x[0].sum),
                                            Pair ? _mm256_set1_epi32(x[1].sum) : _mm256_setzero_si256(), 0xF0);
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, dx),
                           _mm256_cvtepi32_ps(_mm256_sub_epi32(nibble_sums, _mm256_slli_epi32(sums, 3))), acc);
}

// out[t * 4 + r] = lane r + lane r + 4 of acc[t]: the two partial sums of each row.
template <int T>
inline void store_tile(const __m256 acc[T], float* out) {
    for (int t = 0; t < T; ++t) {
        _mm_storeu_ps(out + 4 * t, _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1)));
    }
}

// A q4_0 tile over n columns: step(std::bool_constant<Pair>, w, ib, acc) for blocks two at a
// time (Pair), then an odd last block alone.
template <int T, class Step>
inline void q4_0_tile(const void* rows, size_t stride, int64_t n, float* out, Step step) {
    const format::block_q4_0* w[4];
    row_pointers(rows, stride, w);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const int64_t nb = n / format::qk;
    int64_t ib = 0;
    for (; ib + 1 < nb; ib += 2) step(std::true_type{}, w, ib, acc);
    if (ib < nb) step(std::false_type{}, w, ib, acc);
    store_tile<T>(acc, out);
}

// Per 128-bit half, the sums of each vector's four lanes: [s0, s1, s2, s3 | the same of the
// high halves] (unpacks and adds in place of vphaddd, which decodes to several uops).
inline __m256i half_sums4(const __m256i s[4]) {
    const __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]), _mm256_unpackhi_epi32(s[0], s[1]));
    const __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[2], s[3]), _mm256_unpackhi_epi32(s[2], s[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// A tile kernel for a fixed token count, and the dispatch over 1-4 tokens.
using tile_fn = void (*)(const void*, size_t, const block_q8_x*, size_t, int64_t, float*);
template <const tile_fn (&Tiles)[4]>
void dispatch_tile(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                   float* out) {
    Tiles[clamp_int(n_tok, 1, 4) - 1](rows, stride, x, x_stride, n, out);
}

// Every 64-byte line of an interleaved block gets its prefetch. Weights read once (decode's
// streams, short batches' tiles: x8_tile_fn's once) are asked for into L2 (T1), 2,560 bytes
// ahead: on a Zen 4 core prefetches into L1 left decode at 40-68% of the read bandwidth, and
// these reach 83-90% (docs/performance-log.md, "Decode's prefetches into L2"). Prefill's
// tiles read their blocks again from L2 for every chunk of tokens and ask for them into L1,
// 2,048 bytes ahead (1.016-1.10x over 1,024 on all four bench models).
template <class Block>
[[gnu::always_inline]] inline void prefetch_x8_block(const Block& b, bool once) { // always inlined: see prefetch_rows
    const char* ahead = reinterpret_cast<const char*>(&b) + (once ? 2560 : 2048);
    for (size_t line = 0; line * 64 < sizeof(Block); ++line) {
        if (once) _mm_prefetch(ahead + 64 * line, _MM_HINT_T1);
        else _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
    }
}

// Four activation bytes, x[i..i+3], in every int32 lane (a broadcast from memory).
inline __m256i x4_all_lanes(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

// Attention (kernel_table_avx2.cpp; kernel_table_avx512.cpp for the 512-bit one).

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// e^x, lane by lane, within 2 ulp of the exact value for x in [-87, 88] (Cephes' expf:
// x = n ln 2 + r with |r| <= ln 2 / 2, e^r by a degree-7 polynomial, 2^n put into the
// exponent). Below -87 it gives e^-87 (the softmax of scores less their maximum: weights
// that small vanish against the maximum's 1); NaN stays NaN.
inline __m256 exp_ps(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x); // max returns its second operand for a NaN
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); // ln 2 in two parts
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// In-place softmax of n scores; the last partial vector through masked loads and stores.
inline void softmax_ps(float* s, int n) {
    const auto tail_mask = [](int m) { // the first m lanes
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    };
    const int n8 = n / 8 * 8;
    const __m256i mask = tail_mask(n - n8);
    __m256 mx = _mm256_set1_ps(-__builtin_huge_valf());
    for (int j = 0; j < n8; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    if (n8 < n)
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(mx, _mm256_maskload_ps(s + n8, mask), _mm256_castsi256_ps(mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m256 m = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < n8; j += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (n8 < n) {
        const __m256 e =
            _mm256_and_ps(exp_ps(_mm256_sub_ps(_mm256_maskload_ps(s + n8, mask), m)), _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(s + n8, mask, e);
        sum = _mm256_add_ps(sum, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum(sum));
    for (int j = 0; j < n8; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
    if (n8 < n) _mm256_maskstore_ps(s + n8, mask, _mm256_mul_ps(_mm256_maskload_ps(s + n8, mask), inv));
}

// The four sums of a[0..3]'s lanes.
inline __m128 hsum4(const __m256 a[4]) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The cached keys and values of a head are read as two streams, its first and second half
// of positions side by side: from memory, two streams per thread read faster than one.
inline int attention_half(int n) { return n / 4 * 2; }
// Each stream's rows are asked for this many positions ahead: 16, and at least 4 KB of the
// stream (64 f16 dimensions: 32 rows against 16 read 0.1-2.3 points of the decode ceiling
// more in eight of eight alternating runs, fine-grained q4_0x8, 2 threads, both states).
template <class T>
inline int attention_ahead(int hd) {
    const int rows = 4096 / (hd * int(sizeof(T)));
    return rows > 16 ? rows : 16;
}

// The helpers that only ask for memory are always inlined: GCC takes a function whose only
// effect is a prefetch for one without effects and drops calls to it that it did not inline
// (GCC 12 removed every call of prefetch_next_keys from the kernels). Cached keys and values
// are asked for into L2, as decode's weights are (into L1, a Zen 4 core's decode attention
// took 12-23% longer: docs/performance-log.md, "Decode's prefetches into L2").
template <class T>
[[gnu::always_inline]] inline void prefetch_rows(const T* row, int rows, int hd) {
    const auto* p = reinterpret_cast<const char*>(row);
    for (int b = 0; b < rows * hd * int(sizeof(T)); b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
}

// Where a pass ends, the first rows of the pass after it are asked for in its last steps,
// a row of each stream per row it reads, as far ahead as the rows within a pass: the
// values' during the scores, the caller's next keys during the values. The memory streams
// then run on from one pass to the next instead of starting cold. Against asking for the
// values' first rows all at once before the softmax and for nothing of the next keys,
// attention in colibri-bench --ops (fine-grained q4_0x8, 512-token prompt, one thread)
// read 0.70-0.72 -> 0.80-0.83 of the read bandwidth, 0.59-0.65 -> 0.77-0.83 on the AVX2
// kernels.
//
// Row r of the next pass's first `ahead` rows (or all of its shorter half) for the step
// that reads row `at` of a half of `half` rows, or -1.
inline int next_pass_row(int at, int half, int ahead, int next_half) {
    const int tail = ahead < half ? ahead : half, rows = ahead < next_half ? ahead : next_half;
    const int r = at - (half - tail);
    return r >= 0 && r < rows ? r : -1;
}

// The four keys of a step of the scores, j and j + 1 of each half, with the rows `ahead`
// of them asked for, and past them the values' first rows (v; null: not).
template <class T>
inline void score_keys(const T* k, const T* v, int j, int half, int hd, int ahead, const T* key[4]) {
    key[0] = k + j * hd;
    key[1] = key[0] + hd;
    key[2] = k + (half + j) * hd;
    key[3] = key[2] + hd;
    if (j + ahead < half) {
        prefetch_rows(key[0] + ahead * hd, 2, hd);
        prefetch_rows(key[2] + ahead * hd, 2, hd);
    } else if (v != nullptr) {
        for (int i = 0; i < 2; ++i) {
            const int r = next_pass_row(j + i, half, ahead, half);
            if (r < 0) continue;
            prefetch_rows(v + r * hd, 1, hd);
            prefetch_rows(v + (half + r) * hd, 1, hd);
        }
    }
}

// In the values' step over row j of each half: the next keys' first rows (null: none).
template <class T>
[[gnu::always_inline]] inline void prefetch_next_keys(const T* next_k, int next_n, int j, int half, int hd, int ahead) {
    if (next_k == nullptr) return;
    const int next_half = attention_half(next_n), r = next_pass_row(j, half, ahead, next_half);
    if (r < 0) return;
    prefetch_rows(next_k + r * hd, 1, hd);
    prefetch_rows(next_k + (next_half + r) * hd, 1, hd);
}

// The scores of keys j, j + 1, half + j and half + j + 1 (the sums of acc[0..3]), scaled.
inline void store_scores4(float* s, int j, int half, const __m256 acc[4], __m128 scale) {
    const __m128 v4 = _mm_mul_ps(hsum4(acc), scale);
    _mm_storel_pi(reinterpret_cast<__m64*>(s + j), v4);
    _mm_storeh_pi(reinterpret_cast<__m64*>(s + half + j), v4);
}

} // namespace
} // namespace colibri
