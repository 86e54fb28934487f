// AVX2 + FMA + F16C row kernels. This file alone is compiled with those instruction sets;
// it is only called after the CPU reported them.

#include "cpu/kernel_table.h"
#include "cpu/kernels.h"
#include "cpu/kquant_tiles_x86.h"
#include "cpu/simd_x86.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <cstring>
#include <immintrin.h>
#include <type_traits>

// No inline function or template from another header (std::min, std::fill_n, ...) is used
// here: compiled with AVX2 in this file, the linker could pick that copy for the whole
// program (an ODR trap on older CPUs). Helpers below have internal linkage.

namespace colibri {

using format::block_q4_0;
using format::block_q8_0;
using format::qk;

namespace {

inline float f16(uint16_t h) { return _cvtsh_ss(h); }
inline float bf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline int min_int(int a, int b) { return a < b ? a : b; }

// The largest |x| of 32 values.
float block_abs_max(const float* xb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * j)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// One block of 32 values with the scale of values up to amax.
void quantize_block(const float* xb, float amax, block_q8_x& out) {
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out.d = d;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) {
        i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * j), mul),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // the sums of the first 16 values and of all 32, then pack 32 int32 -> 32 int8 and
    // undo the lane interleaving of the packs
    const auto hsum = [](__m256i s) {
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        return _mm_cvtsi128_si32(s4);
    };
    out.sum_lo = hsum(_mm256_add_epi32(i[0], i[1]));
    out.sum = out.sum_lo + hsum(_mm256_add_epi32(i[2], i[3]));
    out.dsum = d * static_cast<float>(out.sum);
    __m256i p01 = _mm256_packs_epi32(i[0], i[1]);
    __m256i p23 = _mm256_packs_epi32(i[2], i[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs), p);
}

void quantize_x(const float* x, block_q8_x* out, int64_t n) {
    for (int64_t ib = 0; ib < n / qk; ++ib) quantize_block(x + ib * qk, block_abs_max(x + ib * qk), out[ib]);
}

void quantize_x_k(const float* x, block_q8_x* out, int64_t n) {
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        const float* xs = x + s * format::qk_k;
        float amax = 0.0f;
        for (int j = 0; j < 8; ++j) {
            const float a = block_abs_max(xs + j * qk);
            amax = amax < a ? a : amax;
        }
        for (int j = 0; j < 8; ++j) quantize_block(xs + j * qk, amax, out[8 * s + j]);
        set_sum_pairs(out + 8 * s);
    }
}

// q8_0: per block and row, |w| and the activations with w's sign go through maddubs (no
// saturation: |w| <= 127, |x| <= 127), then pairs of int16 are summed to int32 lanes.
template <int T>
void tile_q8_0_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    const block_q8_0* w[4];
    row_pointers(rows, stride, w);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        __m256i a[4], abs[4];
        for (int r = 0; r < 4; ++r) {
            _mm_prefetch(reinterpret_cast<const char*>(&w[r][ib]) + prefetch_bytes, _MM_HINT_T0);
            a[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][ib].qs));
            abs[r] = _mm256_sign_epi8(a[r], a[r]);
        }
        const __m256 dw = q8_0_scales(w, ib);
        for (int t = 0; t < T; ++t) {
            const block_q8_x& xb = x[size_t(t) * x_stride + size_t(ib)];
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
            __m256i s[4];
            for (int r = 0; r < 4; ++r)
                s[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(abs[r], _mm256_sign_epi8(xv, a[r])), ones);
            acc[t] = q8_0_accumulate(dw, half_sums4(s), xb, acc[t]);
        }
    }
    store_tile<T>(acc, out);
}

