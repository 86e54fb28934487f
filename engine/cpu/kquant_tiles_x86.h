#pragma once
// K-quant tiles (q4_k, q5_k, q6_k) with int8 activations on 256-bit vectors: the AVX2
// table's, and with VNNI (vpdpbusd on 256 bits) the AVX-512 table's. Included after
// simd_x86.h by files built with at least AVX2 + FMA + F16C. The arithmetic is kernel_table.h's:
// exact integer sums per 32-element sub-block, scaled in f32 (one lane per sub-block), a
// super-block's lanes added in hsum4's tree.

#include "cpu/simd_x86.h"
#include "format/gguf_blocks.h"

#include <cmath>
#include <cstddef>

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

// The eight activation blocks of a super-block: their scales and their sums, from eight
// 8-byte loads of (d, sum) (built lane by lane, they went through the stack and stalled
// the vector loads that read them back).
inline void k_x_scales_sums(const block_q8_x* x, __m256& d, __m256i& sum) {
    static_assert(offsetof(block_q8_x, sum) == 4);
    __m128 ds[4]; // [d sum d sum] of blocks 2i, 2i + 1
    COLIBRI_UNROLL
    for (int i = 0; i < 4; ++i) {
        ds[i] = _mm_castsi128_ps(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&x[2 * i])),
                                                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&x[2 * i + 1]))));
    }
    d = _mm256_set_m128(_mm_shuffle_ps(ds[2], ds[3], _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm_shuffle_ps(ds[0], ds[1], _MM_SHUFFLE(2, 0, 2, 0)));
    sum = _mm256_castps_si256(_mm256_set_m128(_mm_shuffle_ps(ds[2], ds[3], _MM_SHUFFLE(3, 1, 3, 1)),
                                              _mm_shuffle_ps(ds[0], ds[1], _MM_SHUFFLE(3, 1, 3, 1))));
}

template <class Block>
[[gnu::always_inline]] inline void prefetch_k_block(const Block& b) { // always inlined: see prefetch_rows
    const char* ahead = reinterpret_cast<const char*>(&b) + prefetch_bytes;
    for (size_t line = 0; line * 64 < sizeof(Block); ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
}

// One q4_k / q5_k super-block of a row against T tokens' quantize_x_k activation blocks
// xs[t][0..7] (their sums in xsum[t]): f[t], dot_k's chain before the activations' scale.
template <class Block, int T, bool Vnni>
inline void q45_k_block(const Block& b, const block_q8_x* const xs[T], const __m256i xsum[T], float f[T]) {
    constexpr bool five = std::is_same_v<Block, format::block_q5_k>;
    __m256i sc, m;
    k_scales_mins(b.scales, sc, m);
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i q[8]; // sub-block j's values, 0..15 (0..31 for q5_k)
    COLIBRI_UNROLL
    for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
        q[2 * c] = _mm256_and_si256(v, low);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if constexpr (five) { // bit j of qh[l] into bit 4 of sub-block j's element l
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j)
            q[j] = _mm256_or_si256(q[j], _mm256_and_si256(shift16(h, 4 - j), _mm256_set1_epi8(0x10)));
    }
    alignas(32) float dsc[8], a[8];
    _mm256_store_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.d)), _mm256_cvtepi32_ps(sc)));
    const float dmin = _cvtsh_ss(b.dmin);
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i s[8];
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j)
            s[j] = dot_u8s8<Vnni>(q[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs)));
        _mm256_store_ps(a, _mm256_cvtepi32_ps(join_halves(half_sums4(s), half_sums4(s + 4))));
        float chain = 0.0f; // lane by lane, as the interleaved tiles' lanes run it
        for (int j = 0; j < 8; ++j) chain = std::fma(dsc[j], a[j], chain);
        alignas(32) int32_t mins[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(mins), _mm256_mullo_epi32(m, xsum[t]));
        const int32_t msum = ((mins[0] + mins[1]) + (mins[2] + mins[3])) + ((mins[4] + mins[5]) + (mins[6] + mins[7]));
        f[t] = std::fma(-dmin, static_cast<float>(msum), chain);
    }
}

// One q6_k super-block of a row against T tokens' activation blocks. The values less 32 go
// through the unsigned side as |w|, the activations taking w's sign.
template <int T, bool Vnni>
inline void q6_k_block(const format::block_q6_k& b, const block_q8_x* const xs[T], const __m256 xd[T], __m256 p[T]) {
    // the 16 scales in the order of the half sums: [0 2 4 6 | 1 3 5 7] and [8 10 12 14 | 9 11 13 15]
    const __m128i s8 = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)),
                                        _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
    const __m256i sc0 = _mm256_cvtepi8_epi32(s8), sc1 = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(s8, s8));
    const __m256i low = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
    __m256i w[8], u[8]; // sub-block j = 4h + k: its values less 32, and their magnitudes
    COLIBRI_UNROLL
    for (int h = 0; h < 2; ++h) {
        const __m256i ql[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32))};
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
        COLIBRI_UNROLL
        for (int k = 0; k < 4; ++k) {
            const __m256i lo = _mm256_and_si256(k < 2 ? ql[k] : _mm256_srli_epi16(ql[k - 2], 4), low);
            const __m256i hi = _mm256_and_si256(shift16(qh, 4 - 2 * k), bits45);
            w[4 * h + k] = _mm256_sub_epi8(_mm256_or_si256(lo, hi), offset);
            u[4 * h + k] = _mm256_sign_epi8(w[4 * h + k], w[4 * h + k]);
        }
    }
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i s[8];
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs));
            s[j] = dot_u8s8<Vnni>(u[j], _mm256_sign_epi8(x, w[j]));
        }
        const __m256i a =
            join_halves(_mm256_mullo_epi32(half_sums4(s), sc0), _mm256_mullo_epi32(half_sums4(s + 4), sc1));
        p[t] = _mm256_mul_ps(_mm256_mul_ps(d, xd[t]), _mm256_cvtepi32_ps(a));
    }
}

