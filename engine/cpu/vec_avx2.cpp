// AVX2 + FMA + F16C row kernels. This file alone is compiled with those instruction sets;
// it is only called after the CPU reported them.

#include "cpu/vec.h"

#if defined(__x86_64__)
#include <cstring>
#include <immintrin.h>

// No inline function from another header is used here: compiled with AVX2 in this file,
// the linker could pick that copy for the whole program (an ODR trap on older CPUs).

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

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Sum of products of 32 signed bytes, as 8 int32 lanes turned to floats.
inline __m256 dot_i8(__m256i a, __m256i b) {
    const __m256i ax = _mm256_sign_epi8(a, a);  // |a|, unsigned
    const __m256i sb = _mm256_sign_epi8(b, a);  // b with a's sign
    const __m256i p16 = _mm256_maddubs_epi16(ax, sb); // |a|,b in [-127,127]: no saturation
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

void quantize_x(const float* x, block_q8_x* out, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        const float* xb = x + ib * qk;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; ++j) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[ib].d = d;
        const __m256 mul = _mm256_set1_ps(id);
        __m256i i[4];
        for (int j = 0; j < 4; ++j) {
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        // pack 32 int32 -> 32 int8, then undo the lane interleaving of the packs
        __m256i p01 = _mm256_packs_epi32(i[0], i[1]);
        __m256i p23 = _mm256_packs_epi32(i[2], i[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[ib].qs), p);
    }
}

float dot_q8_0(const void* row, const block_q8_x* x, int64_t n) {
    const auto* w = static_cast<const block_q8_0*>(row);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[ib].qs));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[ib].qs));
        const __m256 d = _mm256_set1_ps(f16(w[ib].d) * x[ib].d);
        acc = _mm256_fmadd_ps(d, dot_i8(a, b), acc);
    }
    return hsum(acc);
}

float dot_q4_0(const void* row, const block_q8_x* x, int64_t n) {
    const auto* w = static_cast<const block_q4_0*>(row);
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        // 16 bytes -> low nibbles (elements 0..15) then high nibbles (16..31)
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[ib].qs));
        const __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
        const __m256i a = _mm256_sub_epi8(_mm256_and_si256(both, low), eight);
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[ib].qs));
        const __m256 d = _mm256_set1_ps(f16(w[ib].d) * x[ib].d);
        acc = _mm256_fmadd_ps(d, dot_i8(a, b), acc);
    }
    return hsum(acc);
}

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

float dot_f32(const float* row, const float* x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float sum = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) sum += row[i] * x[i];
    return sum;
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

uint64_t read_sum(const void* p, size_t bytes) {
    // four independent streams (quarters of the range) read in lockstep: more hardware
    // prefetch streams in flight than one sequential walk
    const auto* v = static_cast<const __m256i*>(p);
    const size_t quarter = bytes / 128; // in 32-byte vectors
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < quarter; i += 2) {
        a = _mm256_add_epi64(a, _mm256_add_epi64(_mm256_load_si256(v + i), _mm256_load_si256(v + i + 1)));
        b = _mm256_add_epi64(b, _mm256_add_epi64(_mm256_load_si256(v + quarter + i), _mm256_load_si256(v + quarter + i + 1)));
        c = _mm256_add_epi64(c, _mm256_add_epi64(_mm256_load_si256(v + 2 * quarter + i), _mm256_load_si256(v + 2 * quarter + i + 1)));
        d = _mm256_add_epi64(d, _mm256_add_epi64(_mm256_load_si256(v + 3 * quarter + i), _mm256_load_si256(v + 3 * quarter + i + 1)));
    }
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    alignas(32) uint64_t out[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
    return out[0] + out[1] + out[2] + out[3];
}

constexpr vec_kernels table = {"avx2", quantize_x, dot_q8_0, dot_q4_0, dot_f32_act<block_q8_0>, dot_f32_act<block_q4_0>, dot4_f32_act<block_q8_0>, dot4_f32_act<block_q4_0>,
                                dotx4_f32_act<block_q8_0>, dotx4_f32_act<block_q4_0>, dot_f32, dot_f16, dot_bf16, read_sum};

} // namespace

const vec_kernels* avx2_vec_kernels() {
    __builtin_cpu_init();
    const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
    return ok ? &table : nullptr;
}

} // namespace colibri

#else

namespace colibri {
const vec_kernels* avx2_vec_kernels() { return nullptr; }
} // namespace colibri

#endif
