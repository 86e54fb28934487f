// The scalar kernel table: portable C++ for any CPU, whose fixed order of additions the
// SIMD tables reproduce; also int8_tile and int8_x8_kernels, which pick a table's entries.

#include "core/error.h"
#include "core/half.h"
#include "core/softmax.h"
#include "cpu/kernel_table.h"
#include "cpu/kernels.h"
#include "format/gguf_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>

namespace colibri {

using format::block_q4_0;
using format::block_q8_0;
using format::qk;

namespace {

float abs_max(const float* x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    return amax;
}

// One block of 32 values with the scale of values up to amax.
void quantize_block(const float* xb, float amax, block_q8_x& out) {
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out.d = d;
    out.sum = out.sum_lo = 0;
    for (int i = 0; i < qk; ++i) {
        out.qs[i] = static_cast<int8_t>(std::nearbyint(xb[i] * id));
        out.sum += out.qs[i];
        if (i < qk / 2) out.sum_lo += out.qs[i];
    }
    out.dsum = d * static_cast<float>(out.sum);
}

void quantize_x(const float* x, block_q8_x* out, int64_t n) {
    for (int64_t ib = 0; ib < n / qk; ++ib) quantize_block(x + ib * qk, abs_max(x + ib * qk, qk), out[ib]);
}

void quantize_x_k(const float* x, block_q8_x* out, int64_t n) {
    for (int64_t s = 0; s < n / format::qk_k; ++s) {
        const float* xs = x + s * format::qk_k;
        const float amax = abs_max(xs, format::qk_k);
        for (int j = 0; j < 8; ++j) quantize_block(xs + j * qk, amax, out[8 * s + j]);
        set_sum_pairs(out + 8 * s);
    }
}

// The integer tile kernels' arithmetic for one (row, vector) pair; see kernel_table.h.
float dot_q8_0(const block_q8_0* w, const block_q8_x* x, int64_t n) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        int32_t s[2] = {0, 0}; // exact integer dots of elements 0-15 and 16-31
        for (int i = 0; i < qk; ++i) s[i / 16] += int32_t(w[ib].qs[i]) * int32_t(x[ib].qs[i]);
        const float scale = f16_to_f32(w[ib].d) * x[ib].d;
        lo = std::fma(scale, static_cast<float>(s[0]), lo);
        hi = std::fma(scale, static_cast<float>(s[1]), hi);
    }
    return lo + hi;
}

float dot_q4_0(const block_q4_0* w, const block_q8_x* x, int64_t n) {
    float sum[2] = {0.0f, 0.0f}; // even and odd blocks
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        int32_t s = -8 * x[ib].sum; // the weights are nibbles - 8
        for (int i = 0; i < qk / 2; ++i) {
            s += (w[ib].qs[i] & 0x0F) * int32_t(x[ib].qs[i]);
            s += (w[ib].qs[i] >> 4) * int32_t(x[ib].qs[i + qk / 2]);
        }
        sum[ib % 2] = std::fma(f16_to_f32(w[ib].d) * x[ib].d, static_cast<float>(s), sum[ib % 2]);
    }
    return sum[0] + sum[1];
}

// K-quant rows: per 32-element sub-block j an exact integer sum, scaled into p[j]; each
// super-block's p added in a fixed tree, and the super-blocks one after another.
inline float sum8(const float p[8]) { return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])); }