// out[t * 4 + r] = lane t of acc[r]: four rows' sums, token by token, as a tile returns them.
template <int T>
inline void store_row_lanes(const __m128 acc[4], float* out) {
    alignas(16) float a[4][4];
    COLIBRI_UNROLL
    for (int r = 0; r < 4; ++r) _mm_store_ps(a[r], acc[r]);
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        COLIBRI_UNROLL
        for (int r = 0; r < 4; ++r) out[t * 4 + r] = a[r][t];
    }
}

// --- The read-only GGUF types: 32 values of a block in a vector, [elements 0-15 | 16-31].

// The nibbles of qs[16]: element i the low nibble of qs[i], element i + 16 the high one.
inline __m256i nibbles32(const uint8_t* qs) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), low = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

// Bit i of qh[0..3] as 0x10 in byte i (a q5_0 / q5_1 element's fifth bit).
inline __m256i fifth_bits32(const uint8_t* qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                                                2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// The iq4 values of 32 nibbles.
inline __m256i iq4_lookup(__m256i nibbles) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(format::iq4_values));
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles);
}

// The integer dot of signed values w (|w| <= 127) with activations x, four per int32 lane.
template <bool Vnni>
inline __m256i dot_s8s8(__m256i w, __m256i x) {
    return dot_u8s8<Vnni>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// What a 32-element block type brings to the tile: its values, its f16 scale and min.
template <class Block>
inline __m256i block32_values(const Block& b) {
    if constexpr (std::is_same_v<Block, format::block_iq4_nl>) return iq4_lookup(nibbles32(b.qs));
    else if constexpr (std::is_same_v<Block, format::block_q4_1>) return nibbles32(b.qs);
    else return _mm256_or_si256(nibbles32(b.qs), fifth_bits32(b.qh)); // q5_0, q5_1
}
template <class Block>
constexpr bool block32_has_min = std::is_same_v<Block, format::block_q4_1> || std::is_same_v<Block, format::block_q5_1>;

// Eight blocks of a row against T tokens' eight activation blocks: kernel_table_scalar.cpp's
// dot_b32 for one group, each token's p[t] holding the eight blocks' scaled sums.
template <class Block, int T, bool Vnni>
inline void b32_group(const Block* w, const block_q8_x* const xs[T], const __m256 xd[T], const __m256i xsum[T],
                      __m256 p[T]) {
    __m256i q[8];
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) q[j] = block32_values(w[j]);
    const __m256 d = _mm256_cvtph_ps(_mm_setr_epi16(static_cast<short>(w[0].d), static_cast<short>(w[1].d),
                                                    static_cast<short>(w[2].d), static_cast<short>(w[3].d),
                                                    static_cast<short>(w[4].d), static_cast<short>(w[5].d),
                                                    static_cast<short>(w[6].d), static_cast<short>(w[7].d)));
    __m256 m = _mm256_setzero_ps();
    if constexpr (block32_has_min<Block>) {
        m = _mm256_cvtph_ps(_mm_setr_epi16(static_cast<short>(w[0].m), static_cast<short>(w[1].m),
                                           static_cast<short>(w[2].m), static_cast<short>(w[3].m),
                                           static_cast<short>(w[4].m), static_cast<short>(w[5].m),
                                           static_cast<short>(w[6].m), static_cast<short>(w[7].m)));
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i s[8];
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs));
            if constexpr (std::is_same_v<Block, format::block_iq4_nl>) s[j] = dot_s8s8<Vnni>(q[j], x);
            else s[j] = dot_u8s8<Vnni>(q[j], x);
        }
        __m256i a = join_halves(half_sums4(s), half_sums4(s + 4));
        if constexpr (std::is_same_v<Block, format::block_q5_0>)
            a = _mm256_sub_epi32(a, _mm256_slli_epi32(xsum[t], 4)); // q - 16
        p[t] = _mm256_mul_ps(_mm256_mul_ps(d, xd[t]), _mm256_cvtepi32_ps(a));
        if constexpr (block32_has_min<Block>) // xd * sum: each block's dsum
            p[t] = _mm256_fmadd_ps(m, _mm256_mul_ps(xd[t], _mm256_cvtepi32_ps(xsum[t])), p[t]);
    }
}

