#include "cpu/kernels.h"

#include "core/error.h"
#include "core/half.h"
#include "core/softmax.h"
#include "cpu/k_quants.h"
#include "format/gguf_blocks.h"
#include "format/model_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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

void to_f32_row(dtype t, const void* row, float* out, int64_t n) {
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
    case dtype::q3_k: {
        const dtype rt = format::row_type(t);
        const int be = format::read_only_block_elements(rt);
        const uint64_t bb = format::row_bytes(rt, uint64_t(be));
        for (int64_t ib = 0; ib < n / be; ++ib) {
            format::read_only_block_to_f32(rt, static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, out + ib * be);
        }
        return;
    }
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:
    case dtype::q4_kx8: // a row in its plain form (format::x8_row)
    case dtype::q5_kx8:
    case dtype::q6_kx8: {
        const uint64_t bb = format::row_bytes(t, format::qk_k);
        for (int64_t ib = 0; ib < n / format::qk_k; ++ib) {
            k_block_to_f32(format::row_type(t), static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, out + ib * format::qk_k);
        }
        return;
    }
    case dtype::f32: std::memcpy(out, row, static_cast<size_t>(n) * 4); return;
    case dtype::f16: {
        const auto* p = static_cast<const uint16_t*>(row);
        for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
        return;
    }
    case dtype::bf16: {
        const auto* p = static_cast<const uint16_t*>(row);
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
        return;
    }
    case dtype::q8_0:
    case dtype::q8_0x8: { // a row in its q8_0 form (format::x8_row)
        const auto* b = static_cast<const block_q8_0*>(row);
        for (int64_t ib = 0; ib < n / format::qk; ++ib) {
            const float d = f16_to_f32(b[ib].d);
            for (int i = 0; i < format::qk; ++i) out[ib * format::qk + i] = d * b[ib].qs[i];
        }
        return;
    }
    case dtype::q4_0:
    case dtype::q4_0x8: { // a row in its q4_0 form (format::x8_row)
        const auto* b = static_cast<const block_q4_0*>(row);
        for (int64_t ib = 0; ib < n / format::qk; ++ib) {
            const float d = f16_to_f32(b[ib].d);
            for (int i = 0; i < format::qk / 2; ++i) {
                out[ib * format::qk + i] = d * static_cast<float>((b[ib].qs[i] & 0x0F) - 8);
                out[ib * format::qk + i + 16] = d * static_cast<float>((b[ib].qs[i] >> 4) - 8);
            }
        }
        return;
    }
    }
}