// q4_0: two blocks at once, one per 128-bit half. The nibbles (0..15) are the unsigned
// side of maddubs; the -8 offset is taken off the exact sums as 8 * sum(x). Pair: blocks
// ib and ib + 1; otherwise block ib alone in the low half (an odd last block).
template <int T, bool Pair>
inline void q4_0_step(const block_q4_0* const w[4], const block_q8_x* x, size_t x_stride, int64_t ib, __m256 acc[T]) {
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
    __m256i lo[4], hi[4];
    for (int r = 0; r < 4; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(&w[r][ib]) + prefetch_bytes, _MM_HINT_T0);
        const __m256i q = q4_0_nibbles<Pair>(w[r], ib);
        lo[r] = _mm256_and_si256(q, low);                       // elements 0-15 of both blocks
        hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low); // elements 16-31
    }
    const __m256 dw = q4_0_scales<Pair>(w, ib);
    for (int t = 0; t < T; ++t) {
        const block_q8_x* xt = x + size_t(t) * x_stride + size_t(ib);
        const __m256i xa = q4_0_x_half<Pair>(xt, 0), xb = q4_0_x_half<Pair>(xt, 1);
        __m256i s[4];
        for (int r = 0; r < 4; ++r) {
            // each maddubs pair sum is at most 2 * 15 * 127: two of them fit in int16
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], xa), _mm256_maddubs_epi16(hi[r], xb));
            s[r] = _mm256_madd_epi16(p, ones);
        }
        acc[t] = q4_0_accumulate<Pair>(dw, half_sums4(s), xt, acc[t]);
    }
}

template <int T>
void tile_q4_0_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    q4_0_tile<T>(rows, stride, n, out, [&](auto pair, const block_q4_0* const w[4], int64_t ib, __m256 acc[T]) {
        q4_0_step<T, pair.value>(w, x, x_stride, ib, acc);
    });
}

// The interleaved tiles' two steps for q4_0x8: each block's nibbles unpacked once for
// every token (lo: elements 4k..4k+3, hi: 16 + 4k..); per token, eight maddubs of them with
// broadcast activation bytes, summed in int16 (each maddubs pair sum is at most
// 2 * 15 * 127: eight of them fit), one madd to int32, less the -8 offsets (8 * sum(x)).
struct q4_0x8_ops {
    using block = format::block_q4_0x8;
    struct weights {
        __m256i lo[4], hi[4];
    };
    static weights load(const block& b) {
        const __m256i low = _mm256_set1_epi8(0x0F);
        weights v;
        for (int k = 0; k < 4; ++k) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[k]));
            v.lo[k] = _mm256_and_si256(q, low);
            v.hi[k] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        }
        return v;
    }
    static __m256i sums(const weights& v, const block&, const block_q8_x& xb) {
        __m256i s = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v.lo[k], x4_all_lanes(xb.qs + 4 * k)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v.hi[k], x4_all_lanes(xb.qs + 16 + 4 * k)));
        }
        return _mm256_sub_epi32(_mm256_madd_epi16(s, _mm256_set1_epi16(1)), _mm256_set1_epi32(8 * xb.sum));
    }
};

// q8_0x8: maddubs takes unsigned bytes, so |w| once per block, and per token the
// activation bytes with w's sign (vpsignb); a pair sum is at most 2 * 128 * 127, so each
// maddubs is widened to int32 (madd) before the next is added.
struct q8_0x8_ops {
    using block = format::block_q8_0x8;
    struct weights {
        __m256i abs[8];
    };
    static weights load(const block& b) {
        weights v;
        for (int k = 0; k < 8; ++k)
            v.abs[k] = _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[k])));
        return v;
    }
    static __m256i sums(const weights& v, const block& b, const block_q8_x& xb) {
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i s = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[k])); // from L1 again
            const __m256i p = _mm256_maddubs_epi16(v.abs[k], _mm256_sign_epi8(x4_all_lanes(xb.qs + 4 * k), w));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
        }
        return s;
    }
};