// A q4_1 / q5_0 / q5_1 / iq4_nl tile for a fixed token count T: four rows by T tokens, the
// blocks eight at a time, a short last group padded with zero blocks (which add +0).
template <class Block, int T, bool Vnni>
void tile_b32_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    const Block* w[4];
    COLIBRI_UNROLL
    for (int r = 0; r < 4; ++r) w[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + r * stride);
    __m128 acc[4]; // row r, lane t: token t
    COLIBRI_UNROLL
    for (int r = 0; r < 4; ++r) acc[r] = _mm_setzero_ps();
    const int64_t nb = n / format::qk;
    for (int64_t g = 0; g < nb; g += 8) {
        const int left = static_cast<int>(nb - g < 8 ? nb - g : 8);
        block_q8_x x_pad[T][8];
        Block w_pad[8];
        const block_q8_x* xs[T];
        __m256 xd[T];
        __m256i xsum[T];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            xs[t] = x + size_t(t) * x_stride + size_t(g);
            if (left < 8) {
                std::memset(x_pad[t], 0, sizeof(x_pad[t]));
                std::memcpy(x_pad[t], xs[t], size_t(left) * sizeof(block_q8_x));
                xs[t] = x_pad[t];
            }
            k_x_scales_sums(xs[t], xd[t], xsum[t]);
        }
        COLIBRI_UNROLL
        for (int r = 0; r < 4; ++r) {
            const Block* wg = w[r] + g;
            for (int line = 0; line * 64 < int(8 * sizeof(Block)); ++line) {
                _mm_prefetch(reinterpret_cast<const char*>(wg) + prefetch_bytes + 64 * line, _MM_HINT_T0);
            }
            if (left < 8) {
                std::memset(static_cast<void*>(w_pad), 0, sizeof(w_pad));
                std::memcpy(static_cast<void*>(w_pad), wg, size_t(left) * sizeof(Block));
                wg = w_pad;
            }
            __m256 p[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            b32_group<Block, T, Vnni>(wg, xs, xd, xsum, p);
            acc[r] = _mm_add_ps(acc[r], hsum4(p)); // kernel_table_scalar.cpp's sum8 of each token's group
        }
    }
    store_row_lanes<T>(acc, out);
}

template <class Block, bool Vnni>
void tile_b32(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n, float* out) {
    switch (clamp_int(n_tok, 1, 4)) {
    case 1: tile_b32_t<Block, 1, Vnni>(rows, stride, x, x_stride, n, out); break;
    case 2: tile_b32_t<Block, 2, Vnni>(rows, stride, x, x_stride, n, out); break;
    case 3: tile_b32_t<Block, 3, Vnni>(rows, stride, x, x_stride, n, out); break;
    default: tile_b32_t<Block, 4, Vnni>(rows, stride, x, x_stride, n, out); break;
    }
}

// One iq4_xs super-block of a row against T tokens' quantize_x_k activation blocks: f[t],
// dot_k's chain before the activations' scale.
template <int T, bool Vnni>
inline void iq4_xs_block(const format::block_iq4_xs& b, const block_q8_x* const xs[T], float f[T]) {
    __m256i q[8];
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) q[j] = iq4_lookup(nibbles32(b.qs + 16 * j));
    alignas(32) float dls[8], a[8];
    const float d = _cvtsh_ss(b.d);
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) dls[j] = d * static_cast<float>(format::iq4_xs_scale(b, j));
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i s[8];
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j)
            s[j] = dot_s8s8<Vnni>(q[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs)));
        _mm256_store_ps(a, _mm256_cvtepi32_ps(join_halves(half_sums4(s), half_sums4(s + 4))));
        float chain = 0.0f; // lane by lane, as the interleaved tiles' lanes run it
        for (int j = 0; j < 8; ++j) chain = std::fma(dls[j], a[j], chain);
        f[t] = chain;
    }
}

// Per token, the activation blocks' half sums in the order of half_sums4 over blocks 0-3 and
// 4-7: [sum of elements 0-15 of blocks 0-3 | of elements 16-31], the same of blocks 4-7.
inline void x_half_sums(const block_q8_x* xs, __m256i hx[2]) {
    COLIBRI_UNROLL
    for (int i = 0; i < 2; ++i) {
        const block_q8_x* x = xs + 4 * i;
        hx[i] = _mm256_setr_epi32(x[0].sum_lo, x[1].sum_lo, x[2].sum_lo, x[3].sum_lo, x[0].sum - x[0].sum_lo,
                                  x[1].sum - x[1].sum_lo, x[2].sum - x[2].sum_lo, x[3].sum - x[3].sum_lo);
    }
}

// Sixteen per-sub-block integers (one per 16 elements, k = 2j + half) in half_sums4's order:
// [0 2 4 6 | 1 3 5 7] and [8 10 12 14 | 9 11 13 15].
inline void sixteen_in_half_order(const int v[16], __m256i out[2]) {
    out[0] = _mm256_setr_epi32(v[0], v[2], v[4], v[6], v[1], v[3], v[5], v[7]);
    out[1] = _mm256_setr_epi32(v[8], v[10], v[12], v[14], v[9], v[11], v[13], v[15]);
}

