#include "cpu/kernels.h"

#include "core/half.h"
#include "core/softmax.h"
#include "format/gguf_blocks.h"
#include "format/k_quants.h"
#include "format/row_codec.h"

#include <algorithm>
#include <cmath>

namespace colibri::kernels {

using format::block_q4_0;
using format::block_q8_0;
using format::dtype;

void rmsnorm(float* out, const float* x, const float* w, int n, float eps) {
    // mean of squares, in sixteen independent sums (one chain of n adds is n times the
    // add's latency: about 1 us for a row of 1024, run for every layer of every token)
    constexpr int lanes = 16;
    float part[lanes] = {};
    int i = 0;
    for (; i + lanes <= n; i += lanes) {
        for (int k = 0; k < lanes; ++k) part[k] += x[i + k] * x[i + k];
    }
    for (; i < n; ++i) part[i % lanes] += x[i] * x[i];
    for (int width = lanes / 2; width > 0; width /= 2) { // pairwise
        for (int k = 0; k < width; ++k) part[k] += part[k + width];
    }
    const float ss = part[0];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    // normalise and scale
    for (i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

float dot_row(dtype t, const void* row, const float* x, int64_t n) {
    float sum = 0.0f;
    switch (t) {
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::iq4_nl:
    case dtype::iq4_xs:
    case dtype::iq4_xsx8: // a row in its plain form (format::x8_row)
    case dtype::q4_1x8:
    case dtype::q5_0x8:
    case dtype::q5_1x8:
    case dtype::iq4_nlx8:
    case dtype::q2_k:
    case dtype::q3_k:
    case dtype::q2_kx8:
    case dtype::q3_kx8: { // each block in f32, its dot in one sum per 32 elements
        const dtype rt = format::row_type(t);
        const int be = format::read_only_block_elements(rt);
        const uint64_t bb = format::row_bytes(rt, uint64_t(be));
        float w[format::qk_k];
        for (int64_t ib = 0; ib < n / be; ++ib) {
            format::read_only_block_to_f32(rt, static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, w);
            const float* xb = x + ib * be;
            for (int j = 0; j < be / format::qk; ++j) {
                float block = 0.0f;
                for (int i = 0; i < format::qk; ++i) block += w[32 * j + i] * xb[32 * j + i];
                sum += block;
            }
        }
        return sum;
    }
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:
    case dtype::q4_kx8: // a row in its plain form (format::x8_row)
    case dtype::q5_kx8:
    case dtype::q6_kx8: { // each super-block in f32, its dot in one sum per 32 elements
        const uint64_t bb = format::row_bytes(t, format::qk_k);
        float w[format::qk_k];
        for (int64_t ib = 0; ib < n / format::qk_k; ++ib) {
            format::k_block_to_f32(format::row_type(t), static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, w);
            const float* xb = x + ib * format::qk_k;
            for (int j = 0; j < format::qk_k / format::qk; ++j) {
                float block = 0.0f;
                for (int i = 0; i < format::qk; ++i) block += w[32 * j + i] * xb[32 * j + i];
                sum += block;
            }
        }
        return sum;
    }
    case dtype::f32: {
        const auto* p = static_cast<const float*>(row);
        for (int64_t i = 0; i < n; ++i) sum += p[i] * x[i];
        return sum;
    }
    case dtype::f16: {
        const auto* p = static_cast<const uint16_t*>(row);
        for (int64_t i = 0; i < n; ++i) sum += f16_to_f32(p[i]) * x[i];
        return sum;
    }
    case dtype::bf16: {
        const auto* p = static_cast<const uint16_t*>(row);
        for (int64_t i = 0; i < n; ++i) sum += bf16_to_f32(p[i]) * x[i];
        return sum;
    }
    case dtype::q8_0:
    case dtype::q8_0x8: { // a row in its q8_0 form (format::x8_row)
        const auto* b = static_cast<const block_q8_0*>(row);
        for (int64_t ib = 0; ib < n / format::qk; ++ib) {
            float block = 0.0f;
            for (int i = 0; i < format::qk; ++i) block += b[ib].qs[i] * x[ib * format::qk + i];
            sum += f16_to_f32(b[ib].d) * block;
        }
        return sum;
    }
    case dtype::q4_0:
    case dtype::q4_0x8: { // a row in its q4_0 form (format::x8_row)
        const auto* b = static_cast<const block_q4_0*>(row);
        for (int64_t ib = 0; ib < n / format::qk; ++ib) {
            const float* xb = x + ib * format::qk;
            float block = 0.0f;
            for (int i = 0; i < format::qk / 2; ++i) {
                block += static_cast<float>((b[ib].qs[i] & 0x0F) - 8) * xb[i];
                block += static_cast<float>((b[ib].qs[i] >> 4) - 8) * xb[i + 16];
            }
            sum += f16_to_f32(b[ib].d) * block;
        }
        return sum;
    }
    }
    return sum;
}

void rope_head(float* x, int head_dim, int pos, float theta, const float* freq_factors, float attn_factor) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; ++i) {
        // frequency of pair i, angle at this position
        double freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
        if (freq_factors != nullptr) freq /= freq_factors[i];
        const double angle = pos * freq;
        const float c = static_cast<float>(attn_factor * std::cos(angle));
        const float s = static_cast<float>(attn_factor * std::sin(angle));
        const float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

void gelu(float* x, int64_t n) {
    constexpr float k = 0.7978845608028654f; // sqrt(2 / pi)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        x[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
}

void attend_softcapped(const float* q, int n_q, const void* k_cache, const void* v_cache, bool f16, int64_t first,
                       int n, int head_dim, float scale, float cap, float* scores, float* out) {
    const auto at = [&](const void* cache, int64_t i) {
        return f16 ? f16_to_f32(static_cast<const uint16_t*>(cache)[first + i])
                   : static_cast<const float*>(cache)[first + i];
    };
    for (int g = 0; g < n_q; ++g) {
        const float* qg = q + int64_t(g) * head_dim;
        float* s = scores + int64_t(g) * n;
        for (int j = 0; j < n; ++j) {
            float d = 0.0f;
            for (int i = 0; i < head_dim; ++i) d += at(k_cache, int64_t(j) * head_dim + i) * qg[i];
            s[j] = cap * std::tanh(d * scale / cap);
        }
        softmax(s, n);
        float* o = out + int64_t(g) * head_dim;
        std::fill_n(o, head_dim, 0.0f);
        for (int j = 0; j < n; ++j) {
            for (int i = 0; i < head_dim; ++i) o[i] += s[j] * at(v_cache, int64_t(j) * head_dim + i);
        }
    }
}

void geglu(float* gate, const float* up, int64_t n) {
    gelu(gate, n);
    for (int64_t i = 0; i < n; ++i) gate[i] *= up[i];
}

void layernorm(float* out, const float* x, const float* w, const float* b, int n, float eps) {
    double mean = 0; // in double: the two passes must not lose the small variance of a large mean
    for (int i = 0; i < n; ++i) mean += x[i];
    mean /= n;
    double var = 0;
    for (int i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= n;
    const float m = static_cast<float>(mean), inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    for (int i = 0; i < n; ++i) out[i] = (x[i] - m) * inv * w[i] + b[i];
}

void swiglu(float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

} // namespace colibri::kernels