// An interleaved tile (q4_0x8, q8_0x8): the G groups of eight rows at w by T tokens, token t
// of group g at x[OwnX ? g : 0] + t * x_stride (each group its own activations, or all the
// same ones). Each int32 lane of a 256-bit load holds four bytes of one row (format.h), so
// products with the matching four activation bytes in every lane sum per row without a
// horizontal reduction. Ops supplies the two steps of its type: the block's weights
// prepared once for every token, and the eight rows' exact integer sums with one
// activation block; scaling and adding, block after block, is the same for every type.
// once: x8_tile_fn's.
template <int G, int T, class Ops, bool OwnX>
void x8_walk(const typename Ops::block* const w[G], const block_q8_x* const x[G], size_t x_stride, int64_t n, bool once,
             float* out) {
    static_assert(G * T <= 4);
    using block = typename Ops::block;
    __m256 acc[G * T];
    for (int i = 0; i < G * T; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        for (int g = 0; g < G; ++g) {
            const block& b = w[g][ib];
            prefetch_x8_block(b, once);
            const typename Ops::weights v = Ops::load(b);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
            for (int t = 0; t < T; ++t) {
                const block_q8_x& xb = x[OwnX ? g : 0][size_t(t) * x_stride + size_t(ib)];
                const __m256i s = Ops::sums(v, b, xb);
                acc[t * G + g] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb.d)), _mm256_cvtepi32_ps(s), acc[t * G + g]);
            }
        }
    }
    for (int i = 0; i < G * T; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// G groups `stride` bytes apart, every one with the same T activation vectors.
template <int G, int T, class Ops>
void x8_tile(const void* groups, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, bool once,
             float* out) {
    using block = typename Ops::block;
    const block* w[G];
    for (int g = 0; g < G; ++g) w[g] = reinterpret_cast<const block*>(static_cast<const uint8_t*>(groups) + g * stride);
    x8_walk<G, T, Ops, false>(w, &x, x_stride, n, once, out);
}

// streams_q4_0x8 / streams_q8_0x8: four groups anywhere, each with its own activations;
// decode reads them once (prefetches into L2).
template <class Ops>
void x8_streams(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    using block = typename Ops::block;
    const block* w[4];
    for (int g = 0; g < 4; ++g) w[g] = static_cast<const block*>(groups[g]);
    x8_walk<4, 1, Ops, true>(w, x, 0, n, true, out);
}

// The interleaved tiles for every (groups, tokens) with groups * tokens <= 4, and their
// dispatch over 1-4 groups by 1-8 tokens: larger products one group at a time, by up to
// four tokens (each group's weights prepared once for them).
template <class Ops>
void dispatch_x8(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride, int n_tok,
                 int64_t n, bool once, float* out) {
    using group_tile_fn = void (*)(const void*, size_t, const block_q8_x*, size_t, int64_t, bool, float*);
    // [tokens - 1][groups - 1]
    static constexpr group_tile_fn tiles[4][4] = {
        {x8_tile<1, 1, Ops>, x8_tile<2, 1, Ops>, x8_tile<3, 1, Ops>, x8_tile<4, 1, Ops>},
        {x8_tile<1, 2, Ops>, x8_tile<2, 2, Ops>, nullptr, nullptr},
        {x8_tile<1, 3, Ops>, nullptr, nullptr, nullptr},
        {x8_tile<1, 4, Ops>, nullptr, nullptr, nullptr},
    };
    const int t = clamp_int(n_tok, 1, 8), g = clamp_int(n_groups, 1, 4);
    if (g * t <= 4) {
        tiles[t - 1][g - 1](groups, stride, x, x_stride, n, once, out);
        return;
    }
    float part[32];
    for (int i = 0; i < g; ++i) {
        for (int t0 = 0; t0 < t; t0 += 4) {
            const int nt = clamp_int(t - t0, 1, 4);
            tiles[nt - 1][0](static_cast<const uint8_t*>(groups) + size_t(i) * stride, 0, x + size_t(t0) * x_stride,
                             x_stride, n, once, part);
            for (int k = 0; k < nt; ++k) std::memcpy(out + ((t0 + k) * g + i) * 8, part + k * 8, 8 * sizeof(float));
        }
    }
}

// One instance per token count of the tile.
constexpr tile_fn q8_0_tiles[4] = {tile_q8_0_t<1>, tile_q8_0_t<2>, tile_q8_0_t<3>, tile_q8_0_t<4>};
constexpr tile_fn q4_0_tiles[4] = {tile_q4_0_t<1>, tile_q4_0_t<2>, tile_q4_0_t<3>, tile_q4_0_t<4>};

// 8 int8 -> 8 floats
inline __m256 i8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// One block's 32 weights as four vectors of floats (without the block's scale).
inline void unpack(const block_q8_0& b, __m256 w[4]) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16));
    w[0] = i8_to_ps(lo);
    w[1] = i8_to_ps(_mm_srli_si128(lo, 8));
    w[2] = i8_to_ps(hi);
    w[3] = i8_to_ps(_mm_srli_si128(hi, 8));
}

