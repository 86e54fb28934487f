// AVX-512 (F, BW, VL) row kernels, with VNNI's vpdpbusd where the CPU has it. This file
// alone is compiled with those instruction sets; its tables are only used after the CPU
// reported them. The integer tiles and the int8 peak are AVX-512; the other entries are the
// AVX2 table's (a wider read loop does not read memory faster).
//
// Built a second time for the tests with COLIBRI_AVX512_EMULATED: SIMDe then provides the
// 512-bit intrinsics on an AVX2 machine, so the same kernels are checked against the
// scalar reference where no AVX-512 CPU is at hand (tests/engine/test_kernel_tables.cpp).

#include "cpu/kernel_table.h"
#include "cpu/kernels.h"

#if defined(__x86_64__)
// GCC 12.2's AVX-512 header reads an uninitialised variable for its "undefined" vectors
// (GCC bug 105593, fixed in 12.3); the warnings point into the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#if defined(COLIBRI_AVX512_EMULATED)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
// SIMDe 0.7.4 defines this alias with the masked form's four arguments
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#endif
#include "cpu/kquant_tiles_x86.h"
#include "cpu/simd_x86.h"

namespace colibri {

using format::block_q4_0;
using format::block_q8_0;
using format::qk;

namespace {

// Two 128-bit lanes of int32 sums per row, rows (0, 1) in s01 and (2, 3) in s23:
// s01 = [row 0: lane A, lane B | row 1: lane A, lane B], s23 likewise. Returns the sum of
// each lane's four int32 as [rows 0-3 of lane A | rows 0-3 of lane B], the layout of the
// 256-bit tiles.
inline __m256i sum_lanes(__m512i s01, __m512i s23) {
    // within each 128-bit lane k: [s01 k0 + k2, s23 k0 + k2, s01 k1 + k3, s23 k1 + k3]
    const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(s01, s23), _mm512_unpackhi_epi32(s01, s23));
    // elements 0 and 1 of lane k: the sums of lane k of s01 and of s23
    const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t, t), _mm512_unpackhi_epi64(t, t));
    // lane k of u holds (row 0 A, row 2 A), (row 0 B, row 2 B), (row 1 A, row 3 A), (row 1 B, row 3 B)
    return _mm512_castsi512_si256(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

// Sums of four products of unsigned bytes u and signed bytes s into each int32 lane:
// vpdpbusd, or maddubs + madd without VNNI (pairs of products fit in int16 for the inputs
// the tiles pass: |u| <= 128 with |s| <= 127, or u <= 15).
template <bool Vnni>
inline __m512i dot4(__m512i acc, __m512i u, __m512i s) {
    if constexpr (Vnni) {
        return _mm512_dpbusd_epi32(acc, u, s);
    } else {
        return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
    }
}

// Two rows' 256-bit blocks in one register: [a | b].
inline __m512i two_rows(const void* a, const void* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(a))),
                              _mm256_loadu_si256(static_cast<const __m256i*>(b)), 1);
}

inline __m512i broadcast256(__m256i v) { return _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1); }

// q8_0: two rows per register. |w| is the unsigned side; x takes w's sign (negated where w
// is negative: AVX-512 has no vpsignb).
template <int T, bool Vnni>
void tile_q8_0_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    const block_q8_0* w[4];
    row_pointers(rows, stride, w);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        __m512i abs[2];
        __mmask64 negative[2];
        for (int p = 0; p < 2; ++p) {
            _mm_prefetch(reinterpret_cast<const char*>(&w[2 * p][ib]) + prefetch_bytes, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(&w[2 * p + 1][ib]) + prefetch_bytes, _MM_HINT_T0);
            const __m512i a = two_rows(w[2 * p][ib].qs, w[2 * p + 1][ib].qs);
            abs[p] = _mm512_abs_epi8(a);
            negative[p] = _mm512_movepi8_mask(a);
        }
        const __m256 dw = q8_0_scales(w, ib);
        for (int t = 0; t < T; ++t) {
            const block_q8_x& xb = x[size_t(t) * x_stride + size_t(ib)];
            const __m512i xv = broadcast256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs)));
            __m512i s[2];
            for (int p = 0; p < 2; ++p)
                s[p] = dot4<Vnni>(zero, abs[p], _mm512_mask_sub_epi8(xv, negative[p], zero, xv));
            acc[t] = q8_0_accumulate(dw, sum_lanes(s[0], s[1]), xb, acc[t]);
        }
    }
    store_tile<T>(acc, out);
}

// q4_0: blocks ib and ib + 1 of two rows per register, [row a: ib, ib + 1 | row b: ib,
// ib + 1]; an odd last block alone (Pair false) with zeros in place of block ib + 1.
template <int T, bool Vnni, bool Pair>
inline void q4_0_step(const block_q4_0* const w[4], const block_q8_x* x, size_t x_stride, int64_t ib, __m256 acc[T]) {
    const __m512i low = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    __m512i lo[2], hi[2];
    for (int p = 0; p < 2; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(&w[2 * p][ib]) + prefetch_bytes, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(&w[2 * p + 1][ib]) + prefetch_bytes, _MM_HINT_T0);
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q4_0_nibbles<Pair>(w[2 * p], ib)),
                                             q4_0_nibbles<Pair>(w[2 * p + 1], ib), 1);
        lo[p] = _mm512_and_si512(q, low);                       // elements 0-15 of each block
        hi[p] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low); // elements 16-31
    }
    const __m256 dw = q4_0_scales<Pair>(w, ib);
    for (int t = 0; t < T; ++t) {
        const block_q8_x* xt = x + size_t(t) * x_stride + size_t(ib);
        const __m512i xa = broadcast256(q4_0_x_half<Pair>(xt, 0)), xb = broadcast256(q4_0_x_half<Pair>(xt, 1));
        __m512i s[2];
        for (int p = 0; p < 2; ++p) s[p] = dot4<Vnni>(dot4<Vnni>(zero, lo[p], xa), hi[p], xb);
        acc[t] = q4_0_accumulate<Pair>(dw, sum_lanes(s[0], s[1]), xt, acc[t]);
    }
}

template <int T, bool Vnni>
void tile_q4_0_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    q4_0_tile<T>(rows, stride, n, out, [&](auto pair, const block_q4_0* const w[4], int64_t ib, __m256 acc[T]) {
        q4_0_step<T, Vnni, pair.value>(w, x, x_stride, ib, acc);
    });
}

// [lo | hi] in one 512-bit register.
inline __m512 combine(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

// 16 int32 lanes as f32 (SIMDe 0.7.4 has no 512-bit conversion: two 256-bit ones there).
inline __m512 to_ps(__m512i v) {
#if defined(COLIBRI_AVX512_EMULATED)
    return combine(_mm256_cvtepi32_ps(_mm512_castsi512_si256(v)), _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)));
#else
    return _mm512_cvtepi32_ps(v);
#endif
}

// Two blocks' eight f16 scales as f32, [a | b].
inline __m512 scales16(const uint16_t* a, const uint16_t* b) {
    return combine(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                   _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))));
}

// Four activation bytes, x[i..i+3], in every int32 lane of a 512-bit register.
inline __m512i x4_all_lanes512(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

// The 512-bit interleaved tiles' weights of one type: the eight unsigned vectors of a pair
// of blocks, [block a | block b], that vpdpbusd multiplies with the activation bytes at
// x_offset(k), and the integer bias that makes the sums exact (kernel_table.h).
// q4_0x8: the nibbles (lo: elements 4k..4k+3, hi: 16 + 4k..), less 8 * sum(x).
struct q4_0x8_pair_ops {
    using block = format::block_q4_0x8;
    static void load(const block& a, const block& b, __m512i v[8]) {
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int k = 0; k < 4; ++k) {
            const __m512i q = two_rows(a.qs[k], b.qs[k]);
            v[k] = _mm512_and_si512(q, low);
            v[4 + k] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
        }
    }
    static int x_offset(int k) { return k < 4 ? 4 * k : 16 + 4 * (k - 4); }
    static int32_t bias(const block_q8_x& xb) { return -8 * xb.sum; }
};