// One q2_k or q3_k super-block of a row against T tokens' activation blocks: unsigned values
// (q3_k's less 4 through the half sums), a scale per 16 elements, q2_k's mins likewise.
template <class Block, int T, bool Vnni>
inline void q23_k_block(const Block& b, const block_q8_x* const xs[T], const __m256 xd[T], __m256 p[T]) {
    constexpr bool three = std::is_same_v<Block, format::block_q3_k>;
    int sc[16], mn[16];
    COLIBRI_UNROLL
    for (int k = 0; k < 16; ++k) {
        if constexpr (three) {
            sc[k] = format::q3_k_scale(b, k);
        } else {
            sc[k] = b.scales[k] & 15;
            mn[k] = b.scales[k] >> 4;
        }
    }
    __m256i scv[2], mnv[2];
    sixteen_in_half_order(sc, scv);
    if constexpr (!three) sixteen_in_half_order(mn, mnv);
    const __m256i three_bits = _mm256_set1_epi8(3);
    __m256i q[8]; // activation block j = 4h + s: bits 2s, 2s + 1 of qs[32h ..], q3_k's hmask bit j above them
    COLIBRI_UNROLL
    for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
        COLIBRI_UNROLL
        for (int s = 0; s < 4; ++s) q[4 * h + s] = _mm256_and_si256(shift16(v, -2 * s), three_bits);
    }
    if constexpr (three) {
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j)
            q[j] = _mm256_or_si256(q[j], _mm256_and_si256(shift16(hm, 2 - j), _mm256_set1_epi8(4)));
    }
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i s[8], hx[2];
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j)
            s[j] = dot_u8s8<Vnni>(q[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t][j].qs)));
        __m256i h0 = half_sums4(s), h1 = half_sums4(s + 4);
        x_half_sums(xs[t], hx);
        if constexpr (three) { // the values less 4
            h0 = _mm256_sub_epi32(h0, _mm256_slli_epi32(hx[0], 2));
            h1 = _mm256_sub_epi32(h1, _mm256_slli_epi32(hx[1], 2));
        }
        const __m256i a = join_halves(_mm256_mullo_epi32(h0, scv[0]), _mm256_mullo_epi32(h1, scv[1]));
        p[t] = _mm256_mul_ps(_mm256_mul_ps(d, xd[t]), _mm256_cvtepi32_ps(a));
        if constexpr (!three) {
            const __m256i mins = join_halves(_mm256_mullo_epi32(hx[0], mnv[0]), _mm256_mullo_epi32(hx[1], mnv[1]));
            p[t] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.dmin)), xd[t]), _mm256_cvtepi32_ps(mins),
                                    p[t]);
        }
    }
}

// A K-quant tile for a fixed token count T: four rows (`stride` bytes apart) by T tokens.
template <class Block, int T, bool Vnni>
void tile_k_t(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int64_t n, float* out) {
    const Block* w[4];
    COLIBRI_UNROLL
    for (int r = 0; r < 4; ++r) w[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + r * stride);
    __m128 acc[4]; // row r, lane t: token t
    COLIBRI_UNROLL
    for (int r = 0; r < 4; ++r) acc[r] = _mm_setzero_ps();
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        const block_q8_x* xs[T];
        __m256 xd[T];
        __m256i xsum[T];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            xs[t] = x + size_t(t) * x_stride + size_t(8 * s);
            k_x_scales_sums(xs[t], xd[t], xsum[t]);
        }
        COLIBRI_UNROLL
        for (int r = 0; r < 4; ++r) {
            prefetch_k_block(w[r][s]);
            if constexpr (std::is_same_v<Block, format::block_q4_k> || std::is_same_v<Block, format::block_q5_k> ||
                          std::is_same_v<Block, format::block_iq4_xs>) {
                alignas(16) float f[4] = {}, xs_d[4] = {};
                if constexpr (std::is_same_v<Block, format::block_iq4_xs>) iq4_xs_block<T, Vnni>(w[r][s], xs, f);
                else q45_k_block<Block, T, Vnni>(w[r][s], xs, xsum, f);
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) xs_d[t] = xs[t][0].d;
                acc[r] = _mm_fmadd_ps(_mm_load_ps(xs_d), _mm_load_ps(f), acc[r]); // the activations' scale
            } else {
                __m256 p[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                if constexpr (std::is_same_v<Block, format::block_q6_k>) q6_k_block<T, Vnni>(w[r][s], xs, xd, p);
                else q23_k_block<Block, T, Vnni>(w[r][s], xs, xd, p);
                acc[r] = _mm_add_ps(acc[r], hsum4(p)); // each token's super-block: kernel_table_scalar.cpp's sum8
            }
        }
    }
    store_row_lanes<T>(acc, out);
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

// --- Interleaved K-quants (q4_kx8, q5_kx8, q6_kx8): the eight rows of a group in the lanes.
// Each row's arithmetic is dot_k's: a sub-block's integer sum per lane, scaled, the eight
// sub-blocks added in sum8's tree ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)).

// v >> k in each 32-bit lane.
inline __m256i shr32(__m256i v, int k) { return _mm256_srl_epi32(v, _mm_cvtsi32_si128(k)); }

// The 6-bit scale (sc) and min (m) of sub-block j of eight q4_k/q5_k rows, from their
// scale words (format::k_scale_min, lane by lane).
inline void kx8_scale_min(const uint32_t (&words)[3][8], int j, __m256i& sc, __m256i& m) {
    const auto word = [&](int w) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words[w])); };
    const __m256i six = _mm256_set1_epi32(63), four = _mm256_set1_epi32(15), two = _mm256_set1_epi32(3);
    if (j < 4) {
        sc = _mm256_and_si256(shr32(word(0), 8 * j), six);
        m = _mm256_and_si256(shr32(word(1), 8 * j), six);
    } else {
        const int k = 8 * (j - 4);
        const __m256i w2 = word(2);
        sc = _mm256_or_si256(_mm256_and_si256(shr32(w2, k), four),
                             _mm256_slli_epi32(_mm256_and_si256(shr32(word(0), k + 6), two), 4));
        m = _mm256_or_si256(_mm256_and_si256(shr32(w2, k + 4), four),
                            _mm256_slli_epi32(_mm256_and_si256(shr32(word(1), k + 6), two), 4));
    }
}

// acc + the integer dot products of four bytes per lane: u unsigned, s signed.
template <bool Vnni>
inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
    if constexpr (Vnni) return _mm256_dpbusd_epi32(acc, u, s);
    else return _mm256_add_epi32(acc, dot_u8s8<false>(u, s));
}