template <format::dtype T>
float dot_k(const void* row, const block_q8_x* x, int64_t n) {
    using namespace format;
    float acc = 0.0f;
    const uint64_t bytes = row_bytes(T, qk_k);
    for (int64_t s = 0; s < n / qk_k; ++s) {
        const uint8_t* blk = static_cast<const uint8_t*>(row) + uint64_t(s) * bytes;
        const block_q8_x* xs = x + 8 * s;
        float p[8];
        if constexpr (T == dtype::q2_k || T == dtype::q3_k) {
            // two sub-blocks of 16 per activation block, each with its own scale (and min)
            const auto& b2 = *reinterpret_cast<const block_q2_k*>(blk);
            const auto& b3 = *reinterpret_cast<const block_q3_k*>(blk);
            for (int j = 0; j < 8; ++j) {
                int32_t a = 0, mins = 0;
                for (int half = 0; half < 2; ++half) {
                    const int k = 2 * j + half;
                    int32_t isum = 0, xsum = 0;
                    for (int l = 16 * half; l < 16 * half + 16; ++l) {
                        const int e = 32 * j + l;
                        int q = format::k_low2(T == dtype::q2_k ? b2.qs : b3.qs, e);
                        if constexpr (T == dtype::q3_k) q |= ((b3.hmask[l] >> j) & 1) << 2; // the value is q - 4
                        isum += q * int32_t(xs[j].qs[l]);
                        xsum += xs[j].qs[l];
                    }
                    if constexpr (T == dtype::q2_k) {
                        a += (b2.scales[k] & 15) * isum;
                        mins += (b2.scales[k] >> 4) * xsum;
                    } else {
                        a += format::q3_k_scale(b3, k) * (isum - 4 * xsum);
                    }
                }
                const float d = f16_to_f32(T == dtype::q2_k ? b2.d : b3.d);
                p[j] = (d * xs[j].d) * static_cast<float>(a);
                if constexpr (T == dtype::q2_k)
                    p[j] = std::fma(-(f16_to_f32(b2.dmin) * xs[j].d), static_cast<float>(mins), p[j]);
            }
        } else if constexpr (T == dtype::iq4_xs) {
            // quantize_x_k's activations, as q4_k's below (no mins)
            const auto& b = *reinterpret_cast<const block_iq4_xs*>(blk);
            const float d = f16_to_f32(b.d);
            float f = 0.0f;
            for (int j = 0; j < 8; ++j) {
                int32_t isum = 0;
                for (int l = 0; l < qk / 2; ++l) {
                    isum += iq4_values[b.qs[16 * j + l] & 15] * int32_t(xs[j].qs[l]);
                    isum += iq4_values[b.qs[16 * j + l] >> 4] * int32_t(xs[j].qs[l + 16]);
                }
                f = std::fma(d * static_cast<float>(format::iq4_xs_scale(b, j)), static_cast<float>(isum), f);
            }
            acc = std::fma(xs[0].d, f, acc);
            continue;
        } else if constexpr (T == dtype::q6_k) {
            const auto& b = *reinterpret_cast<const block_q6_k*>(blk);
            const float d = f16_to_f32(b.d);
            for (int j = 0; j < 8; ++j) { // j = 4h + k
                const int h = j / 4, k = j % 4;
                int32_t half[2] = {0, 0}; // elements 0-15 and 16-31, each with its own scale
                for (int l = 0; l < qk; ++l) {
                    const int lo = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
                    const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
                    half[l / 16] += ((lo | (hi << 4)) - 32) * int32_t(xs[j].qs[l]);
                }
                const int32_t a = b.scales[2 * j] * half[0] + b.scales[2 * j + 1] * half[1];
                p[j] = (d * xs[j].d) * static_cast<float>(a);
            }
        } else {
            // q4_k, q5_k with quantize_x_k's activations (one scale, xs[0].d): each sub-block's
            // sum into one multiply-add chain by the row's d sc (exact in f32), the mins as
            // one integer sum, then the activations' scale once
            constexpr bool five = T == dtype::q5_k;
            const auto& b4 = *reinterpret_cast<const block_q4_k*>(blk);
            const auto& b5 = *reinterpret_cast<const block_q5_k*>(blk);
            const uint8_t* qs = five ? b5.qs : b4.qs;
            const float d = f16_to_f32(b4.d), dmin = f16_to_f32(b4.dmin);
            float f = 0.0f;
            int32_t mins = 0;
            for (int j = 0; j < 8; ++j) {
                int sc, m;
                k_scale_min(b4.scales, j, sc, m);
                int32_t isum = 0;
                for (int l = 0; l < qk; ++l) {
                    int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                    if (five) q |= ((b5.qh[l] >> j) & 1) << 4;
                    isum += q * int32_t(xs[j].qs[l]);
                }
                f = std::fma(d * static_cast<float>(sc), static_cast<float>(isum), f);
                mins += m * xs[j].sum;
            }
            f = std::fma(-dmin, static_cast<float>(mins), f);
            acc = std::fma(xs[0].d, f, acc);
            continue;
        }
        acc += sum8(p);
    }
    return acc;
}