// q8_0x8: the signed weights made unsigned, w + 128 (the sign bit flipped), less
// 128 * sum(x).
struct q8_0x8_pair_ops {
    using block = format::block_q8_0x8;
    static void load(const block& a, const block& b, __m512i v[8]) {
        const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
        for (int k = 0; k < 8; ++k) v[k] = _mm512_xor_si512(two_rows(a.qs[k], b.qs[k]), flip);
    }
    static int x_offset(int k) { return 4 * k; }
    static int32_t bias(const block_q8_x& xb) { return -128 * xb.sum; }
};

// Two int32 values, a in every lane of the low half and b in every lane of the high half.
inline __m512i halves_epi32(int32_t a, int32_t b) {
    return _mm512_inserti64x4(_mm512_set1_epi32(a), _mm256_set1_epi32(b), 1);
}

// Four activation bytes of two blocks: a's in every lane of the low half, b's of the high.
inline __m512i x4_halves(const int8_t* a, const int8_t* b) {
    int32_t va, vb;
    std::memcpy(&va, a, 4);
    std::memcpy(&vb, b, 4);
    return _mm512_mask_set1_epi32(_mm512_set1_epi32(va), 0xFF00, vb);
}

// An interleaved tile on 512-bit registers with VNNI: the 2P groups at w by T tokens, the
// two groups of a pair side by side in one register ([group 2p: rows 0-7 | group 2p + 1:
// rows 0-7]), so one vpdpbusd covers sixteen rows. Token t of group g is at
// x[OwnX ? g : 0] + t * x_stride (each group its own activations, or all the same ones).
// Each row's arithmetic is the 256-bit tile's (exact integer sums, then scaled and added
// block after block), so results are bit-identical. The outputs of token t and group g go
// to out[(t * out_groups + g) * 8]. once: x8_tile_fn's.
template <class Ops, int P, int T, bool OwnX>
void x8_pairs_walk(const typename Ops::block* const w[2 * P], const block_q8_x* const x[2 * P], size_t x_stride,
                   int64_t n, bool once, int out_groups, float* out) {
    static_assert(P * T <= 8);
    using block = typename Ops::block;
    __m512 acc[P * T];
    for (int i = 0; i < P * T; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        __m512i v[P][8];
        __m512 dw[P];
        for (int p = 0; p < P; ++p) {
            const block& a = w[2 * p][ib];
            const block& b = w[2 * p + 1][ib];
            prefetch_x8_block(a, once);
            prefetch_x8_block(b, once);
            Ops::load(a, b, v[p]);
            dw[p] = scales16(a.d, b.d);
        }
        for (int t = 0; t < T; ++t) {
            const size_t at = size_t(t) * x_stride + size_t(ib);
            // two chains per pair, the first starting from the bias
            __m512i s[P][2];
            __m512 dx[P];
            for (int p = 0; p < P; ++p) {
                const block_q8_x& xa = x[OwnX ? 2 * p : 0][at];
                const block_q8_x& xb = x[OwnX ? 2 * p + 1 : 0][at];
                if constexpr (OwnX) {
                    s[p][0] = halves_epi32(Ops::bias(xa), Ops::bias(xb));
                    dx[p] = combine(_mm256_set1_ps(xa.d), _mm256_set1_ps(xb.d));
                } else {
                    s[p][0] = _mm512_set1_epi32(Ops::bias(xa));
                    dx[p] = _mm512_set1_ps(xa.d);
                }
                s[p][1] = _mm512_setzero_si512();
            }
            for (int k = 0; k < 8; ++k) {
                const int off = Ops::x_offset(k);
                if constexpr (OwnX) {
                    for (int p = 0; p < P; ++p) {
                        const __m512i xk = x4_halves(x[2 * p][at].qs + off, x[2 * p + 1][at].qs + off);
                        s[p][k % 2] = _mm512_dpbusd_epi32(s[p][k % 2], v[p][k], xk);
                    }
                } else {
                    const __m512i xk = x4_all_lanes512(x[0][at].qs + off);
                    for (int p = 0; p < P; ++p) s[p][k % 2] = _mm512_dpbusd_epi32(s[p][k % 2], v[p][k], xk);
                }
            }
            for (int p = 0; p < P; ++p) {
                acc[t * P + p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], dx[p]), to_ps(_mm512_add_epi32(s[p][0], s[p][1])),
                                                 acc[t * P + p]);
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + (t * out_groups + 2 * p) * 8, acc[t * P + p]);
    }
}

// 2P groups `stride` bytes apart, every one with the same T activation vectors.
template <class Ops, int P, int T>
void x8_pairs(const void* groups, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, bool once,
              int out_groups, float* out) {
    using block = typename Ops::block;
    const block* w[2 * P];
    for (int g = 0; g < 2 * P; ++g)
        w[g] = reinterpret_cast<const block*>(static_cast<const uint8_t*>(groups) + g * stride);
    x8_pairs_walk<Ops, P, T, false>(w, &x, x_stride, n, once, out_groups, out);
}

// streams_q4_0x8 / streams_q8_0x8 with VNNI: four groups anywhere, each with its own
// activations, as two pairs; decode reads them once (prefetches into L2).
template <class Ops>
void x8_pair_streams(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    using block = typename Ops::block;
    const block* w[4];
    for (int g = 0; g < 4; ++g) w[g] = static_cast<const block*>(groups[g]);
    if (x[0] == x[1] && x[0] == x[2] && x[0] == x[3])
        x8_pairs_walk<Ops, 2, 1, false>(w, x, 0, n, true, 4, out); // one broadcast for all
    else x8_pairs_walk<Ops, 2, 1, true>(w, x, 0, n, true, 4, out);
}

// tile_q4_0x8 / tile_q8_0x8 with VNNI: groups two by two (one pair by up to eight tokens,
// two pairs by up to four at a time); a single group, and the third of three, as a pair
// with itself, half of it kept.
template <class Ops>
void dispatch_x8_pairs(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride, int n_tok,
                       int64_t n, bool once, float* out) {
    using pairs_fn = void (*)(const void*, size_t, const block_q8_x*, size_t, int64_t, bool, int, float*);
    // [pairs - 1][tokens - 1]
    static constexpr pairs_fn pairs[2][8] = {
        {x8_pairs<Ops, 1, 1>, x8_pairs<Ops, 1, 2>, x8_pairs<Ops, 1, 3>, x8_pairs<Ops, 1, 4>, x8_pairs<Ops, 1, 5>,
         x8_pairs<Ops, 1, 6>, x8_pairs<Ops, 1, 7>, x8_pairs<Ops, 1, 8>},
        {x8_pairs<Ops, 2, 1>, x8_pairs<Ops, 2, 2>, x8_pairs<Ops, 2, 3>, x8_pairs<Ops, 2, 4>},
    };
    const int t = clamp_int(n_tok, 1, 8), g = clamp_int(n_groups, 1, 4);
    if (g >= 2) {
        const int step = g / 2 == 1 ? 8 : 4;
        for (int t0 = 0; t0 < t; t0 += step) {
            pairs[g / 2 - 1][clamp_int(t - t0, 1, step) - 1](groups, stride, x + size_t(t0) * x_stride, x_stride, n,
                                                             once, g, out + t0 * g * 8);
        }
    }
    if (g % 2 == 1) {
        float last[8 * 16];
        pairs[0][t - 1](static_cast<const uint8_t*>(groups) + size_t(g - 1) * stride, 0, x, x_stride, n, once, 2, last);
        for (int k = 0; k < t; ++k) std::memcpy(out + (k * g + g - 1) * 8, last + k * 16, 8 * sizeof(float));
    }
}

// Attention on 512-bit vectors for head dimensions 64 and 128: a pass's query rows (a
// token's heads, and the next tokens') share each key's and value's load and conversion.
// The positions are read as two streams, their halves side by side, then the rest in order;
// the halves split at a multiple of 8 positions that moves every 16, so a pass's tokens split
// at most two ways (attention_values512). Each score is its own key's sum and each row
// adds its values in the same order whatever rows share its pass: a token gets the bits it
// gets alone.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
#if defined(COLIBRI_AVX512_EMULATED) // SIMDe 0.7.4 has no 512-bit f16 conversion
    return combine(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                   _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))));
#else
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
}