// acc + the products of the int16 pairs of a and b in each lane, added.
template <bool Vnni>
inline __m256i madd16_add(__m256i acc, __m256i a, __m256i b) {
    if constexpr (Vnni) return _mm256_dpwssd_epi32(acc, a, b);
    else return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

// One super-block column of a q4_kx8 / q5_kx8 group against T tokens (xs[t]: the
// token's eight quantize_x_k activation blocks of it): acc[t] += each row's dot_k step.
template <class Block, int T, bool Vnni>
inline void q45_kx8_block(const Block& b, const block_q8_x* const xs[T], __m256 acc[T]) {
    constexpr bool five = std::is_same_v<Block, format::block_q5_kx8>;
    const __m256i low = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    __m256 f[T];  // the chain of each row's sub-block sums times its d sc
    __m256i m[4]; // the mins of sub-blocks 2c and 2c + 1 as an int16 pair
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) f[t] = _mm256_setzero_ps();
    COLIBRI_UNROLL
    for (int c = 0; c < 4; ++c) { // sub-blocks 2c (low nibbles) and 2c + 1 (high)
        __m256i s[T][2];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) s[t][0] = s[t][1] = _mm256_setzero_si256();
        COLIBRI_UNROLL
        for (int i = 0; i < 8; ++i) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[c][i]));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if constexpr (five) { // bit j of qh into bit 4 of sub-block j's values
                const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh[i]));
                lo = _mm256_or_si256(lo, _mm256_and_si256(shift16(h, 4 - 2 * c), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(shift16(h, 3 - 2 * c), bit4));
            }
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) {
                s[t][0] = dot_add<Vnni>(s[t][0], lo, x4_all_lanes(xs[t][2 * c].qs + 4 * i));
                s[t][1] = dot_add<Vnni>(s[t][1], hi, x4_all_lanes(xs[t][2 * c + 1].qs + 4 * i));
            }
        }
        __m256i mc[2];
        COLIBRI_UNROLL
        for (int e = 0; e < 2; ++e) {
            __m256i sc;
            kx8_scale_min(b.scales, 2 * c + e, sc, mc[e]);
            const __m256 dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) f[t] = _mm256_fmadd_ps(dsc, _mm256_cvtepi32_ps(s[t][e]), f[t]);
        }
        m[c] = _mm256_or_si256(mc[0], _mm256_slli_epi32(mc[1], 16));
    }
    // the mins (< 64) times the blocks' sums, two sub-blocks a product (set_sum_pairs)
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.dmin)));
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i mins = _mm256_setzero_si256();
        COLIBRI_UNROLL
        for (int c = 0; c < 4; ++c) mins = madd16_add<Vnni>(mins, m[c], _mm256_set1_epi32(xs[t][2 * c].sum_pair));
        f[t] = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(mins), f[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(xs[t][0].d), f[t], acc[t]);
    }
}

// The sum of the first (half 0) or last 16 activations of a block; q6_bias, that times -32:
// q6_k's values are q - 32, and sum (q - 32) x = sum q x - 32 sum x.
inline int32_t x_half_sum(const block_q8_x& xb, int half) { return half == 0 ? xb.sum_lo : xb.sum - xb.sum_lo; }
inline int32_t q6_bias(const block_q8_x& xb, int half) { return -32 * x_half_sum(xb, half); }

// One super-block column of a q6_kx8 group against T tokens, likewise. The unsigned values
// q (0..63) multiply the activations, each half sub-block's sum starting at q6_bias.
template <int T, bool Vnni>
inline void q6_kx8_block(const format::block_q6_kx8& b, const block_q8_x* const xs[T], __m256 acc[T]) {
    const __m256i low = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    const auto scale = [&](int k) {
        return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales[k])));
    };
    __m256 p[2][2][2][T]; // h, c, e: sub-block 4h + c + 2e
    COLIBRI_UNROLL
    for (int h = 0; h < 2; ++h) {
        COLIBRI_UNROLL
        for (int c = 0; c < 2; ++c) { // sub-blocks 4h + c (low nibbles) and 4h + c + 2 (high)
            __m256i s[T][2][2];       // token, sub-block, half (elements 0-15, 16-31)
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) {
                COLIBRI_UNROLL
                for (int e = 0; e < 2; ++e) {
                    COLIBRI_UNROLL
                    for (int half = 0; half < 2; ++half)
                        s[t][e][half] = _mm256_set1_epi32(q6_bias(xs[t][4 * h + c + 2 * e], half));
                }
            }
            COLIBRI_UNROLL
            for (int i = 0; i < 8; ++i) {
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql[h][c][i]));
                const __m256i vh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh[h][i]));
                const __m256i q[2] = {
                    _mm256_or_si256(_mm256_and_si256(v, low), _mm256_and_si256(shift16(vh, 4 - 2 * c), bits45)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                    _mm256_and_si256(shift16(vh, -2 * c), bits45))};
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) {
                    COLIBRI_UNROLL
                    for (int e = 0; e < 2; ++e) {
                        s[t][e][i / 4] =
                            dot_add<Vnni>(s[t][e][i / 4], q[e], x4_all_lanes(xs[t][4 * h + c + 2 * e].qs + 4 * i));
                    }
                }
            }
            COLIBRI_UNROLL
            for (int e = 0; e < 2; ++e) {
                const int j = 4 * h + c + 2 * e;
                const __m256i sc0 = scale(2 * j), sc1 = scale(2 * j + 1);
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) {
                    const __m256i a =
                        _mm256_add_epi32(_mm256_mullo_epi32(s[t][e][0], sc0), _mm256_mullo_epi32(s[t][e][1], sc1));
                    p[h][c][e][t] = _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(xs[t][j].d)), _mm256_cvtepi32_ps(a));
                }
            }
        }
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256 half[2]; // (p4h + p4h+1) + (p4h+2 + p4h+3)
        COLIBRI_UNROLL
        for (int h = 0; h < 2; ++h) {
            half[h] =
                _mm256_add_ps(_mm256_add_ps(p[h][0][0][t], p[h][1][0][t]), _mm256_add_ps(p[h][0][1][t], p[h][1][1][t]));
        }
        acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(half[0], half[1]));
    }
}