// q4_1, q5_0, q5_1, iq4_nl rows: each block's exact integer sum scaled into p[j] (with the
// offset folded into the integers, the min added in f32), the blocks eight at a time added
// as dot_k adds a super-block's (a short last group's missing blocks: zeros).
template <format::dtype T>
float dot_b32(const void* row, const block_q8_x* x, int64_t n) {
    const uint64_t bytes = format::row_bytes(T, qk);
    const int64_t nb = n / qk;
    float acc = 0.0f;
    for (int64_t g = 0; g < nb; g += 8) {
        float p[8] = {};
        for (int64_t j = 0; j < 8 && g + j < nb; ++j) {
            const format::block32_ints b =
                format::block32_to_ints(T, static_cast<const uint8_t*>(row) + uint64_t(g + j) * bytes);
            const block_q8_x& xb = x[g + j];
            int32_t isum = -b.offset * xb.sum;
            for (int i = 0; i < qk; ++i) isum += b.q[i] * int32_t(xb.qs[i]);
            p[j] = (b.d * xb.d) * static_cast<float>(isum);
            if (b.has_min) p[j] = std::fma(b.m, xb.dsum, p[j]);
        }
        acc += sum8(p);
    }
    return acc;
}

template <format::dtype T>
void tile_b32(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n, float* out) {
    for (int t = 0; t < n_tok; ++t) {
        for (int r = 0; r < 4; ++r)
            out[t * 4 + r] = dot_b32<T>(static_cast<const uint8_t*>(rows) + r * stride, x + t * x_stride, n);
    }
}

template <format::dtype T>
void tile_k(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n, float* out) {
    for (int t = 0; t < n_tok; ++t) {
        for (int r = 0; r < 4; ++r)
            out[t * 4 + r] = dot_k<T>(static_cast<const uint8_t*>(rows) + r * stride, x + t * x_stride, n);
    }
}

// Interleaved types: each row taken out of its group, then dot_b32 (the 32-element types)
// or dot_k.
template <format::dtype T>
void tile_kx8(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride, int n_tok,
              int64_t n, bool /*once*/, float* out) {
    std::vector<uint8_t> row(format::row_bytes(T, uint64_t(n)));
    for (int g = 0; g < n_groups; ++g) {
        for (int r = 0; r < 8; ++r) {
            format::x8_row(format::matmul_storage(T, 8), static_cast<const uint8_t*>(groups) + size_t(g) * stride,
                           uint64_t(n), uint64_t(r), row.data());
            for (int t = 0; t < n_tok; ++t) {
                const block_q8_x* xt = x + size_t(t) * x_stride;
                if constexpr (T == format::dtype::q4_1 || T == format::dtype::q5_0 || T == format::dtype::q5_1 ||
                              T == format::dtype::iq4_nl) {
                    out[(t * n_groups + g) * 8 + r] = dot_b32<T>(row.data(), xt, n);
                } else {
                    out[(t * n_groups + g) * 8 + r] = dot_k<T>(row.data(), xt, n);
                }
            }
        }
    }
}

template <format::dtype T>
void streams_kx8(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    for (int g = 0; g < 4; ++g) tile_kx8<T>(groups[g], 0, 1, x[g], 0, 1, n, true, out + 8 * g);
}

float dot_q4_0x8(const format::block_q4_0x8* g, int r, const block_q8_x* x, int64_t n) {
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        int32_t s = -8 * x[ib].sum; // the weights are nibbles - 8
        for (int k = 0; k < 4; ++k) {
            for (int j = 0; j < 4; ++j) {
                const uint8_t q = g[ib].qs[k][r][j]; // elements 4k + j and 4k + j + 16
                s += (q & 0x0F) * int32_t(x[ib].qs[4 * k + j]) + (q >> 4) * int32_t(x[ib].qs[16 + 4 * k + j]);
            }
        }
        sum = std::fma(f16_to_f32(g[ib].d[r]) * x[ib].d, static_cast<float>(s), sum);
    }
    return sum;
}