// The rows of each stream: a multiple of 8 (2 * stream_half(n) <= n; the rest after them).
inline int stream_half(int n) { return n / 16 * 8; }

// R query rows against the same keys: row r's scores (n[r] of them, ascending in r) and output.
template <int R>
struct attend_rows512 {
    const float* q[R];
    float* s[R];
    float* out[R];
    int n[R];
};

// The low and high 256-bit halves of v added.
inline __m256 fold(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// _mm512_shuffle_f32x4 (SIMDe 0.7.4 has it under its integer name only).
template <int Imm>
inline __m512 shuffle128(__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_shuffle_i32x4(_mm512_castps_si512(a), _mm512_castps_si512(b), Imm));
}

// fold on two vectors at once: [a's 0-3 | a's 4-7 | b's 0-3 | b's 4-7], each lane its own
// sum of lanes l and l + 8.
inline __m512 fold2(__m512 a, __m512 b) {
    return _mm512_add_ps(shuffle128<_MM_SHUFFLE(1, 0, 1, 0)>(a, b), shuffle128<_MM_SHUFFLE(3, 2, 3, 2)>(a, b));
}

// _mm256_hadd_ps's sums in every 128-bit lane: [a0 + a1, a2 + a3, b0 + b1, b2 + b3].
inline __m512 hadd512(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Four keys (positions at[0], at[0] + 1, at[2], at[2] + 1) against every row, each score
// summed exactly as fold and hsum4 sum it, with a quarter of their shuffles: a 512-bit tree
// takes four rows' sixteen sums at once. g[i]: row r0 + i's four keys folded, then paired.
template <int R, int NV>
inline void score_step4(const attend_rows512<R>& rows, const __m512 (&kv)[4][NV], const int at[4], __m512 sc) {
    for (int r0 = 0; r0 < R; r0 += 4) {
        __m512 g[4];
        for (int i = 0; i < 4; ++i) {
            if (r0 + i >= R) { // a short last group repeats its last row
                g[i] = g[i - 1];
                continue;
            }
            __m512 a[4];
            for (int u = 0; u < 4; ++u) {
                a[u] = _mm512_setzero_ps();
                for (int k = 0; k < NV; ++k)
                    a[u] = _mm512_fmadd_ps(_mm512_loadu_ps(rows.q[r0 + i] + 16 * k), kv[u][k], a[u]);
            }
            g[i] = hadd512(fold2(a[0], a[2]), fold2(a[1], a[3]));
        }
        const __m512 h0 = hadd512(g[0], g[1]), h1 = hadd512(g[2], g[3]);
        // [row r0: k0 k1, row r0 + 1: k0 k1 | the same rows' k2 k3 | rows r0 + 2, r0 + 3 likewise]
        const __m512 s = _mm512_mul_ps(
            _mm512_add_ps(shuffle128<_MM_SHUFFLE(2, 0, 2, 0)>(h0, h1), shuffle128<_MM_SHUFFLE(3, 1, 3, 1)>(h0, h1)),
            sc);
        for (int i = 0; i < 4 && r0 + i < R; ++i) {
            const __m128 first = i < 2 ? _mm512_castps512_ps128(s) : _mm512_extractf32x4_ps(s, 2);
            const __m128 second = i < 2 ? _mm512_extractf32x4_ps(s, 1) : _mm512_extractf32x4_ps(s, 3);
            float* out = rows.s[r0 + i];
            if (i % 2 == 0) {
                _mm_storel_pi(reinterpret_cast<__m64*>(out + at[0]), first);
                _mm_storel_pi(reinterpret_cast<__m64*>(out + at[2]), second);
            } else {
                _mm_storeh_pi(reinterpret_cast<__m64*>(out + at[0]), first);
                _mm_storeh_pi(reinterpret_cast<__m64*>(out + at[2]), second);
            }
        }
    }
}

// Keys key[0 .. valid) (at positions at[u]) against every row: each score is its key's
// products summed as fold and hsum4 sum them, whatever the key's place in the step.
template <int R, int NV, int U, class T>
inline void score_step(const attend_rows512<R>& rows, const T* const key[U], const int at[U], int valid, __m128 sc) {
    __m512 kv[U][NV];
    for (int u = 0; u < U; ++u) {
        if (u >= valid) break;
        for (int i = 0; i < NV; ++i) kv[u][i] = load16(key[u] + 16 * i);
    }
    if constexpr (U == 4) {
        if (valid == 4 && at[1] == at[0] + 1 && at[3] == at[2] + 1) {
            score_step4<R, NV>(rows, kv, at, _mm512_broadcast_f32x4(sc));
            return;
        }
    }
    for (int r = 0; r < R; ++r) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int u = 0; u < U; ++u) {
            if (u >= valid) break;
            __m512 a = _mm512_setzero_ps();
            for (int i = 0; i < NV; ++i) a = _mm512_fmadd_ps(_mm512_loadu_ps(rows.q[r] + 16 * i), kv[u][i], a);
            acc[u] = fold(a);
        }
        alignas(16) float v4[4];
        _mm_store_ps(v4, _mm_mul_ps(hsum4(acc), sc));
        for (int u = 0; u < U; ++u) {
            if (u < valid) rows.s[r][at[u]] = v4[u];
        }
    }
}

// Every row's scores against the first n[R - 1] keys: the two streams of `half` rows a step of U
// keys (P of each), then the rest U at a time. The last steps of the streams ask for the
// values' first rows (v; null: not).
template <int R, int NV, class T>
void attention_scores512(const attend_rows512<R>& rows, const T* k, int half, float scale, const T* v) {
    constexpr int hd = 16 * NV, U = NV == 4 ? 4 : 2, P = U / 2; // NV 8: two keys' vectors fill the registers
    const int n = rows.n[R - 1], ahead = attention_ahead<T>(hd);
    const __m128 sc = _mm_set1_ps(scale);
    const T* key[U];
    int at[U];
    for (int j = 0; j < half; j += P) {
        for (int p = 0; p < P; ++p) {
            at[p] = j + p;
            at[P + p] = half + j + p;
        }
        for (int u = 0; u < U; ++u) key[u] = k + at[u] * hd;
        if (j + ahead < half) {
            prefetch_rows(key[0] + ahead * hd, P, hd);
            prefetch_rows(key[P] + ahead * hd, P, hd);
        } else if (v != nullptr) {
            for (int p = 0; p < P; ++p) {
                const int r = next_pass_row(j + p, half, ahead, half);
                if (r < 0) continue;
                prefetch_rows(v + r * hd, 1, hd);
                prefetch_rows(v + (half + r) * hd, 1, hd);
            }
        }
        score_step<R, NV, U>(rows, key, at, U, sc);
    }
    for (int j = 2 * half; j < n; j += U) {
        const int valid = std::min(U, n - j);
        for (int u = 0; u < valid; ++u) {
            at[u] = j + u;
            key[u] = k + at[u] * hd;
        }
        if (j + ahead < n) prefetch_rows(k + (j + ahead) * hd, std::min(U, n - j - ahead), hd);
        score_step<R, NV, U>(rows, key, at, valid, sc);
    }
}