// One super-block column of an iq4_xsx8 group against T tokens (quantize_x_k's
// activations), as q45_kx8_block without mins. With VNNI the values enter vpdpbusd as iq4 +
// 128 (a second table), less 128 * sum(x); without it as |w| against the activations with
// w's sign.
template <int T, bool Vnni>
inline void iq4_xsx8_block(const format::block_iq4_xsx8& b, const block_q8_x* const xs[T], __m256 acc[T]) {
    const __m128i t16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(format::iq4_values));
    const __m256i table =
        Vnni ? _mm256_set_m128i(_mm_xor_si128(t16, _mm_set1_epi8(-128)), _mm_xor_si128(t16, _mm_set1_epi8(-128)))
             : _mm256_set_m128i(t16, t16);
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    const __m256i sl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.scales_l));
    const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales_h)));
    __m256 f[T]; // the chain of each row's sub-block sums times its d ls (quantize_x_k's activations)
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) f[t] = _mm256_setzero_ps();
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) {
        __m256i s[T];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) s[t] = Vnni ? _mm256_set1_epi32(-128 * xs[t][j].sum) : _mm256_setzero_si256();
        COLIBRI_UNROLL
        for (int k = 0; k < 4; ++k) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[j][k]));
            const __m256i w[2] = {_mm256_shuffle_epi8(table, _mm256_and_si256(v, low)),
                                  _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low))};
            COLIBRI_UNROLL
            for (int e = 0; e < 2; ++e) { // elements 4k.. (low nibbles) and 16 + 4k.. (high)
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) {
                    const __m256i x = x4_all_lanes(xs[t][j].qs + 16 * e + 4 * k);
                    if constexpr (Vnni) s[t] = _mm256_dpbusd_epi32(s[t], w[e], x);
                    else
                        s[t] = _mm256_add_epi32(
                            s[t], dot_u8s8<false>(_mm256_sign_epi8(w[e], w[e]), _mm256_sign_epi8(x, w[e])));
                }
            }
        }
        const __m256i ls = _mm256_sub_epi32(
            _mm256_or_si256(_mm256_and_si256(shr32(sl, 4 * j), _mm256_set1_epi32(15)),
                            _mm256_slli_epi32(_mm256_and_si256(shr32(sh, 2 * j), _mm256_set1_epi32(3)), 4)),
            _mm256_set1_epi32(32));
        const __m256 dls = _mm256_mul_ps(d, _mm256_cvtepi32_ps(ls));
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) f[t] = _mm256_fmadd_ps(dls, _mm256_cvtepi32_ps(s[t]), f[t]);
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(xs[t][0].d), f[t], acc[t]);
}

// Sub-block k's 6-bit q3_k scale, less 32, of each of eight rows (format::q3_k_scale, lane
// by lane) from their scale words.
inline __m256i q3_kx8_scale(const uint32_t (&words)[3][8], int k) {
    const auto word = [&](int w) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words[w])); };
    const __m256i lo = _mm256_and_si256(shr32(word(k % 8 / 4), 8 * (k % 4) + 4 * (k / 8)), _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(shr32(word(2), 8 * (k % 4) + 2 * (k / 4)), _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

// One super-block column of a q2_kx8 / q3_kx8 group against T tokens, likewise: activation
// block a = 4h + j holds bits 2j, 2j + 1 of qs[h] (q3_k's hmask bit a above them), each half
// block with its own scale (q2_k's min; q3_k's values less 4 through the sums' start). q2_k's
// values stay in place with VNNI, 4^j times their value, their scaled sums divided by 4^j exactly.
template <class Block, int T, bool Vnni>
inline void q23_kx8_block(const Block& b, const block_q8_x* const xs[T], __m256 acc[T]) {
    constexpr bool three = std::is_same_v<Block, format::block_q3_kx8>;
    constexpr bool in_place = !three && Vnni; // maddubs's int16 pair sums would overflow
    const __m256i two_bits = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    __m256 first[T], pair[2][T], lo[T]; // sum8's tree: ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
    COLIBRI_UNROLL
    for (int a = 0; a < 8; ++a) {
        const int h = a / 4, j = a % 4;
        __m256i s[T][2]; // token, half (elements 0-15, 16-31)
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            COLIBRI_UNROLL
            for (int half = 0; half < 2; ++half)
                s[t][half] = three ? _mm256_set1_epi32(-4 * x_half_sum(xs[t][a], half)) : _mm256_setzero_si256();
        }
        COLIBRI_UNROLL
        for (int i = 0; i < 8; ++i) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[h][i]));
            __m256i q = in_place ? _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(3 << 2 * j)))
                                 : _mm256_and_si256(shift16(v, -2 * j), two_bits);
            if constexpr (three) {
                const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask[i]));
                q = _mm256_or_si256(q, _mm256_and_si256(shift16(hm, 2 - a), bit2));
            }
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) s[t][i / 4] = dot_add<Vnni>(s[t][i / 4], q, x4_all_lanes(xs[t][a].qs + 4 * i));
        }
        __m256i sc[2], m[2];
        COLIBRI_UNROLL
        for (int half = 0; half < 2; ++half) {
            if constexpr (three) {
                sc[half] = q3_kx8_scale(b.scales, 2 * a + half);
            } else {
                const __m256i v =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales[2 * a + half])));
                sc[half] = _mm256_and_si256(v, _mm256_set1_epi32(15));
                m[half] = _mm256_srli_epi32(v, 4);
            }
        }
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            const __m256 xd = _mm256_set1_ps(xs[t][a].d);
            __m256i ai = _mm256_add_epi32(_mm256_mullo_epi32(s[t][0], sc[0]), _mm256_mullo_epi32(s[t][1], sc[1]));
            if (in_place) ai = _mm256_srai_epi32(ai, 2 * j);
            __m256 p = _mm256_mul_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(ai));
            if constexpr (!three) {
                const __m256i mins =
                    _mm256_add_epi32(_mm256_mullo_epi32(_mm256_set1_epi32(x_half_sum(xs[t][a], 0)), m[0]),
                                     _mm256_mullo_epi32(_mm256_set1_epi32(x_half_sum(xs[t][a], 1)), m[1]));
                const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.dmin)));
                p = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(mins), p);
            }
            if (a % 2 == 0) first[t] = p;
            else pair[a / 2 % 2][t] = _mm256_add_ps(first[t], p);
            if (a == 3) lo[t] = _mm256_add_ps(pair[0][t], pair[1][t]);
            if (a == 7) acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(lo[t], _mm256_add_ps(pair[0][t], pair[1][t])));
        }
    }
}