float dot_q8_0x8(const format::block_q8_0x8* g, int r, const block_q8_x* x, int64_t n) {
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / qk; ++ib) {
        int32_t s = 0;
        for (int k = 0; k < 8; ++k) {
            for (int j = 0; j < 4; ++j)
                s += int32_t(g[ib].qs[k][r][j]) * int32_t(x[ib].qs[4 * k + j]); // element 4k + j
        }
        sum = std::fma(f16_to_f32(g[ib].d[r]) * x[ib].d, static_cast<float>(s), sum);
    }
    return sum;
}

template <class Block, float (*dot)(const Block*, int, const block_q8_x*, int64_t)>
void tile_x8(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride, int n_tok,
             int64_t n, bool /*once*/, float* out) {
    for (int t = 0; t < n_tok; ++t) {
        for (int g = 0; g < n_groups; ++g) {
            const auto* w = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(groups) + g * stride);
            for (int r = 0; r < 8; ++r) out[(t * n_groups + g) * 8 + r] = dot(w, r, x + t * x_stride, n);
        }
    }
}

template <class Block, float (*dot)(const Block*, int, const block_q8_x*, int64_t)>
void streams_x8(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out) {
    for (int s = 0; s < 4; ++s) {
        for (int r = 0; r < 8; ++r) out[s * 8 + r] = dot(static_cast<const Block*>(groups[s]), r, x[s], n);
    }
}

template <class Block, float (*dot)(const Block*, const block_q8_x*, int64_t)>
void tile(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n, float* out) {
    for (int t = 0; t < n_tok; ++t) {
        for (int r = 0; r < 4; ++r) {
            const auto* w = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(rows) + r * stride);
            out[t * 4 + r] = dot(w, x + t * x_stride, n);
        }
    }
}

float dot_q8_0_f32(const void* row, const float* x, int64_t n) {
    return kernels::dot_row(format::dtype::q8_0, row, x, n);
}
float dot_q4_0_f32(const void* row, const float* x, int64_t n) {
    return kernels::dot_row(format::dtype::q4_0, row, x, n);
}
void dot4_q8_0_f32(const void* rows, size_t stride, const float* x, int64_t n, float* out) {
    for (int i = 0; i < 4; ++i) out[i] = dot_q8_0_f32(static_cast<const uint8_t*>(rows) + i * stride, x, n);
}
void dot4_q4_0_f32(const void* rows, size_t stride, const float* x, int64_t n, float* out) {
    for (int i = 0; i < 4; ++i) out[i] = dot_q4_0_f32(static_cast<const uint8_t*>(rows) + i * stride, x, n);
}
void dotx4_q8_0_f32(const void* row, const float* x, size_t x_stride, int64_t n, float* out) {
    for (int t = 0; t < 4; ++t) out[t] = dot_q8_0_f32(row, x + t * x_stride, n);
}
void dotx4_q4_0_f32(const void* row, const float* x, size_t x_stride, int64_t n, float* out) {
    for (int t = 0; t < 4; ++t) out[t] = dot_q4_0_f32(row, x + t * x_stride, n);
}
float dot_f32(const float* row, const float* x, int64_t n) { return kernels::dot_row(format::dtype::f32, row, x, n); }
void dotx4_f32(const float* row, const float* x, size_t x_stride, int64_t n, float* out) {
    for (int t = 0; t < 4; ++t) out[t] = dot_f32(row, x + t * x_stride, n);
}
void dot4_f32(const float* rows, size_t stride, const float* x, int64_t n, float* out) {
    for (int r = 0; r < 4; ++r) out[r] = dot_f32(rows + r * stride, x, n);
}
float dot_f16(const void* row, const float* x, int64_t n) { return kernels::dot_row(format::dtype::f16, row, x, n); }
float dot_bf16(const void* row, const float* x, int64_t n) { return kernels::dot_row(format::dtype::bf16, row, x, n); }

inline float as_f32(float x) { return x; }
inline float as_f32(uint16_t h) { return f16_to_f32(h); }