// out_r = sum_j s_r[j] v_j for every row: a row of each stream at a time, then the rest
// in order (row r's while j < n[r]); next_k (null: none): the keys whose first rows to ask
// for in the streams' last steps. Split: the pass's tokens straddle a multiple of 16
// positions, rows [0, ka) splitting their positions at h0 and the rest at h1 = h0 + 8; each
// row adds its values in the order it adds them alone, and the pass reads them once.
template <int R, int NV, bool Split, class T>
void attention_values512(const attend_rows512<R>& rows, const T* v, int ka, const T* next_k, int next_n) {
    constexpr int hd = 16 * NV;
    const int n = rows.n[R - 1], ahead = attention_ahead<T>(hd), next_half = stream_half(next_n);
    const int h0 = stream_half(rows.n[0]), h1 = Split ? stream_half(n) : h0, a = Split ? ka : R;
    __m512 acc[R][NV];
    for (int r = 0; r < R; ++r) {
        for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_setzero_ps();
    }
    // row j of the values to rows [r0, r1) (those with j < n[r] unless every_row)
    const auto add = [&](int j, int r0, int r1, bool every_row) {
        __m512 x[NV];
        for (int i = 0; i < NV; ++i) x[i] = load16(v + j * hd + 16 * i);
        for (int r = 0; r < R; ++r) {
            if (r < r0 || r >= r1 || (!every_row && j >= rows.n[r])) continue;
            const __m512 p = _mm512_set1_ps(rows.s[r][j]);
            for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_fmadd_ps(p, x[i], acc[r][i]);
        }
    };
    for (int j = 0; j < h1; ++j) {
        if (j + ahead < h1) {
            prefetch_rows(v + (j + ahead) * hd, 1, hd);
            prefetch_rows(v + (h0 + j + ahead) * hd, 1, hd);
            if (Split) prefetch_rows(v + (h1 + j + ahead) * hd, 1, hd);
        } else if (next_k != nullptr) {
            const int r = next_pass_row(j, h1, ahead, next_half);
            if (r >= 0) {
                prefetch_rows(next_k + r * hd, 1, hd);
                prefetch_rows(next_k + (next_half + r) * hd, 1, hd);
            }
        }
        if (!Split || j < h0) {
            add(j, 0, R, true);
            add(h0 + j, 0, a, true);
        } else {
            add(j, a, R, true);
        }
        if (Split) add(h1 + j, a, R, true);
    }
    for (int j = 2 * h0; j < n; ++j) {
        if (j + ahead < n) prefetch_rows(v + (j + ahead) * hd, 1, hd);
        add(j, 0, j < 2 * h1 ? a : R, false);
    }
    for (int r = 0; r < R; ++r) {
        for (int i = 0; i < NV; ++i) _mm512_storeu_ps(rows.out[r] + 16 * i, acc[r][i]);
    }
}

// Sixteen float lanes holding whole numbers as int32 (SIMDe 0.7.4 has no 512-bit
// conversion: two 256-bit ones there).
inline __m512i to_epi32(__m512 v) {
#if defined(COLIBRI_AVX512_EMULATED)
    const __m256i lo = _mm256_cvtps_epi32(_mm512_castps512_ps256(v));
    const __m256i hi = _mm256_cvtps_epi32(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
#else
    return _mm512_cvtps_epi32(v);
#endif
}

// exp_ps (simd_x86.h) on sixteen lanes: the same steps, so the same value in every lane.
inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x); // max returns its second operand for a NaN
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x); // ln 2 in two parts
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(to_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// softmax_ps on sixteen lanes: half the instructions per score. The last partial vector
// goes through a buffer padded with -inf (its weights then zeroed).
inline void softmax512(float* s, int n) {
    const int n16 = n / 16 * 16, rest = n - n16;
    alignas(64) float last[16];
    for (int i = 0; i < 16; ++i) last[i] = i < rest ? s[n16 + i] : -__builtin_huge_valf();
    __m512 mx = _mm512_load_ps(last);
    for (int j = 0; j < n16; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
    __m256 m8 =
        _mm256_max_ps(_mm512_castps512_ps256(mx), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(mx), 1)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m512 m = _mm512_set1_ps(_mm_cvtss_f32(m4));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n16; j += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 e_last =
        _mm512_maskz_mov_ps(__mmask16((1u << rest) - 1), exp512(_mm512_sub_ps(_mm512_load_ps(last), m)));
    sum = _mm512_add_ps(sum, e_last);
    const __m512 inv = _mm512_set1_ps(1.0f / hsum(fold(sum)));
    for (int j = 0; j < n16; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
    _mm512_store_ps(last, _mm512_mul_ps(e_last, inv));
    std::memcpy(s + n16, last, sizeof(float) * size_t(rest));
}

// One pass: rows r0 .. r1 of the call (token-major: row r is head r % n_q of token r / n_q).
template <int R, int NV, class T>
void attend_pass512(const float* q, int64_t q_stride, int n_q, const T* k, const T* v, const int* n, int r0, int n_last,
                    float scale, float* scores, float* out, int64_t out_stride, const T* next_k, int next_n) {
    constexpr int hd = 16 * NV;
    attend_rows512<R> rows;
    for (int i = 0; i < R; ++i) {
        const int t = (r0 + i) / n_q, h = (r0 + i) % n_q;
        rows.q[i] = q + t * q_stride + h * hd;
        rows.s[i] = scores + int64_t(r0 + i) * n_last;
        rows.out[i] = out + t * out_stride + h * hd;
        rows.n[i] = n[t];
    }
    const int half = stream_half(rows.n[0]); // the scores' streams: a score is its own key's sum either way
    attention_scores512<R, NV>(rows, k, half, scale, v);
    for (int i = 0; i < R; ++i) softmax512(rows.s[i], rows.n[i]);
    int ka = 0; // the rows that split their positions where the first row does
    while (ka < R && stream_half(rows.n[ka]) == half) ++ka;
    if (ka == R) attention_values512<R, NV, false>(rows, v, ka, next_k, next_n);
    else attention_values512<R, NV, true>(rows, v, ka, next_k, next_n);
}

// The call's rows in passes of at most `most` rows whose streams split within 8 positions.
template <int NV, class T>
void attend512_t(const float* q, int64_t q_stride, int n_q, int n_tok, const T* k, const T* v, const int* n,
                 float scale, float* scores, float* out, int64_t out_stride, const T* next_k, int next_n) {
    constexpr int most = NV == 4 ? 6 : 2; // the rows whose value sums stay in registers
    using pass_fn = void (*)(const float*, int64_t, int, const T*, const T*, const int*, int, int, float, float*,
                             float*, int64_t, const T*, int);
    static constexpr pass_fn passes[6] = {attend_pass512<1, NV, T>, attend_pass512<2, NV, T>, attend_pass512<3, NV, T>,
                                          attend_pass512<4, NV, T>, attend_pass512<5, NV, T>, attend_pass512<6, NV, T>};
    const int rows = n_q * n_tok, n_last = n[n_tok - 1];
    for (int r0 = 0; r0 < rows;) {
        const int half = stream_half(n[r0 / n_q]);
        int r1 = r0 + 1;
        while (r1 < rows && r1 - r0 < most && stream_half(n[r1 / n_q]) <= half + 8) ++r1;
        const bool last = r1 == rows;
        passes[r1 - r0 - 1](q, q_stride, n_q, k, v, n, r0, n_last, scale, scores, out, out_stride,
                            last ? next_k : nullptr, last ? next_n : 0);
        r0 = r1;
    }
}

// attend / attend_f16: head dimensions 64 and 128 here, the others on the AVX2 kernels.
template <class T>
void attend512(const float* q, int64_t q_stride, int n_q, int n_tok, const T* k, const T* v, const int* n, int head_dim,
               float scale, float* scores, float* out, int64_t out_stride, const T* next_k, int next_n) {
    switch (head_dim) {
    case 64: attend512_t<4>(q, q_stride, n_q, n_tok, k, v, n, scale, scores, out, out_stride, next_k, next_n); return;
    case 128: attend512_t<8>(q, q_stride, n_q, n_tok, k, v, n, scale, scores, out, out_stride, next_k, next_n); return;
    default:
        if constexpr (std::is_same_v<T, float>) {
            avx2_kernel_table()->attend(q, q_stride, n_q, n_tok, k, v, n, head_dim, scale, scores, out, out_stride,
                                        next_k, next_n);
        } else {
            avx2_kernel_table()->attend_f16(q, q_stride, n_q, n_tok, k, v, n, head_dim, scale, scores, out, out_stride,
                                            next_k, next_n);
        }
    }
}

template <bool Vnni>
constexpr tile_fn q8_0_tiles[4] = {tile_q8_0_t<1, Vnni>, tile_q8_0_t<2, Vnni>, tile_q8_0_t<3, Vnni>,
                                   tile_q8_0_t<4, Vnni>};
template <bool Vnni>
constexpr tile_fn q4_0_tiles[4] = {tile_q4_0_t<1, Vnni>, tile_q4_0_t<2, Vnni>, tile_q4_0_t<3, Vnni>,
                                   tile_q4_0_t<4, Vnni>};

template <bool Vnni>
inline __m512i madd_step(__m512i acc, __m512i a, __m512i b) {
    if constexpr (Vnni) return _mm512_dpbusd_epi32(acc, a, b);
    else return _mm512_add_epi16(acc, _mm512_maddubs_epi16(a, b));
}

template <bool Vnni>
uint64_t madd_loop(int64_t iterations) {
    // independent chains of the tiles' dot-product instructions (vpdpbusd, or maddubs with
    // its pairs added in int16 as the AVX2 table measures it), 64 multiply-adds each. Twelve
    // accumulators over three times four inputs, every product different (or the compiler
    // would compute them once), all held in registers: GCC otherwise keeps accumulators on
    // the stack, and the loop measures store forwarding. Twelve chains cover vpdpbusd's
    // latency at two per cycle. 12 x 64 = 3 x 256 multiply-adds per pass: iterations / 3
    // passes.
    __m512i a0 = _mm512_set1_epi8(3), a1 = _mm512_set1_epi8(4), a2 = _mm512_set1_epi8(5);
    __m512i b0 = _mm512_set1_epi8(6), b1 = _mm512_set1_epi8(7), b2 = _mm512_set1_epi8(8), b3 = _mm512_set1_epi8(9);
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
            c9 = c0, c10 = c0, c11 = c0;
    for (int64_t i = 0; i < iterations / 3; ++i) {
        c0 = madd_step<Vnni>(c0, a0, b0);
        c1 = madd_step<Vnni>(c1, a0, b1);
        c2 = madd_step<Vnni>(c2, a0, b2);
        c3 = madd_step<Vnni>(c3, a0, b3);
        c4 = madd_step<Vnni>(c4, a1, b0);
        c5 = madd_step<Vnni>(c5, a1, b1);
        c6 = madd_step<Vnni>(c6, a1, b2);
        c7 = madd_step<Vnni>(c7, a1, b3);
        c8 = madd_step<Vnni>(c8, a2, b0);
        c9 = madd_step<Vnni>(c9, a2, b1);
        c10 = madd_step<Vnni>(c10, a2, b2);
        c11 = madd_step<Vnni>(c11, a2, b3);
#if !defined(COLIBRI_AVX512_EMULATED)
        // the inputs must be read every time; the accumulators stay in registers
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3));
        __asm__ volatile(""
                         : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7), "+v"(c8),
                           "+v"(c9), "+v"(c10), "+v"(c11));
#endif
    }
    const __m512i s =
        _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                         _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)),
                                          _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11))));
    return static_cast<uint64_t>(_mm256_extract_epi32(_mm512_castsi512_si256(s), 0));
}

