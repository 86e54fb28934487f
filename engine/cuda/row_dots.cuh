#pragma once
// The inner loop of every matrix product (cuda_matmul.cu, and the experts' products of
// cuda_moe.cu): blocks of 32 weights of a row dequantised in registers and dotted with up
// to T tokens' activations, a warp per row.

#include "cuda/common.cuh"

#include <cstring>

namespace colibri::cuda_detail {

constexpr int mm_rows = 8; // rows per thread block, one warp each
constexpr int mm_tokens = 8;

// Block b (32 elements) of a row in f32; `scales` the row's, kind_scales<K> per block.
template <device_kind K>
__device__ inline void load_block(const uint8_t* row, const float* scales, int64_t b, float w[32]) {
    if constexpr (K == device_kind::q4m || K == device_kind::iq4) {
        constexpr float iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const int4 v = *reinterpret_cast<const int4*>(row + b * 16);
        const uint8_t* q = reinterpret_cast<const uint8_t*>(&v);
        const float d = scales[kind_scales<K> * b], m = K == device_kind::q4m ? scales[2 * b + 1] : 0.0f;
        COLIBRI_UNROLL
        for (int j = 0; j < 16; ++j) {
            if constexpr (K == device_kind::q4m) {
                w[j] = d * float(q[j] & 15) + m;
                w[j + 16] = d * float(q[j] >> 4) + m;
            } else {
                w[j] = d * iq4[q[j] & 15];
                w[j + 16] = d * iq4[q[j] >> 4];
            }
        }
    } else if constexpr (K == device_kind::q8m) {
        const int4* p = reinterpret_cast<const int4*>(row + b * 32);
        const int4 v[2] = {p[0], p[1]};
        const int8_t* q = reinterpret_cast<const int8_t*>(v);
        const float* s = scales + 4 * b; // d, m of elements 0-15, then of 16-31
        COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) w[i] = s[2 * (i / 16)] * float(q[i]) + s[2 * (i / 16) + 1];
    } else if constexpr (K == device_kind::q8) {
        const int4* p = reinterpret_cast<const int4*>(row + b * 32);
        const int4 v[2] = {p[0], p[1]};
        const int8_t* q = reinterpret_cast<const int8_t*>(v);
        const float d = scales[b];
        COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) w[i] = d * float(q[i]);
    } else if constexpr (K == device_kind::q4) {
        const int4 v = *reinterpret_cast<const int4*>(row + b * 16);
        const uint8_t* q = reinterpret_cast<const uint8_t*>(&v);
        const float d = scales[b];
        COLIBRI_UNROLL
        for (int j = 0; j < 16; ++j) {
            w[j] = d * float(int(q[j] & 15) - 8);
            w[j + 16] = d * float(int(q[j] >> 4) - 8);
        }
    } else if constexpr (K == device_kind::f16 || K == device_kind::bf16) {
        const int4* p = reinterpret_cast<const int4*>(row + b * 64);
        const int4 v[4] = {p[0], p[1], p[2], p[3]};
        uint16_t h[32];
        memcpy(h, v, sizeof h);
        COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) {
            w[i] = K == device_kind::f16 ? __half2float(__ushort_as_half(h[i])) : __uint_as_float(uint32_t(h[i]) << 16);
        }
    } else {
        const float4* p = reinterpret_cast<const float4*>(row + b * 128);
        COLIBRI_UNROLL
        for (int i = 0; i < 8; ++i) {
            const float4 v = p[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    }
}

// acc[t] = this lane's part of row . xs[t] for t < nt: blocks lane, lane + 32, ... of the
// row's cols / 32 (the warp's sum is the dot product).
template <device_kind K, int T>
__device__ inline void row_dots(const uint8_t* row, const float* sc, int64_t cols, const float* const xs[T], int nt,
                                float acc[T]) {
    const int lane = threadIdx.x & 31;
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    for (int64_t b = lane; b < cols / 32; b += 32) {
        float w[32];
        load_block<K>(row, sc, b, w);
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            if (t >= nt) break;
            const float4* xv = reinterpret_cast<const float4*>(xs[t] + b * 32);
            float s = 0.0f;
            COLIBRI_UNROLL
            for (int i = 0; i < 8; ++i) {
                const float4 v = xv[i];
                s += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
            }
            acc[t] += s;
        }
    }
}

} // namespace colibri::cuda_detail