template <class T>
void attend_one(const float* q, int n_q, const T* k, const T* v, int n, int head_dim, float scale, float* scores,
                float* out, const T*, int) { // the next keys: a hint for memory, none here
    for (int g = 0; g < n_q; ++g) {
        const float* qg = q + g * head_dim;
        float* s = scores + g * n;
        float* o = out + g * head_dim;
        for (int j = 0; j < n; ++j) {
            float d = 0.0f;
            for (int i = 0; i < head_dim; ++i) d += as_f32(k[j * head_dim + i]) * qg[i];
            s[j] = d * scale;
        }
        softmax(s, n);
        std::fill_n(o, head_dim, 0.0f);
        for (int j = 0; j < n; ++j) {
            for (int i = 0; i < head_dim; ++i) o[i] += s[j] * as_f32(v[j * head_dim + i]);
        }
    }
}

template <class T>
void attend_t(const float* q, int64_t q_stride, int n_q, int n_tok, const T* k, const T* v, const int* n, int head_dim,
              float scale, float* scores, float* out, int64_t out_stride, const T* next_k, int next_n) {
    attend_by_token(attend_one<T>, q, q_stride, n_q, n_tok, k, v, n, head_dim, scale, scores, out, out_stride, next_k,
                    next_n);
}

void to_f16(const float* x, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

uint64_t read_sum(const void* p, size_t bytes, int streams) {
    const auto* u = static_cast<const uint64_t*>(p);
    const size_t part = bytes / 8 / size_t(streams);
    uint64_t s = 0;
    for (size_t i = 0; i < part; ++i) {
        for (int k = 0; k < streams; ++k) s += u[size_t(k) * part + i];
    }
    return s;
}

uint64_t madd_loop(int64_t iterations) {
    // 8 x 32 multiply-adds of bytes per iteration, as the SIMD tables count them
    volatile int8_t a = 3, b = 5;
    uint64_t acc = 0;
    for (int64_t i = 0; i < iterations * 8 * 32; ++i) acc += uint64_t(int(a) * int(b));
    return acc;
}

constexpr kernel_table table = {"scalar",
                                quantize_x,
                                quantize_x_k,
                                tile<block_q8_0, dot_q8_0>,
                                tile<block_q4_0, dot_q4_0>,
                                tile_k<format::dtype::q4_k>,
                                tile_k<format::dtype::q5_k>,
                                tile_k<format::dtype::q6_k>,
                                tile_b32<format::dtype::q4_1>,
                                tile_b32<format::dtype::q5_0>,
                                tile_b32<format::dtype::q5_1>,
                                tile_b32<format::dtype::iq4_nl>,
                                tile_k<format::dtype::iq4_xs>,
                                tile_k<format::dtype::q2_k>,
                                tile_k<format::dtype::q3_k>,
                                tile_x8<format::block_q4_0x8, dot_q4_0x8>,
                                tile_x8<format::block_q8_0x8, dot_q8_0x8>,
                                streams_x8<format::block_q4_0x8, dot_q4_0x8>,
                                streams_x8<format::block_q8_0x8, dot_q8_0x8>,
                                tile_kx8<format::dtype::q4_k>,
                                tile_kx8<format::dtype::q5_k>,
                                tile_kx8<format::dtype::q6_k>,
                                streams_kx8<format::dtype::q4_k>,
                                streams_kx8<format::dtype::q5_k>,
                                streams_kx8<format::dtype::q6_k>,
                                tile_kx8<format::dtype::iq4_xs>,
                                streams_kx8<format::dtype::iq4_xs>,
                                tile_kx8<format::dtype::q4_1>,
                                tile_kx8<format::dtype::q5_0>,
                                tile_kx8<format::dtype::q5_1>,
                                tile_kx8<format::dtype::iq4_nl>,
                                streams_kx8<format::dtype::q4_1>,
                                streams_kx8<format::dtype::q5_0>,
                                streams_kx8<format::dtype::q5_1>,
                                streams_kx8<format::dtype::iq4_nl>,
                                tile_kx8<format::dtype::q2_k>,
                                tile_kx8<format::dtype::q3_k>,
                                streams_kx8<format::dtype::q2_k>,
                                streams_kx8<format::dtype::q3_k>,
                                dot_q8_0_f32,
                                dot_q4_0_f32,
                                dot4_q8_0_f32,
                                dot4_q4_0_f32,
                                dotx4_q8_0_f32,
                                dotx4_q4_0_f32,
                                dot_f32,
                                dotx4_f32,
                                dot4_f32,
                                attend_t<float>,
                                attend_t<uint16_t>,
                                kernels::swiglu,
                                to_f16,
                                dot_f16,
                                dot_bf16,
                                read_sum,
                                madd_loop};

} // namespace