// --- Interleaved K-quants, two groups per register ([group a: rows 0-7 | group b: rows
// 0-7]) for prefill's tiles; each row's arithmetic is kquant_tiles_x86.h's, so results are
// bit-identical to the 256-bit tiles. (Decode keeps the 256-bit streams: it waits on memory.)

inline __m512i shr32(__m512i v, int k) { return _mm512_srl_epi32(v, _mm_cvtsi32_si128(k)); }

// Each 16-bit lane shifted left by k (k < 0: right by -k).
inline __m512i shift16(__m512i v, int k) {
    return k >= 0 ? _mm512_sll_epi16(v, _mm_cvtsi32_si128(k)) : _mm512_srl_epi16(v, _mm_cvtsi32_si128(-k));
}

// Sub-block j's 6-bit scales and mins of both groups' rows (format::k_scale_min).
template <class Block>
inline void kx8_pair_scale_min(const Block& a, const Block& b, int j, __m512i& sc, __m512i& m) {
    const __m512i w0 = two_rows(a.scales[0], b.scales[0]), w1 = two_rows(a.scales[1], b.scales[1]);
    const __m512i six = _mm512_set1_epi32(63), four = _mm512_set1_epi32(15), two = _mm512_set1_epi32(3);
    if (j < 4) {
        sc = _mm512_and_si512(shr32(w0, 8 * j), six);
        m = _mm512_and_si512(shr32(w1, 8 * j), six);
    } else {
        const int k = 8 * (j - 4);
        const __m512i w2 = two_rows(a.scales[2], b.scales[2]);
        sc = _mm512_or_si512(_mm512_and_si512(shr32(w2, k), four),
                             _mm512_slli_epi32(_mm512_and_si512(shr32(w0, k + 6), two), 4));
        m = _mm512_or_si512(_mm512_and_si512(shr32(w2, k + 4), four),
                            _mm512_slli_epi32(_mm512_and_si512(shr32(w1, k + 6), two), 4));
    }
}

// Scale k of both groups' q6_k rows as int32.
inline __m512i q6_kx8_pair_scale(const format::block_q6_kx8& a, const format::block_q6_kx8& b, int k) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales[k])))),
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales[k]))), 1);
}

// Group a against xs[t] and group b against xb[t] (OwnX; else xs[t] too), quantize_x_k's
// activations: acc[t] += each row's dot_k step, as kquant_tiles_x86.h's q45_kx8_block.
template <class Block, int T, bool Vnni, bool OwnX = false>
inline void q45_kx8_pair(const Block& a, const Block& b, const block_q8_x* const xs[T], __m512 acc[T],
                         const block_q8_x* const xb[T] = nullptr) {
    constexpr bool five = std::is_same_v<Block, format::block_q5_kx8>;
    const __m512i low = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
    const __m512 d = scales16(a.d, b.d);
    __m512 f[T];  // the chain of each row's sub-block sums times its d sc
    __m512i m[4]; // the mins of sub-blocks 2c and 2c + 1 as an int16 pair
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) f[t] = _mm512_setzero_ps();
    COLIBRI_UNROLL
    for (int c = 0; c < 4; ++c) { // sub-blocks 2c (low nibbles) and 2c + 1 (high)
        __m512i s[T][2];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) s[t][0] = s[t][1] = _mm512_setzero_si512();
        COLIBRI_UNROLL
        for (int i = 0; i < 8; ++i) {
            const __m512i v = two_rows(a.qs[c][i], b.qs[c][i]);
            __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            if constexpr (five) { // bit j of qh into bit 4 of sub-block j's values
                const __m512i h = two_rows(a.qh[i], b.qh[i]);
                lo = _mm512_or_si512(lo, _mm512_and_si512(shift16(h, 4 - 2 * c), bit4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(shift16(h, 3 - 2 * c), bit4));
            }
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) {
                COLIBRI_UNROLL
                for (int e = 0; e < 2; ++e) {
                    const int8_t* q = xs[t][2 * c + e].qs + 4 * i;
                    const __m512i x = OwnX ? x4_halves(q, xb[t][2 * c + e].qs + 4 * i) : x4_all_lanes512(q);
                    s[t][e] = dot4<Vnni>(s[t][e], e == 0 ? lo : hi, x);
                }
            }
        }
        __m512i mc[2];
        COLIBRI_UNROLL
        for (int e = 0; e < 2; ++e) {
            __m512i sc;
            kx8_pair_scale_min(a, b, 2 * c + e, sc, mc[e]);
            const __m512 dsc = _mm512_mul_ps(d, to_ps(sc));
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) f[t] = _mm512_fmadd_ps(dsc, to_ps(s[t][e]), f[t]);
        }
        m[c] = _mm512_or_si512(mc[0], _mm512_slli_epi32(mc[1], 16));
    }
    // the mins (< 64) times the blocks' sums, two sub-blocks a product (set_sum_pairs)
    const __m512 dmin = scales16(a.dmin, b.dmin);
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m512i mins = _mm512_setzero_si512();
        COLIBRI_UNROLL
        for (int c = 0; c < 4; ++c) {
            const __m512i sum = OwnX ? halves_epi32(xs[t][2 * c].sum_pair, xb[t][2 * c].sum_pair)
                                     : _mm512_set1_epi32(xs[t][2 * c].sum_pair);
            if constexpr (Vnni) mins = _mm512_dpwssd_epi32(mins, m[c], sum);
            else mins = _mm512_add_epi32(mins, _mm512_madd_epi16(m[c], sum));
        }
        f[t] = _mm512_fnmadd_ps(dmin, to_ps(mins), f[t]);
        const __m512 xd =
            OwnX ? combine(_mm256_set1_ps(xs[t][0].d), _mm256_set1_ps(xb[t][0].d)) : _mm512_set1_ps(xs[t][0].d);
        acc[t] = _mm512_fmadd_ps(xd, f[t], acc[t]);
    }
}

