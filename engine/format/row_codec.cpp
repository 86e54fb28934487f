#include "format/row_codec.h"

#include "core/error.h"
#include "core/half.h"
#include "format/gguf_blocks.h"
#include "format/k_quants.h"
#include "format/model_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace colibri::format {

void row_to_f32(dtype t, const void* row, float* out, int64_t n) {
    switch (t) {
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::iq4_nl:
    case dtype::iq4_xs:
    case dtype::iq4_xsx8: // a row in its plain form (x8_row)
    case dtype::q4_1x8:
    case dtype::q5_0x8:
    case dtype::q5_1x8:
    case dtype::iq4_nlx8:
    case dtype::q2_k:
    case dtype::q3_k:
    case dtype::q2_kx8:
    case dtype::q3_kx8: {
        const dtype rt = row_type(t);
        const int be = read_only_block_elements(rt);
        const uint64_t bb = row_bytes(rt, uint64_t(be));
        for (int64_t ib = 0; ib < n / be; ++ib) {
            read_only_block_to_f32(rt, static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, out + ib * be);
        }
        return;
    }
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:
    case dtype::q4_kx8: // a row in its plain form (x8_row)
    case dtype::q5_kx8:
    case dtype::q6_kx8: {
        const uint64_t bb = row_bytes(t, qk_k);
        for (int64_t ib = 0; ib < n / qk_k; ++ib) {
            k_block_to_f32(row_type(t), static_cast<const uint8_t*>(row) + uint64_t(ib) * bb, out + ib * qk_k);
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
    case dtype::q8_0x8: { // a row in its q8_0 form (x8_row)
        const auto* b = static_cast<const block_q8_0*>(row);
        for (int64_t ib = 0; ib < n / qk; ++ib) {
            const float d = f16_to_f32(b[ib].d);
            for (int i = 0; i < qk; ++i) out[ib * qk + i] = d * b[ib].qs[i];
        }
        return;
    }
    case dtype::q4_0:
    case dtype::q4_0x8: { // a row in its q4_0 form (x8_row)
        const auto* b = static_cast<const block_q4_0*>(row);
        for (int64_t ib = 0; ib < n / qk; ++ib) {
            const float d = f16_to_f32(b[ib].d);
            for (int i = 0; i < qk / 2; ++i) {
                out[ib * qk + i] = d * static_cast<float>((b[ib].qs[i] & 0x0F) - 8);
                out[ib * qk + i + 16] = d * static_cast<float>((b[ib].qs[i] >> 4) - 8);
            }
        }
        return;
    }
    }
}

void rows_to_f32(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) {
    const int64_t cols = static_cast<int64_t>(table.cols());
    const uint64_t rb = row_bytes(table.type, table.cols());
    const bool x8 = is_interleaved(table.type);
    std::vector<uint8_t> row(x8 ? rb : 0);
    for (int t = 0; t < n; ++t) {
        float* o = out + t * cols;
        const uint8_t* src = table.data + uint64_t(ids[t]) * rb;
        if (x8) {
            x8_row(table.type, table.data, table.cols(), uint64_t(ids[t]), row.data()); // in plain form
            src = row.data();
        }
        row_to_f32(table.type, src, o, cols);
        if (scale != 1.0f) {
            for (int64_t i = 0; i < cols; ++i) o[i] *= scale;
        }
    }
}

void row_from_f32(dtype t, const float* x, void* out, int64_t n) {
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
    case dtype::q3_k:
    case dtype::q2_kx8:
    case dtype::q3_kx8:
        throw error(errc::invalid_argument,
                    "no quantiser for " + std::string(dtype_name(t)) + " (kept as GGUF files store it)");
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:
    case dtype::q4_kx8: // a row in its plain form (x8_row)
    case dtype::q5_kx8:
    case dtype::q6_kx8: {
        const size_t bytes = row_bytes(t, qk_k);
        for (int64_t ib = 0; ib < n / qk_k; ++ib) {
            k_block_from_f32(row_type(t), x + ib * qk_k, static_cast<uint8_t*>(out) + size_t(ib) * bytes);
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
    case dtype::q8_0x8: { // a row in its q8_0 form (x8_row)
        auto* b = static_cast<block_q8_0*>(out);
        for (int64_t ib = 0; ib < n / qk; ++ib) {
            const float* xb = x + ib * qk;
            // symmetric: the largest magnitude maps to +-127
            float amax = 0.0f;
            for (int i = 0; i < qk; ++i) amax = std::max(amax, std::fabs(xb[i]));
            const uint16_t dh = f32_to_f16(amax / 127.0f);
            const float d = f16_to_f32(dh);
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            b[ib].d = dh;
            for (int i = 0; i < qk; ++i) {
                b[ib].qs[i] = static_cast<int8_t>(std::clamp(std::nearbyint(xb[i] * id), -127.0f, 127.0f));
            }
        }
        return;
    }
    case dtype::q4_0:
    case dtype::q4_0x8: { // a row in its q4_0 form (x8_row)
        auto* b = static_cast<block_q4_0*>(out);
        for (int64_t ib = 0; ib < n / qk; ++ib) {
            const float* xb = x + ib * qk;
            // The value of largest magnitude anchors the scale; a few nearby scales are tried
            // and the one with the least squared error kept (its d fitted by least squares).
            float max = 0.0f;
            for (int i = 0; i < qk; ++i) {
                if (std::fabs(xb[i]) > std::fabs(max)) max = xb[i];
            }
            int8_t best_q[qk] = {};
            float best_d = 0.0f;
            if (max != 0.0f) {
                double best_err = -1.0;
                for (int step = -6; step <= 6; ++step) {
                    const float iscale = (-8.0f + 0.25f * static_cast<float>(step)) / max;
                    int8_t q[qk];
                    double sxq = 0, sqq = 0, sxx = 0;
                    for (int i = 0; i < qk; ++i) {
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
                        std::copy_n(q, qk, best_q);
                    }
                }
            }
            b[ib].d = f32_to_f16(best_d);
            for (int i = 0; i < qk / 2; ++i) {
                b[ib].qs[i] = static_cast<uint8_t>((best_q[i] + 8) | ((best_q[i + 16] + 8) << 4));
            }
        }
        return;
    }
    }
}

} // namespace colibri::format