inline void unpack(const block_q4_0& b, __m256 w[4]) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, low), eight);                    // elements 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), low), eight); // 16..31
    w[0] = i8_to_ps(lo);
    w[1] = i8_to_ps(_mm_srli_si128(lo, 8));
    w[2] = i8_to_ps(hi);
    w[3] = i8_to_ps(_mm_srli_si128(hi, 8));
}

// Unscaled dot of one block's weights with 32 activations. Every f32-activation kernel
// below goes through this one function, so batching never changes a result.
inline __m256 block_sum(const __m256 w[4], const float* xb) {
    __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
    s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), s);
    s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), s);
    return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), s);
}

template <class Block>
float dot_f32_act(const void* row, const float* x, int64_t n) {
    const auto* b = static_cast<const Block*>(row);
    __m256 acc = _mm256_setzero_ps(), w[4];
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        unpack(b[ib], w);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(b[ib].d)), block_sum(w, x + ib * qk), acc);
    }
    return hsum(acc);
}

// Four rows `stride` bytes apart, four independent accumulator chains and memory streams.
template <class Block>
void dot4_f32_act(const void* rows, size_t stride, const float* x, int64_t n, float* out) {
    const Block* b[4];
    for (int i = 0; i < 4; ++i) b[i] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + i * stride);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 w[4];
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        for (int i = 0; i < 4; ++i) {
            _mm_prefetch(reinterpret_cast<const char*>(&b[i][ib]) + prefetch_bytes, _MM_HINT_T0);
            unpack(b[i][ib], w);
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(f16(b[i][ib].d)), block_sum(w, x + ib * qk), acc[i]);
        }
    }
    for (int i = 0; i < 4; ++i) out[i] = hsum(acc[i]);
}

// One row unpacked once per block for four activation vectors.
template <class Block>
void dotx4_f32_act(const void* row, const float* x, size_t x_stride, int64_t n, float* out) {
    const auto* b = static_cast<const Block*>(row);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 w[4];
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        unpack(b[ib], w);
        const __m256 d = _mm256_set1_ps(f16(b[ib].d));
        for (int t = 0; t < 4; ++t) acc[t] = _mm256_fmadd_ps(d, block_sum(w, x + t * x_stride + ib * qk), acc[t]);
    }
    for (int t = 0; t < 4; ++t) out[t] = hsum(acc[t]);
}

// One f32 row with T activation vectors: two chains per vector, the same for every T (so
// four at once give each the bits of one alone), and the row loaded once for all.
template <int T>
void dot_f32_t(const float* row, const float* x, size_t x_stride, int64_t n, float* out) {
    __m256 a0[T], a1[T];
    for (int t = 0; t < T; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 r0 = _mm256_loadu_ps(row + i), r1 = _mm256_loadu_ps(row + i + 8);
        for (int t = 0; t < T; ++t) {
            a0[t] = _mm256_fmadd_ps(r0, _mm256_loadu_ps(x + t * x_stride + i), a0[t]);
            a1[t] = _mm256_fmadd_ps(r1, _mm256_loadu_ps(x + t * x_stride + i + 8), a1[t]);
        }
    }
    for (int t = 0; t < T; ++t) {
        float sum = hsum(_mm256_add_ps(a0[t], a1[t]));
        for (int64_t j = i; j < n; ++j) sum += row[j] * x[t * x_stride + j];
        out[t] = sum;
    }
}

float dot_f32(const float* row, const float* x, int64_t n) {
    float out;
    dot_f32_t<1>(row, x, 0, n, &out);
    return out;
}