// q6_kx8: the unsigned values q (0..63), each half sub-block's sum starting at q6_bias. One
// sub-block at a time (2T integer sums in registers), added in the 256-bit tile's order.
template <int T, bool Vnni>
inline void q6_kx8_pair(const format::block_q6_kx8& a, const format::block_q6_kx8& b, const block_q8_x* const xs[T],
                        __m512 acc[T]) {
    const __m512i low = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    const __m512 d = scales16(a.d, b.d);
    __m512 half[2][T], pe[2][T], first[T]; // half h: (p4h + p4h+1) + (p4h+2 + p4h+3), as pe[0] + pe[1]
    COLIBRI_UNROLL
    for (int h = 0; h < 2; ++h) {
        COLIBRI_UNROLL
        for (int e = 0; e < 2; ++e) { // low nibbles (sub-blocks 4h, 4h + 1), then high (4h + 2, 4h + 3)
            COLIBRI_UNROLL
            for (int c = 0; c < 2; ++c) {
                const int j = 4 * h + c + 2 * e;
                __m512i s[T][2]; // token, half (elements 0-15, 16-31)
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) {
                    COLIBRI_UNROLL
                    for (int hf = 0; hf < 2; ++hf) s[t][hf] = _mm512_set1_epi32(q6_bias(xs[t][j], hf));
                }
                COLIBRI_UNROLL
                for (int i = 0; i < 8; ++i) {
                    const __m512i v = two_rows(a.ql[h][c][i], b.ql[h][c][i]);
                    const __m512i vh = two_rows(a.qh[h][i], b.qh[h][i]);
                    const __m512i q = e == 0 ? _mm512_or_si512(_mm512_and_si512(v, low),
                                                               _mm512_and_si512(shift16(vh, 4 - 2 * c), bits45))
                                             : _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                                                               _mm512_and_si512(shift16(vh, -2 * c), bits45));
                    COLIBRI_UNROLL
                    for (int t = 0; t < T; ++t)
                        s[t][i / 4] = dot4<Vnni>(s[t][i / 4], q, x4_all_lanes512(xs[t][j].qs + 4 * i));
                }
                const __m512i sc0 = q6_kx8_pair_scale(a, b, 2 * j), sc1 = q6_kx8_pair_scale(a, b, 2 * j + 1);
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) {
                    const __m512i sum =
                        _mm512_add_epi32(_mm512_mullo_epi32(s[t][0], sc0), _mm512_mullo_epi32(s[t][1], sc1));
                    const __m512 p = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(xs[t][j].d)), to_ps(sum));
                    if (c == 0) first[t] = p;
                    else pe[e][t] = _mm512_add_ps(first[t], p);
                }
            }
        }
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) half[h][t] = _mm512_add_ps(pe[0][t], pe[1][t]);
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(half[0][t], half[1][t]));
}

// iq4_xsx8 with quantize_x_k's activations, as q45_kx8_pair without mins (VNNI only: the
// values enter vpdpbusd as iq4 + 128, less 128 * sum(x); without VNNI maddubs would saturate
// on them, and the 256-bit tiles serve).
template <int T>
inline void iq4_xsx8_pair(const format::block_iq4_xsx8& a, const format::block_iq4_xsx8& b,
                          const block_q8_x* const xs[T], __m512 acc[T]) {
    const __m128i t16 =
        _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(format::iq4_values)), _mm_set1_epi8(-128));
    const __m512i table = _mm512_broadcast_i32x4(t16), low = _mm512_set1_epi8(0x0F);
    const __m512 d = scales16(a.d, b.d);
    const __m512i sl = two_rows(a.scales_l, b.scales_l);
    const __m512i sh = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.scales_h)))),
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales_h))), 1);
    __m512 f[T]; // the chain of each row's sub-block sums times its d ls
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) f[t] = _mm512_setzero_ps();
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) {
        __m512i s[T];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) s[t] = _mm512_set1_epi32(-128 * xs[t][j].sum);
        COLIBRI_UNROLL
        for (int k = 0; k < 4; ++k) {
            const __m512i v = two_rows(a.qs[j][k], b.qs[j][k]);
            const __m512i w[2] = {_mm512_shuffle_epi8(table, _mm512_and_si512(v, low)),
                                  _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low))};
            COLIBRI_UNROLL
            for (int e = 0; e < 2; ++e) { // elements 4k.. (low nibbles) and 16 + 4k.. (high)
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t)
                    s[t] = dot4<true>(s[t], w[e], x4_all_lanes512(xs[t][j].qs + 16 * e + 4 * k));
            }
        }
        const __m512i ls = _mm512_sub_epi32(
            _mm512_or_si512(_mm512_and_si512(shr32(sl, 4 * j), _mm512_set1_epi32(15)),
                            _mm512_slli_epi32(_mm512_and_si512(shr32(sh, 2 * j), _mm512_set1_epi32(3)), 4)),
            _mm512_set1_epi32(32));
        const __m512 dls = _mm512_mul_ps(d, to_ps(ls));
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) f[t] = _mm512_fmadd_ps(dls, to_ps(s[t]), f[t]);
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xs[t][0].d), f[t], acc[t]);
}

// q2_kx8 / q3_kx8 as kquant_tiles_x86.h's q23_kx8_block, both groups at once.
template <class Block, int T, bool Vnni>
inline void q23_kx8_pair(const Block& a, const Block& b, const block_q8_x* const xs[T], __m512 acc[T]) {
    constexpr bool three = std::is_same_v<Block, format::block_q3_kx8>;
    const __m512i two_bits = _mm512_set1_epi8(3), bit2 = _mm512_set1_epi8(4);
    const __m512 d = scales16(a.d, b.d);
    __m512 first[T], pair[2][T], lo[T]; // sum8's tree: ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
    COLIBRI_UNROLL
    for (int blk = 0; blk < 8; ++blk) {
        const int h = blk / 4, j = blk % 4;
        __m512i s[T][2]; // token, half (elements 0-15, 16-31)
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            COLIBRI_UNROLL
            for (int half = 0; half < 2; ++half)
                s[t][half] = three ? _mm512_set1_epi32(-4 * x_half_sum(xs[t][blk], half)) : _mm512_setzero_si512();
        }
        COLIBRI_UNROLL
        for (int i = 0; i < 8; ++i) {
            __m512i q = _mm512_and_si512(shift16(two_rows(a.qs[h][i], b.qs[h][i]), -2 * j), two_bits);
            if constexpr (three)
                q = _mm512_or_si512(q, _mm512_and_si512(shift16(two_rows(a.hmask[i], b.hmask[i]), 2 - blk), bit2));
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t)
                s[t][i / 4] = dot4<Vnni>(s[t][i / 4], q, x4_all_lanes512(xs[t][blk].qs + 4 * i));
        }
        __m512i sc[2], m[2];
        COLIBRI_UNROLL
        for (int half = 0; half < 2; ++half) {
            const int k = 2 * blk + half;
            if constexpr (three) {
                sc[half] =
                    _mm512_inserti64x4(_mm512_castsi256_si512(q3_kx8_scale(a.scales, k)), q3_kx8_scale(b.scales, k), 1);
            } else {
                const __m512i v = _mm512_inserti64x4(
                    _mm512_castsi256_si512(
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales[k])))),
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales[k]))), 1);
                sc[half] = _mm512_and_si512(v, _mm512_set1_epi32(15));
                m[half] = _mm512_srli_epi32(v, 4);
            }
        }
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            const __m512 xd = _mm512_set1_ps(xs[t][blk].d);
            const __m512i sum =
                _mm512_add_epi32(_mm512_mullo_epi32(s[t][0], sc[0]), _mm512_mullo_epi32(s[t][1], sc[1]));
            __m512 p = _mm512_mul_ps(_mm512_mul_ps(d, xd), to_ps(sum));
            if constexpr (!three) {
                const __m512i mins =
                    _mm512_add_epi32(_mm512_mullo_epi32(_mm512_set1_epi32(x_half_sum(xs[t][blk], 0)), m[0]),
                                     _mm512_mullo_epi32(_mm512_set1_epi32(x_half_sum(xs[t][blk], 1)), m[1]));
                p = _mm512_fnmadd_ps(_mm512_mul_ps(scales16(a.dmin, b.dmin), xd), to_ps(mins), p);
            }
            if (blk % 2 == 0) first[t] = p;
            else pair[blk / 2 % 2][t] = _mm512_add_ps(first[t], p);
            if (blk == 3) lo[t] = _mm512_add_ps(pair[0][t], pair[1][t]);
            if (blk == 7) acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(lo[t], _mm512_add_ps(pair[0][t], pair[1][t])));
        }
    }
}