const kernel_table& scalar_kernel_table() { return table; }

decltype(kernel_table::tile_q8_0) int8_tile(const kernel_table& kt, format::dtype t) {
    switch (t) {
    case format::dtype::q8_0: return kt.tile_q8_0;
    case format::dtype::q4_0: return kt.tile_q4_0;
    case format::dtype::q4_k: return kt.tile_q4_k;
    case format::dtype::q5_k: return kt.tile_q5_k;
    case format::dtype::q6_k: return kt.tile_q6_k;
    case format::dtype::q4_1: return kt.tile_q4_1;
    case format::dtype::q5_0: return kt.tile_q5_0;
    case format::dtype::q5_1: return kt.tile_q5_1;
    case format::dtype::iq4_nl: return kt.tile_iq4_nl;
    case format::dtype::iq4_xs: return kt.tile_iq4_xs;
    case format::dtype::q2_k: return kt.tile_q2_k;
    case format::dtype::q3_k: return kt.tile_q3_k;
    default: throw error(errc::internal, "no integer tile for " + std::string(format::dtype_name(t)));
    }
}

x8_kernels int8_x8_kernels(const kernel_table& kt, format::dtype t) {
    switch (t) {
    case format::dtype::q4_0x8: return {kt.tile_q4_0x8, kt.streams_q4_0x8};
    case format::dtype::q8_0x8: return {kt.tile_q8_0x8, kt.streams_q8_0x8};
    case format::dtype::q4_kx8: return {kt.tile_q4_kx8, kt.streams_q4_kx8};
    case format::dtype::q5_kx8: return {kt.tile_q5_kx8, kt.streams_q5_kx8};
    case format::dtype::q6_kx8: return {kt.tile_q6_kx8, kt.streams_q6_kx8};
    case format::dtype::iq4_xsx8: return {kt.tile_iq4_xsx8, kt.streams_iq4_xsx8};
    case format::dtype::q4_1x8: return {kt.tile_q4_1x8, kt.streams_q4_1x8};
    case format::dtype::q5_0x8: return {kt.tile_q5_0x8, kt.streams_q5_0x8};
    case format::dtype::q5_1x8: return {kt.tile_q5_1x8, kt.streams_q5_1x8};
    case format::dtype::iq4_nlx8: return {kt.tile_iq4_nlx8, kt.streams_iq4_nlx8};
    case format::dtype::q2_kx8: return {kt.tile_q2_kx8, kt.streams_q2_kx8};
    case format::dtype::q3_kx8: return {kt.tile_q3_kx8, kt.streams_q3_kx8};
    default: throw error(errc::internal, "no interleaved kernels for " + std::string(format::dtype_name(t)));
    }
}

std::vector<const kernel_table*> supported_kernel_tables() {
    std::vector<const kernel_table*> v;
    for (const kernel_table* k : {avx512_kernel_table(), avx512_no_vnni_kernel_table(), avx2_kernel_table()}) {
        if (k != nullptr) v.push_back(k);
    }
    v.push_back(&table);
    return v;
}

const kernel_table& best_kernel_table() {
    static const kernel_table* best = [] {
        const std::vector<const kernel_table*> supported = supported_kernel_tables();
        const char* want = std::getenv("COLIBRI_CPU_KERNELS");
        if (want == nullptr || *want == '\0') return supported.front();
        std::string names;
        for (const kernel_table* k : supported) {
            if (std::string_view(k->name) == want) return k;
            names += (names.empty() ? "" : ", ") + std::string(k->name);
        }
        throw error(errc::invalid_argument, "COLIBRI_CPU_KERNELS='" + std::string(want) +
                                                "' names no kernel table this CPU supports (it supports: " + names +
                                                ")");
    }();
    return *best;
}

} // namespace colibri