// Four rows `stride` floats apart, each with dot_f32's two chains (so each its bits alone):
// four memory streams, each asked for prefetch_bytes ahead.
void dot4_f32(const float* rows, size_t stride, const float* x, int64_t n, float* out) {
    __m256 a0[4], a1[4];
    for (int r = 0; r < 4; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int r = 0; r < 4; ++r) {
            const float* row = rows + r * stride + i;
            _mm_prefetch(reinterpret_cast<const char*>(row) + prefetch_bytes, _MM_HINT_T0);
            a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(row), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(row + 8), x1, a1[r]);
        }
    }
    for (int r = 0; r < 4; ++r) {
        const float* row = rows + r * stride;
        float sum = hsum(_mm256_add_ps(a0[r], a1[r]));
        for (int64_t j = i; j < n; ++j) sum += row[j] * x[j];
        out[r] = sum;
    }
}

// Attention for head dimensions that are a multiple of 8 (the usual 64 and 128 as
// compile-time sizes). Query heads go in pairs, so each key and value is loaded and
// converted once for both: scores four keys at a time, a vectorised softmax, then the
// values summed in registers, four vectors (32 dimensions) per pass over a chunk of keys
// that stays in L1.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// s[h * n + j] = scale * q_h . k_j for H query heads (hd = 8 * nv apart) and n keys: two
// keys from each half at a time, then the odd ones left; v_start (null: none): the values
// whose first rows to ask for in the last steps.
template <int H, int NV, class T>
void attention_scores(const float* q, const T* k, int n, int nv, float scale, float* s, const T* v_start) {
    if constexpr (NV > 0) nv = NV;
    const int hd = 8 * nv, half = attention_half(n), ahead = attention_ahead<T>(hd);
    const __m128 sc = _mm_set1_ps(scale);
    for (int j = 0; j < half; j += 2) {
        const T* key[4];
        score_keys(k, v_start, j, half, hd, ahead, key);
        __m256 acc[H][4];
        for (int h = 0; h < H; ++h) {
            for (int u = 0; u < 4; ++u) acc[h][u] = _mm256_setzero_ps();
        }
        for (int i = 0; i < nv; ++i) {
            __m256 qi[H];
            for (int h = 0; h < H; ++h) qi[h] = _mm256_loadu_ps(q + h * hd + 8 * i);
            for (int u = 0; u < 4; ++u) {
                const __m256 kv = load8(key[u] + 8 * i);
                for (int h = 0; h < H; ++h) acc[h][u] = _mm256_fmadd_ps(qi[h], kv, acc[h][u]);
            }
        }
        for (int h = 0; h < H; ++h) store_scores4(s + h * n, j, half, acc[h], sc);
    }
    for (int j = 2 * half; j < n; ++j) {
        __m256 acc[H];
        for (int h = 0; h < H; ++h) acc[h] = _mm256_setzero_ps();
        for (int i = 0; i < nv; ++i) {
            const __m256 kv = load8(k + j * hd + 8 * i);
            for (int h = 0; h < H; ++h) acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + 8 * i), kv, acc[h]);
        }
        for (int h = 0; h < H; ++h) s[h * n + j] = hsum(acc[h]) * scale;
    }
}