// The interleaved 32-element types (q4_1x8, q5_0x8, q5_1x8, iq4_nlx8; VNNI only, as for
// iq4_xsx8) as kquant_tiles_x86.h's b32x8_column, both groups at once.

// fifth_bits4 on both groups' words.
inline __m512i fifth_bits4_pair(__m512i w, int i) {
    const __m512i b = _mm512_shuffle_epi8(shr32(w, i), _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0));
    const __m512i bit = _mm512_set1_epi32(0x08040201);
    return _mm512_maskz_mov_epi8(_mm512_cmpeq_epi8_mask(_mm512_and_si512(b, bit), bit), _mm512_set1_epi8(0x10));
}

// One block column of groups a and b against T tokens: p[t] = each row's scaled sum.
template <class Block, int T>
inline void b32x8_pair_column(const Block& a, const Block& b, const block_q8_x* const xb[T], __m512 p[T]) {
    constexpr bool iq4 = std::is_same_v<Block, format::block_iq4_nlx8>;
    constexpr bool five = std::is_same_v<Block, format::block_q5_0x8> || std::is_same_v<Block, format::block_q5_1x8>;
    constexpr bool min = std::is_same_v<Block, format::block_q4_1x8> || std::is_same_v<Block, format::block_q5_1x8>;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i table = _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(format::iq4_values)), _mm_set1_epi8(-128)));
    __m512i s[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) s[t] = iq4 ? _mm512_set1_epi32(-128 * xb[t]->sum) : _mm512_setzero_si512();
    COLIBRI_UNROLL
    for (int k = 0; k < 4; ++k) {
        const __m512i v = two_rows(a.qs[k], b.qs[k]);
        __m512i w[2] = {_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low)};
        if constexpr (five) {
            const __m512i h = two_rows(a.qh, b.qh);
            w[0] = _mm512_or_si512(w[0], fifth_bits4_pair(h, 4 * k));
            w[1] = _mm512_or_si512(w[1], fifth_bits4_pair(h, 16 + 4 * k));
        }
        if constexpr (iq4) {
            for (__m512i& e : w) e = _mm512_shuffle_epi8(table, e);
        }
        COLIBRI_UNROLL
        for (int e = 0; e < 2; ++e) { // elements 4k.. (low nibbles) and 16 + 4k.. (high)
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) s[t] = dot4<true>(s[t], w[e], x4_all_lanes512(xb[t]->qs + 16 * e + 4 * k));
        }
    }
    const __m512 d = scales16(a.d, b.d);
    __m512 m = _mm512_setzero_ps();
    if constexpr (min) m = scales16(a.m, b.m);
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m512i sum = s[t];
        if constexpr (std::is_same_v<Block, format::block_q5_0x8>)
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(16 * xb[t]->sum)); // q - 16
        const __m512 xd = _mm512_set1_ps(xb[t]->d);
        p[t] = _mm512_mul_ps(_mm512_mul_ps(d, xd), to_ps(sum));
        if constexpr (min) p[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(xb[t]->dsum), p[t]);
    }
}

// Groups a and b (b may be a) by T tokens, eight block columns at a time in sum8's tree (a
// short last eight padded with zeros), as b32x8_walk: out as kx8_pair_walk's.
template <class Block, int T>
void b32x8_pair_walk(const Block* a, const Block* b, bool both, const block_q8_x* x, size_t x_stride, int64_t n,
                     bool once, float* out, size_t out_stride) {
    __m512 acc[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const int64_t nb = n / format::qk;
    for (int64_t g = 0; g < nb; g += 8) {
        __m512 first[T], pair[2][T], lo[T]; // ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j) {
            __m512 p[T];
            if (g + j < nb) {
                prefetch_x8_block(a[g + j], once);
                if (both) prefetch_x8_block(b[g + j], once);
                const block_q8_x* xb[T];
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) xb[t] = x + size_t(t) * x_stride + size_t(g + j);
                b32x8_pair_column<Block, T>(a[g + j], b[g + j], xb, p);
            } else {
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) p[t] = _mm512_setzero_ps();
            }
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) {
                if (j % 2 == 0) first[t] = p[t];
                else pair[j / 2 % 2][t] = _mm512_add_ps(first[t], p[t]);
                if (j == 3) lo[t] = _mm512_add_ps(pair[0][t], pair[1][t]);
                if (j == 7) acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(lo[t], _mm512_add_ps(pair[0][t], pair[1][t])));
            }
        }
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        if (both) _mm512_storeu_ps(out + size_t(t) * out_stride, acc[t]);
        else _mm256_storeu_ps(out + size_t(t) * out_stride, _mm512_castps512_ps256(acc[t]));
    }
}

// Groups a and b (b may be a) by T tokens: out[t * out_stride + 8 g + r], g 0 for a and 1
// for b (only a's when `both` is false); once: x8_tile_fn's.
template <class Block, int T, bool Vnni>
void kx8_pair_walk(const Block* a, const Block* b, bool both, const block_q8_x* x, size_t x_stride, int64_t n,
                   bool once, float* out, size_t out_stride) {
    __m512 acc[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        prefetch_x8_block(a[s], once);
        if (both) prefetch_x8_block(b[s], once);
        const block_q8_x* xs[T];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) xs[t] = x + size_t(t) * x_stride + size_t(8 * s);
        if constexpr (std::is_same_v<Block, format::block_q6_kx8>) q6_kx8_pair<T, Vnni>(a[s], b[s], xs, acc);
        else if constexpr (std::is_same_v<Block, format::block_iq4_xsx8>) iq4_xsx8_pair<T>(a[s], b[s], xs, acc);
        else if constexpr (std::is_same_v<Block, format::block_q2_kx8> || std::is_same_v<Block, format::block_q3_kx8>)
            q23_kx8_pair<Block, T, Vnni>(a[s], b[s], xs, acc);
        else q45_kx8_pair<Block, T, Vnni>(a[s], b[s], xs, acc);
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        if (both) _mm512_storeu_ps(out + size_t(t) * out_stride, acc[t]);
        else _mm256_storeu_ps(out + size_t(t) * out_stride, _mm512_castps512_ps256(acc[t]));
    }
}

// Groups a and b by T tokens, walked by their type's pair walk.
template <class Block, int T, bool Vnni>
void pair_walk(const Block* a, const Block* b, bool both, const block_q8_x* x, size_t x_stride, int64_t n, bool once,
               float* out, size_t out_stride) {
    if constexpr (b32x8_block<Block>) b32x8_pair_walk<Block, T>(a, b, both, x, x_stride, n, once, out, out_stride);
    else kx8_pair_walk<Block, T, Vnni>(a, b, both, x, x_stride, n, once, out, out_stride);
}

#if defined(COLIBRI_AVX512_EMULATED)
// On SIMDe each walk takes minutes to compile: the tests' build takes five to seven tokens
// as a walk of four and one of the rest (each token's sums are the same either way).
template <class Block, int T, bool Vnni>
void token_walk(const Block* a, const Block* b, bool both, const block_q8_x* x, size_t x_stride, int64_t n, bool once,
                float* out, size_t out_stride) {
    if constexpr (T > 4 && T < 8) {
        pair_walk<Block, 4, Vnni>(a, b, both, x, x_stride, n, once, out, out_stride);
        pair_walk<Block, T - 4, Vnni>(a, b, both, x + 4 * x_stride, x_stride, n, once, out + 4 * out_stride,
                                      out_stride);
    } else {
        pair_walk<Block, T, Vnni>(a, b, both, x, x_stride, n, once, out, out_stride);
    }
}
#else
template <class Block, int T, bool Vnni>
constexpr auto token_walk = pair_walk<Block, T, Vnni>;
#endif