template <class Block, int T, bool Vnni>
inline void kx8_block(const Block& b, const block_q8_x* const xs[T], __m256 acc[T]) {
    if constexpr (std::is_same_v<Block, format::block_q6_kx8>) q6_kx8_block<T, Vnni>(b, xs, acc);
    else if constexpr (std::is_same_v<Block, format::block_q2_kx8> || std::is_same_v<Block, format::block_q3_kx8>)
        q23_kx8_block<Block, T, Vnni>(b, xs, acc);
    else if constexpr (std::is_same_v<Block, format::block_iq4_xsx8>) iq4_xsx8_block<T, Vnni>(b, xs, acc);
    else q45_kx8_block<Block, T, Vnni>(b, xs, acc);
}

// One group by T tokens (x_stride blocks apart): out[t * out_stride + r]; once: x8_tile_fn's.
template <class Block, int T, bool Vnni>
void kx8_walk(const Block* w, const block_q8_x* x, size_t x_stride, int64_t n, bool once, float* out,
              size_t out_stride) {
    __m256 acc[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        prefetch_x8_block(w[s], once);
        const block_q8_x* xs[T];
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) xs[t] = x + size_t(t) * x_stride + size_t(8 * s);
        kx8_block<Block, T, Vnni>(w[s], xs, acc);
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + size_t(t) * out_stride, acc[t]);
}

// streams_q4_kx8 / streams_q5_kx8 / streams_q6_kx8: four groups anywhere, each with its own
// activations, side by side; decode reads them once (prefetches into L2).
template <class Block, bool Vnni>
void streams_kx8(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    __m256 acc[4];
    COLIBRI_UNROLL
    for (int g = 0; g < 4; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        COLIBRI_UNROLL
        for (int g = 0; g < 4; ++g) {
            const Block& b = static_cast<const Block*>(groups[g])[s];
            prefetch_x8_block(b, true);
            const block_q8_x* xs[1] = {x[g] + size_t(8 * s)};
            kx8_block<Block, 1, Vnni>(b, xs, &acc[g]);
        }
    }
    COLIBRI_UNROLL
    for (int g = 0; g < 4; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// --- Interleaved 32-element types (q4_1x8, q5_0x8, q5_1x8, iq4_nlx8): each row's
// arithmetic is dot_b32's, eight block columns at a time added in sum8's tree.

// Bits i .. i + 3 of each lane of w as 0x10 in its bytes 0 .. 3 (the fifth bits of a q5 row's
// elements i .. i + 3).
inline __m256i fifth_bits4(__m256i w, int i) {
    const __m256i b =
        _mm256_shuffle_epi8(shr32(w, i), _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0,
                                                          0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
    const __m256i bit = _mm256_set1_epi32(0x08040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(0x10));
}

template <class Block>
constexpr bool b32x8_block =
    std::is_same_v<Block, format::block_q4_1x8> || std::is_same_v<Block, format::block_q5_0x8> ||
    std::is_same_v<Block, format::block_q5_1x8> || std::is_same_v<Block, format::block_iq4_nlx8>;

// One block column of a group against T tokens (xb[t]: the token's activation block of it):
// p[t] = each row's scaled sum.
template <class Block, int T, bool Vnni>
inline void b32x8_column(const Block& b, const block_q8_x* const xb[T], __m256 p[T]) {
    constexpr bool iq4 = std::is_same_v<Block, format::block_iq4_nlx8>;
    constexpr bool five = std::is_same_v<Block, format::block_q5_0x8> || std::is_same_v<Block, format::block_q5_1x8>;
    constexpr bool min = std::is_same_v<Block, format::block_q4_1x8> || std::is_same_v<Block, format::block_q5_1x8>;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m128i t16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(format::iq4_values));
    if (Vnni) t16 = _mm_xor_si128(t16, _mm_set1_epi8(-128)); // iq4 + 128, unsigned
    const __m256i table = _mm256_set_m128i(t16, t16);
    __m256i s[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) s[t] = iq4 && Vnni ? _mm256_set1_epi32(-128 * xb[t]->sum) : _mm256_setzero_si256();
    COLIBRI_UNROLL
    for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[k]));
        __m256i w[2] = {_mm256_and_si256(v, low),
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), low)}; // elements 4k.., 16 + 4k..
        if constexpr (five) {
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
            w[0] = _mm256_or_si256(w[0], fifth_bits4(h, 4 * k));
            w[1] = _mm256_or_si256(w[1], fifth_bits4(h, 16 + 4 * k));
        }
        if constexpr (iq4) {
            for (__m256i& e : w) e = _mm256_shuffle_epi8(table, e);
        }
        COLIBRI_UNROLL
        for (int e = 0; e < 2; ++e) {
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) {
                const __m256i x = x4_all_lanes(xb[t]->qs + 16 * e + 4 * k);
                if constexpr (iq4 && !Vnni)
                    s[t] = _mm256_add_epi32(s[t],
                                            dot_u8s8<false>(_mm256_sign_epi8(w[e], w[e]), _mm256_sign_epi8(x, w[e])));
                else s[t] = dot_add<Vnni>(s[t], w[e], x);
            }
        }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    __m256 m = _mm256_setzero_ps();
    if constexpr (min) m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.m)));
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        __m256i a = s[t];
        if constexpr (std::is_same_v<Block, format::block_q5_0x8>)
            a = _mm256_sub_epi32(a, _mm256_set1_epi32(16 * xb[t]->sum)); // q - 16
        const __m256 xd = _mm256_set1_ps(xb[t]->d);
        p[t] = _mm256_mul_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(a));
        if constexpr (min) p[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb[t]->dsum), p[t]);
    }
}