// out_h = sum_j s[h * n + j] v_j for H heads (out rows hd = 8 * nv apart): a key from each
// half at a time into the same sums, in chunks whose values stay in L1 across the passes
// of four vectors (32 dimensions); the odd keys left come last. next_k (null: none): the
// keys whose first rows to ask for in the last steps.
template <int H, int NV, class T>
void attention_values(const float* s, const T* v, int n, int nv, float* out, const T* next_k, int next_n) {
    if constexpr (NV > 0) nv = NV;
    const int hd = 8 * nv, half = attention_half(n), ahead = attention_ahead<T>(hd);
    constexpr int chunk = 32;
    for (int i = 0; i < H * hd; ++i) out[i] = 0.0f;
    // keys [j0, j1) of the first half with their partners half further, or [j0, j1) alone
    const auto pass = [&](int j0, int j1, int partner) {
        for (int i0 = 0; i0 < nv; i0 += 4) {
            const int m = min_int(4, nv - i0);
            __m256 acc[H][4];
            for (int h = 0; h < H; ++h) {
                for (int i = 0; i < m; ++i) acc[h][i] = _mm256_loadu_ps(out + h * hd + 8 * (i0 + i));
            }
            for (int j = j0; j < j1; ++j) {
                const T* va = v + j * hd + 8 * i0;
                __m256 pa[H];
                for (int h = 0; h < H; ++h) pa[h] = _mm256_set1_ps(s[h * n + j]);
                if (partner > 0) {
                    const T* vb = va + partner * hd;
                    if (i0 == 0 && j + ahead < partner) { // on the first pass over the chunk
                        prefetch_rows(v + (j + ahead) * hd, 1, hd);
                        prefetch_rows(v + (j + partner + ahead) * hd, 1, hd);
                    } else if (i0 == 0) {
                        prefetch_next_keys(next_k, next_n, j, partner, hd, ahead);
                    }
                    __m256 pb[H];
                    for (int h = 0; h < H; ++h) pb[h] = _mm256_set1_ps(s[h * n + j + partner]);
                    for (int i = 0; i < m; ++i) {
                        const __m256 a = load8(va + 8 * i), b = load8(vb + 8 * i);
                        for (int h = 0; h < H; ++h)
                            acc[h][i] = _mm256_fmadd_ps(pb[h], b, _mm256_fmadd_ps(pa[h], a, acc[h][i]));
                    }
                } else {
                    for (int i = 0; i < m; ++i) {
                        const __m256 a = load8(va + 8 * i);
                        for (int h = 0; h < H; ++h) acc[h][i] = _mm256_fmadd_ps(pa[h], a, acc[h][i]);
                    }
                }
            }
            for (int h = 0; h < H; ++h) {
                for (int i = 0; i < m; ++i) _mm256_storeu_ps(out + h * hd + 8 * (i0 + i), acc[h][i]);
            }
        }
    };
    for (int j0 = 0; j0 < half; j0 += chunk) pass(j0, min_int(half, j0 + chunk), half);
    pass(2 * half, n, 0);
}

// The last pass over the keys asks for the values' first rows, the last over the values for
// the next keys' (simd_x86.h).
template <int NV, class T>
void attend_t(const float* q, int n_q, const T* k, const T* v, int n, int nv, float scale, float* scores, float* out,
              const T* next_k, int next_n) {
    if constexpr (NV > 0) nv = NV;
    const int hd = 8 * nv;
    int g = 0;
    for (; g + 2 <= n_q; g += 2) {
        attention_scores<2, NV>(q + g * hd, k, n, nv, scale, scores + g * n, g + 2 == n_q ? v : nullptr);
    }
    if (g < n_q) attention_scores<1, NV>(q + g * hd, k, n, nv, scale, scores + g * n, v);
    for (g = 0; g < n_q; ++g) softmax_ps(scores + g * n, n);
    for (g = 0; g + 2 <= n_q; g += 2) {
        const bool last = g + 2 == n_q;
        attention_values<2, NV>(scores + g * n, v, n, nv, out + g * hd, last ? next_k : nullptr, next_n);
    }
    if (g < n_q) attention_values<1, NV>(scores + g * n, v, n, nv, out + g * hd, next_k, next_n);
}

template <class T>
void attend_one(const float* q, int n_q, const T* k, const T* v, int n, int head_dim, float scale, float* scores,
                float* out, const T* next_k, int next_n) {
    switch (head_dim) {
    case 64: attend_t<8>(q, n_q, k, v, n, 8, scale, scores, out, next_k, next_n); return;
    case 128: attend_t<16>(q, n_q, k, v, n, 16, scale, scores, out, next_k, next_n); return;
    default: attend_t<0>(q, n_q, k, v, n, head_dim / 8, scale, scores, out, next_k, next_n); return;
    }
}

template <class T>
void attend(const float* q, int64_t q_stride, int n_q, int n_tok, const T* k, const T* v, const int* n, int head_dim,
            float scale, float* scores, float* out, int64_t out_stride, const T* next_k, int next_n) {
    if (head_dim % 8 != 0) {
        const kernel_table& s = scalar_kernel_table();
        if constexpr (std::is_same_v<T, float>)
            s.attend(q, q_stride, n_q, n_tok, k, v, n, head_dim, scale, scores, out, out_stride, next_k, next_n);
        else s.attend_f16(q, q_stride, n_q, n_tok, k, v, n, head_dim, scale, scores, out, out_stride, next_k, next_n);
        return;
    }
    attend_by_token(attend_one<T>, q, q_stride, n_q, n_tok, k, v, n, head_dim, scale, scores, out, out_stride, next_k,
                    next_n);
}