// The interleaved tiles but q4_0x8's and q8_0x8's (tile_q4_kx8 ... tile_iq4_nlx8): groups
// two by two (the last of an odd count with itself, half of it kept), all the tokens (1..8)
// in one walk, which unpacks the weights once for them all.
template <class Block, bool Vnni>
void tile_kx8_pairs(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride, int n_tok,
                    int64_t n, bool once, float* out) {
    using walk_fn =
        void (*)(const Block*, const Block*, bool, const block_q8_x*, size_t, int64_t, bool, float*, size_t);
    static constexpr walk_fn walks[8] = {
        token_walk<Block, 1, Vnni>, token_walk<Block, 2, Vnni>, token_walk<Block, 3, Vnni>, token_walk<Block, 4, Vnni>,
        token_walk<Block, 5, Vnni>, token_walk<Block, 6, Vnni>, token_walk<Block, 7, Vnni>, token_walk<Block, 8, Vnni>};
    const walk_fn walk = walks[clamp_int(n_tok, 1, 8) - 1];
    const auto group = [&](int g) {
        return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(groups) + size_t(g) * stride);
    };
    for (int g = 0; g < n_groups; g += 2) {
        const bool both = g + 1 < n_groups;
        walk(group(g), both ? group(g + 1) : group(g), both, x, x_stride, n, once, out + size_t(g) * 8,
             size_t(n_groups) * 8);
    }
}

// streams_q4_kx8 / streams_q5_kx8: the four groups as two pairs, each group with its own
// activations (OwnX) or all with the same ones (decode's gate and up products).
template <class Block, bool Vnni, bool OwnX>
void kx8_pair_streams_walk(const Block* const w[4], const block_q8_x* const x[4], int64_t n, float* out) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        COLIBRI_UNROLL
        for (int p = 0; p < 2; ++p) {
            prefetch_x8_block(w[2 * p][s], true);
            prefetch_x8_block(w[2 * p + 1][s], true);
            const block_q8_x* xa[1] = {x[2 * p] + size_t(8 * s)};
            const block_q8_x* xb[1] = {x[2 * p + 1] + size_t(8 * s)};
            q45_kx8_pair<Block, 1, Vnni, OwnX>(w[2 * p][s], w[2 * p + 1][s], xa, &acc[p], xb);
        }
    }
    _mm512_storeu_ps(out, acc[0]);
    _mm512_storeu_ps(out + 16, acc[1]);
}

template <class Block, bool Vnni>
void streams_kx8_pairs(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    const Block* w[4];
    COLIBRI_UNROLL
    for (int g = 0; g < 4; ++g) w[g] = static_cast<const Block*>(groups[g]);
    if (x[1] == x[0] && x[2] == x[0] && x[3] == x[0]) kx8_pair_streams_walk<Block, Vnni, false>(w, x, n, out);
    else kx8_pair_streams_walk<Block, Vnni, true>(w, x, n, out);
}

template <bool Vnni>
kernel_table make_table(const kernel_table& avx2) {
    kernel_table k = avx2;
#if defined(COLIBRI_AVX512_EMULATED)
    k.name = Vnni ? "avx512-vnni (SIMDe)" : "avx512 (SIMDe)";
#else
    k.name = Vnni ? "avx512-vnni" : "avx512";
#endif
    k.tile_q8_0 = dispatch_tile<q8_0_tiles<Vnni>>;
    k.tile_q4_0 = dispatch_tile<q4_0_tiles<Vnni>>;
    if constexpr (Vnni) { // else the AVX2 ones
        k.tile_q4_k = tile_k<format::block_q4_k, true>;
        k.tile_q5_k = tile_k<format::block_q5_k, true>;
        k.tile_q6_k = tile_k<format::block_q6_k, true>;
        k.tile_q4_1 = tile_b32<format::block_q4_1, true>;
        k.tile_q5_0 = tile_b32<format::block_q5_0, true>;
        k.tile_q5_1 = tile_b32<format::block_q5_1, true>;
        k.tile_iq4_nl = tile_b32<format::block_iq4_nl, true>;
        k.tile_iq4_xs = tile_k<format::block_iq4_xs, true>;
        k.tile_q2_k = tile_k<format::block_q2_k, true>;
        k.tile_q3_k = tile_k<format::block_q3_k, true>;
        k.tile_q4_kx8 = tile_kx8_pairs<format::block_q4_kx8, true>;
        k.tile_q5_kx8 = tile_kx8_pairs<format::block_q5_kx8, true>;
        k.tile_q6_kx8 = tile_kx8_pairs<format::block_q6_kx8, true>;
        k.streams_q4_kx8 = streams_kx8_pairs<format::block_q4_kx8, true>;
        k.streams_q5_kx8 = streams_kx8_pairs<format::block_q5_kx8, true>;
        k.streams_q6_kx8 = streams_kx8<format::block_q6_kx8, true>; // as pairs no faster
        k.tile_iq4_xsx8 = tile_kx8_pairs<format::block_iq4_xsx8, true>;
        k.streams_iq4_xsx8 = streams_kx8<format::block_iq4_xsx8, true>;
        k.tile_q2_kx8 = tile_kx8_pairs<format::block_q2_kx8, true>;
        k.tile_q3_kx8 = tile_kx8_pairs<format::block_q3_kx8, true>;
        k.streams_q2_kx8 = streams_kx8<format::block_q2_kx8, true>;
        k.streams_q3_kx8 = streams_kx8<format::block_q3_kx8, true>;
        k.tile_q4_1x8 = tile_kx8_pairs<format::block_q4_1x8, true>;
        k.tile_q5_0x8 = tile_kx8_pairs<format::block_q5_0x8, true>;
        k.tile_q5_1x8 = tile_kx8_pairs<format::block_q5_1x8, true>;
        k.tile_iq4_nlx8 = tile_kx8_pairs<format::block_iq4_nlx8, true>;
        k.streams_q4_1x8 = streams_b32x8<format::block_q4_1x8, true>;
        k.streams_q5_0x8 = streams_b32x8<format::block_q5_0x8, true>;
        k.streams_q5_1x8 = streams_b32x8<format::block_q5_1x8, true>;
        k.streams_iq4_nlx8 = streams_b32x8<format::block_iq4_nlx8, true>;
        k.tile_q4_0x8 = dispatch_x8_pairs<q4_0x8_pair_ops>;
        k.tile_q8_0x8 = dispatch_x8_pairs<q8_0x8_pair_ops>;
        k.streams_q4_0x8 = x8_pair_streams<q4_0x8_pair_ops>;
        k.streams_q8_0x8 = x8_pair_streams<q8_0x8_pair_ops>;
    }
    k.attend = attend512<float>;
    k.attend_f16 = attend512<uint16_t>;
    k.madd_loop = madd_loop<Vnni>;
    return k;
}

// The tables; nullptr when there is no AVX2 table to complete them.
const kernel_table* table(bool vnni) {
    const kernel_table* avx2 = avx2_kernel_table();
    if (avx2 == nullptr) return nullptr;
    static const kernel_table tables[2] = {make_table<false>(*avx2), make_table<true>(*avx2)};
    return &tables[vnni ? 1 : 0];
}

} // namespace

#if defined(COLIBRI_AVX512_EMULATED)
const kernel_table* emulated_avx512_kernel_table(bool vnni) { return table(vnni); }
#else
namespace {
bool has_avx512() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}
} // namespace

const kernel_table* avx512_kernel_table() {
    return has_avx512() ? table(__builtin_cpu_supports("avx512vnni")) : nullptr;
}

const kernel_table* avx512_no_vnni_kernel_table() {
    return has_avx512() && __builtin_cpu_supports("avx512vnni") ? table(false) : nullptr;
}
#endif

} // namespace colibri

#elif !defined(COLIBRI_AVX512_EMULATED)

namespace colibri {
const kernel_table* avx512_kernel_table() { return nullptr; }
const kernel_table* avx512_no_vnni_kernel_table() { return nullptr; }
} // namespace colibri

#endif