// One group's n / 32 block columns by T tokens (x_stride blocks apart), eight columns at a
// time (a short last eight padded with zeros): out[t * out_stride + r].
template <class Block, int T, bool Vnni>
void b32x8_walk(const Block* w, const block_q8_x* x, size_t x_stride, int64_t n, bool once, float* out,
                size_t out_stride) {
    __m256 acc[T];
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const int64_t nb = n / format::qk;
    for (int64_t g = 0; g < nb; g += 8) {
        __m256 p[8][T];
        COLIBRI_UNROLL
        for (int j = 0; j < 8; ++j) {
            if (g + j >= nb) {
                COLIBRI_UNROLL
                for (int t = 0; t < T; ++t) p[j][t] = _mm256_setzero_ps();
                continue;
            }
            prefetch_x8_block(w[g + j], once);
            const block_q8_x* xb[T];
            COLIBRI_UNROLL
            for (int t = 0; t < T; ++t) xb[t] = x + size_t(t) * x_stride + size_t(g + j);
            b32x8_column<Block, T, Vnni>(w[g + j], xb, p[j]);
        }
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            const __m256 lo = _mm256_add_ps(_mm256_add_ps(p[0][t], p[1][t]), _mm256_add_ps(p[2][t], p[3][t]));
            const __m256 hi = _mm256_add_ps(_mm256_add_ps(p[4][t], p[5][t]), _mm256_add_ps(p[6][t], p[7][t]));
            acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(lo, hi));
        }
    }
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + size_t(t) * out_stride, acc[t]);
}

// One group by T tokens, walked by its type's walk.
template <class Block, int T, bool Vnni>
void x8_walk(const Block* w, const block_q8_x* x, size_t x_stride, int64_t n, bool once, float* out,
             size_t out_stride) {
    if constexpr (b32x8_block<Block>) b32x8_walk<Block, T, Vnni>(w, x, x_stride, n, once, out, out_stride);
    else kx8_walk<Block, T, Vnni>(w, x, x_stride, n, once, out, out_stride);
}

// The tiles of the interleaved K, iq4_xs and 32-element types: each group by up to four
// tokens at a time.
template <class Block, bool Vnni>
void tile_kx8(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride, int n_tok,
              int64_t n, bool once, float* out) {
    for (int g = 0; g < n_groups; ++g) {
        const auto* w = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(groups) + size_t(g) * stride);
        for (int t0 = 0; t0 < n_tok; t0 += 4) {
            const block_q8_x* xt = x + size_t(t0) * x_stride;
            float* o = out + (size_t(t0) * size_t(n_groups) + size_t(g)) * 8;
            const size_t os = size_t(n_groups) * 8;
            switch (std::min(4, n_tok - t0)) {
            case 1: x8_walk<Block, 1, Vnni>(w, xt, x_stride, n, once, o, os); break;
            case 2: x8_walk<Block, 2, Vnni>(w, xt, x_stride, n, once, o, os); break;
            case 3: x8_walk<Block, 3, Vnni>(w, xt, x_stride, n, once, o, os); break;
            default: x8_walk<Block, 4, Vnni>(w, xt, x_stride, n, once, o, os); break;
            }
        }
    }
}

// Decode's four streams: each group walked with its own activations, read once.
template <class Block, bool Vnni>
void streams_b32x8(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    COLIBRI_UNROLL
    for (int g = 0; g < 4; ++g)
        b32x8_walk<Block, 1, Vnni>(static_cast<const Block*>(groups[g]), x[g], 0, n, true, out + 8 * g, 0);
}

} // namespace
} // namespace colibri