// silu through exp_ps: e^-g with -g at most 88 (e^88 is finite; beyond it silu(g) is
// within 1e-36 of 0 anyway), NaN kept. The last partial vector through masked loads and
// stores, so every element takes the same formula.
inline __m256 swiglu_ps(__m256 g, __m256 u) {
    const __m256 e = exp_ps(
        _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_sub_ps(_mm256_setzero_ps(), g))); // NaN: min's second operand
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void swiglu(float* gate, const float* up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(gate + i, swiglu_ps(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        const __m256i mask =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(gate + i, mask,
                            swiglu_ps(_mm256_maskload_ps(gate + i, mask), _mm256_maskload_ps(up + i, mask)));
    }
}

void to_f16(const float* x, uint16_t* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

float dot_f16(const void* row, const float* x, int64_t n) {
    const auto* h = static_cast<const uint16_t*>(row);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
        acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
    }
    float sum = hsum(acc);
    for (; i < n; ++i) sum += f16(h[i]) * x[i];
    return sum;
}

float dot_bf16(const void* row, const float* x, int64_t n) {
    const auto* h = static_cast<const uint16_t*>(row);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
        const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
        acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
    }
    float sum = hsum(acc);
    for (; i < n; ++i) sum += bf16(h[i]) * x[i];
    return sum;
}

// S independent streams (equal parts of the range) read in lockstep, each into its own
// register
template <int S>
uint64_t read_streams(const void* p, size_t bytes) {
    const auto* v = static_cast<const __m256i*>(p);
    const size_t part = bytes / (32 * S); // in 32-byte vectors
    __m256i acc[S];
    for (auto& a : acc) a = _mm256_setzero_si256();
    for (size_t i = 0; i < part; i += 2) {
        for (int k = 0; k < S; ++k) {
            const __m256i* q = v + size_t(k) * part + i;
            acc[k] = _mm256_add_epi64(acc[k], _mm256_add_epi64(_mm256_load_si256(q), _mm256_load_si256(q + 1)));
        }
    }
    __m256i s = acc[0];
    for (int k = 1; k < S; ++k) s = _mm256_add_epi64(s, acc[k]);
    alignas(32) uint64_t out[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
    return out[0] + out[1] + out[2] + out[3];
}

uint64_t read_sum(const void* p, size_t bytes, int streams) {
    switch (streams) {
    case 1: return read_streams<1>(p, bytes);
    case 2: return read_streams<2>(p, bytes);
    case 4: return read_streams<4>(p, bytes);
    default: return read_streams<8>(p, bytes);
    }
}

uint64_t madd_loop(int64_t iterations) {
    // independent chains of the int8 dot-product instructions, 8 x 32 multiply-adds per
    // iteration, on registers only: maddubs with its pairs added in int16, the form whose
    // sums the tiles widen to int32 only once per block or several (q4_0x8). Eight
    // accumulators over two times four inputs (every product different, or the compiler
    // would compute them once), all held in registers: GCC otherwise keeps some accumulators
    // on the stack, and the loop measures store forwarding instead.
    __m256i a0 = _mm256_set1_epi8(3), a1 = _mm256_set1_epi8(4);
    __m256i b0 = _mm256_set1_epi8(5), b1 = _mm256_set1_epi8(6), b2 = _mm256_set1_epi8(7), b3 = _mm256_set1_epi8(8);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int64_t i = 0; i < iterations; ++i) {
        c0 = _mm256_add_epi16(c0, _mm256_maddubs_epi16(a0, b0));
        c1 = _mm256_add_epi16(c1, _mm256_maddubs_epi16(a0, b1));
        c2 = _mm256_add_epi16(c2, _mm256_maddubs_epi16(a0, b2));
        c3 = _mm256_add_epi16(c3, _mm256_maddubs_epi16(a0, b3));
        c4 = _mm256_add_epi16(c4, _mm256_maddubs_epi16(a1, b0));
        c5 = _mm256_add_epi16(c5, _mm256_maddubs_epi16(a1, b1));
        c6 = _mm256_add_epi16(c6, _mm256_maddubs_epi16(a1, b2));
        c7 = _mm256_add_epi16(c7, _mm256_maddubs_epi16(a1, b3));
        // the inputs must be read every time; the accumulators stay in registers
        __asm__ volatile(""
                         : "+x"(a0), "+x"(a1), "+x"(b0), "+x"(b1), "+x"(b2), "+x"(b3), "+x"(c0), "+x"(c1), "+x"(c2),
                           "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7));
    }
    const __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), _mm256_add_epi16(c2, c3)),
                                       _mm256_add_epi16(_mm256_add_epi16(c4, c5), _mm256_add_epi16(c6, c7)));
    return static_cast<uint64_t>(_mm256_extract_epi16(s, 0));
}