void embed_rows(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) {
    const int64_t cols = static_cast<int64_t>(table.cols());
    const uint64_t rb = format::row_bytes(table.type, table.cols());
    const bool x8 = format::is_interleaved(table.type);
    std::vector<uint8_t> row(x8 ? rb : 0);
    for (int t = 0; t < n; ++t) {
        float* o = out + t * cols;
        const uint8_t* src = table.data + uint64_t(ids[t]) * rb;
        if (x8) {
            format::x8_row(table.type, table.data, table.cols(), uint64_t(ids[t]), row.data()); // in plain form
            src = row.data();
        }
        to_f32_row(table.type, src, o, cols);
        if (scale != 1.0f) {
            for (int64_t i = 0; i < cols; ++i) o[i] *= scale;
        }
    }
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
    case dtype::q3_k: { // each block in f32, its dot in one sum per 32 elements
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
            k_block_to_f32(format::row_type(t), static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, w);
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

void from_f32_row(dtype t, const float* x, void* out, int64_t n) {
    switch (t) {
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::iq4_nl:
    case dtype::iq4_xs:
    case dtype::iq4_xsx8:
    case dtype::q4_1x8:
    case dtype::q5_0x8:
    case dtype::q5_1x8:
    case dtype::iq4_nlx8:
    case dtype::q2_k:
    case dtype::q3_k: throw error(errc::invalid_argument, "no quantiser for " + std::string(format::dtype_name(t)) + " (kept as GGUF files store it)");
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:
    case dtype::q4_kx8: // a row in its plain form (format::x8_row)
    case dtype::q5_kx8:
    case dtype::q6_kx8: {
        const size_t bytes = format::row_bytes(t, format::qk_k);
        for (int64_t ib = 0; ib < n / format::qk_k; ++ib) {
            k_block_from_f32(format::row_type(t), x + ib * format::qk_k, static_cast<uint8_t*>(out) + size_t(ib) * bytes);
        }
        return;
    }
    case dtype::f32: std::memcpy(out, x, static_cast<size_t>(n) * 4); return;
    case dtype::f16: {
        auto* p = static_cast<uint16_t*>(out);
        for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(x[i]);
        return;
    }
    case dtype::bf16: {
        auto* p = static_cast<uint16_t*>(out);
        for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(x[i]);
        return;
    }
    case dtype::q8_0:
    case dtype::q8_0x8: { // a row in its q8_0 form (format::x8_row)
        auto* b = static_cast<block_q8_0*>(out);
        for (int64_t ib = 0; ib < n / format::qk; ++ib) {
            const float* xb = x + ib * format::qk;
            // symmetric: the largest magnitude maps to +-127
            float amax = 0.0f;
            for (int i = 0; i < format::qk; ++i) amax = std::max(amax, std::fabs(xb[i]));
            const uint16_t dh = f32_to_f16(amax / 127.0f);
            const float d = f16_to_f32(dh);
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            b[ib].d = dh;
            for (int i = 0; i < format::qk; ++i) {
                b[ib].qs[i] = static_cast<int8_t>(std::clamp(std::nearbyint(xb[i] * id), -127.0f, 127.0f));
            }
        }
        return;
    }
    case dtype::q4_0:
    case dtype::q4_0x8: { // a row in its q4_0 form (format::x8_row)
        auto* b = static_cast<block_q4_0*>(out);
        for (int64_t ib = 0; ib < n / format::qk; ++ib) {
            const float* xb = x + ib * format::qk;
            // The value of largest magnitude anchors the scale; a few nearby scales are tried
            // and the one with the least squared error kept (its d fitted by least squares).
            float max = 0.0f;
            for (int i = 0; i < format::qk; ++i) {
                if (std::fabs(xb[i]) > std::fabs(max)) max = xb[i];
            }
            int8_t best_q[format::qk] = {};
            float best_d = 0.0f;
            if (max != 0.0f) {
                double best_err = -1.0;
                for (int step = -6; step <= 6; ++step) {
                    const float iscale = (-8.0f + 0.25f * static_cast<float>(step)) / max;
                    int8_t q[format::qk];
                    double sxq = 0, sqq = 0, sxx = 0;
                    for (int i = 0; i < format::qk; ++i) {
                        q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(xb[i] * iscale), -8.0f, 7.0f));
                        sxq += double(xb[i]) * q[i];
                        sqq += double(q[i]) * q[i];
                        sxx += double(xb[i]) * xb[i];
                    }
                    if (sqq == 0) continue;
                    const double err = sxx - sxq * sxq / sqq; // residual of the least-squares d
                    if (best_err < 0 || err < best_err) {
                        best_err = err;
                        best_d = static_cast<float>(sxq / sqq);
                        std::copy_n(q, format::qk, best_q);
                    }
                }
            }
            b[ib].d = f32_to_f16(best_d);
            for (int i = 0; i < format::qk / 2; ++i) {
                b[ib].qs[i] = static_cast<uint8_t>((best_q[i] + 8) | ((best_q[i + 16] + 8) << 4));
            }
        }
        return;
    }
    }
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

void attend_softcapped(const float* q, int n_q, const void* k_cache, const void* v_cache, bool f16, int64_t first, int n,
                       int head_dim, float scale, float cap, float* scores, float* out) {
    const auto at = [&](const void* cache, int64_t i) {
        return f16 ? f16_to_f32(static_cast<const uint16_t*>(cache)[first + i]) : static_cast<const float*>(cache)[first + i];
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