constexpr kernel_table table = {"avx2",
                                quantize_x,
                                quantize_x_k,
                                dispatch_tile<q8_0_tiles>,
                                dispatch_tile<q4_0_tiles>,
                                tile_k<format::block_q4_k, false>,
                                tile_k<format::block_q5_k, false>,
                                tile_k<format::block_q6_k, false>,
                                tile_b32<format::block_q4_1, false>,
                                tile_b32<format::block_q5_0, false>,
                                tile_b32<format::block_q5_1, false>,
                                tile_b32<format::block_iq4_nl, false>,
                                tile_k<format::block_iq4_xs, false>,
                                tile_k<format::block_q2_k, false>,
                                tile_k<format::block_q3_k, false>,
                                dispatch_x8<q4_0x8_ops>,
                                dispatch_x8<q8_0x8_ops>,
                                x8_streams<q4_0x8_ops>,
                                x8_streams<q8_0x8_ops>,
                                tile_kx8<format::block_q4_kx8, false>,
                                tile_kx8<format::block_q5_kx8, false>,
                                tile_kx8<format::block_q6_kx8, false>,
                                streams_kx8<format::block_q4_kx8, false>,
                                streams_kx8<format::block_q5_kx8, false>,
                                streams_kx8<format::block_q6_kx8, false>,
                                tile_kx8<format::block_iq4_xsx8, false>,
                                streams_kx8<format::block_iq4_xsx8, false>,
                                tile_kx8<format::block_q4_1x8, false>,
                                tile_kx8<format::block_q5_0x8, false>,
                                tile_kx8<format::block_q5_1x8, false>,
                                tile_kx8<format::block_iq4_nlx8, false>,
                                streams_b32x8<format::block_q4_1x8, false>,
                                streams_b32x8<format::block_q5_0x8, false>,
                                streams_b32x8<format::block_q5_1x8, false>,
                                streams_b32x8<format::block_iq4_nlx8, false>,
                                tile_kx8<format::block_q2_kx8, false>,
                                tile_kx8<format::block_q3_kx8, false>,
                                streams_kx8<format::block_q2_kx8, false>,
                                streams_kx8<format::block_q3_kx8, false>,
                                dot_f32_act<block_q8_0>,
                                dot_f32_act<block_q4_0>,
                                dot4_f32_act<block_q8_0>,
                                dot4_f32_act<block_q4_0>,
                                dotx4_f32_act<block_q8_0>,
                                dotx4_f32_act<block_q4_0>,
                                dot_f32,
                                dot_f32_t<4>,
                                dot4_f32,
                                attend<float>,
                                attend<uint16_t>,
                                swiglu,
                                to_f16,
                                dot_f16,
                                dot_bf16,
                                read_sum,
                                madd_loop};

} // namespace

// Asked once: the 512-bit table's attention calls it for the head dimensions it leaves to
// this table, and CPUID, which a virtual machine traps, cost such a call a fifth of its time.
const kernel_table* avx2_kernel_table() {
    static const kernel_table* const supported = [] {
        __builtin_cpu_init();
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0; // F16C from CPUID: clang 14's builtin does not know it
        const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
        const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        return ok ? &table : nullptr;
    }();
    return supported;
}

} // namespace colibri

#else

namespace colibri {
const kernel_table* avx2_kernel_table() { return nullptr; }
} // namespace colibri

#endif
