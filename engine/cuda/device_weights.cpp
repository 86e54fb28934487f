#include "cuda/device_weights.h"

#include "core/error.h"
#include "core/half.h"
#include "format/format.h"

#include <cstring>

namespace colibri {

using format::dtype;

int64_t packed_weights::row_value_bytes() const {
    switch (kind) {
    case device_kind::f32: return cols * 4;
    case device_kind::f16:
    case device_kind::bf16: return cols * 2;
    case device_kind::q8: return cols;
    case device_kind::q4: return cols / 2;
    }
    return 0;
}

uint64_t packed_bytes(const tensor_view& w) {
    const uint64_t n = w.rows() * w.cols();
    switch (format::row_type(w.type)) {
    case dtype::f32: return n * 4;
    case dtype::f16:
    case dtype::bf16: return n * 2;
    case dtype::q8_0: return n + n / format::qk * 4;
    case dtype::q4_0: return n / 2 + n / format::qk * 4;
    default: return 0;
    }
}

packed_weights pack_for_device(const tensor_view& w) {
    packed_weights p;
    p.rows = static_cast<int64_t>(w.rows());
    p.cols = static_cast<int64_t>(w.cols());
    const dtype plain = format::row_type(w.type);
    switch (plain) {
    case dtype::f32: p.kind = device_kind::f32; break;
    case dtype::f16: p.kind = device_kind::f16; break;
    case dtype::bf16: p.kind = device_kind::bf16; break;
    case dtype::q8_0: p.kind = device_kind::q8; break;
    case dtype::q4_0: p.kind = device_kind::q4; break;
    default:
        throw error(errc::unsupported, "tensor " + std::string(w.name) + ": no device layout for " +
                                           std::string(format::dtype_name(w.type)));
    }
    const uint64_t rb = format::row_bytes(plain, w.cols());
    const int64_t vb = p.row_value_bytes(), blocks = p.cols / format::qk;
    p.values.resize(size_t(p.rows * vb));
    const bool quantised = p.kind == device_kind::q8 || p.kind == device_kind::q4;
    if (quantised) p.scales.resize(size_t(p.rows * blocks));
    std::vector<uint8_t> row(format::is_interleaved(w.type) ? rb : 0);
    for (int64_t r = 0; r < p.rows; ++r) {
        const uint8_t* src = w.data + uint64_t(r) * rb;
        if (format::is_interleaved(w.type)) {
            format::x8_row(w.type, w.data, w.cols(), uint64_t(r), row.data());
            src = row.data();
        }
        uint8_t* dst = p.values.data() + r * vb;
        if (!quantised) {
            std::memcpy(dst, src, size_t(vb));
            continue;
        }
        float* d = p.scales.data() + r * blocks;
        for (int64_t b = 0; b < blocks; ++b) {
            if (p.kind == device_kind::q8) {
                format::block_q8_0 blk;
                std::memcpy(&blk, src + b * sizeof blk, sizeof blk);
                d[b] = f16_to_f32(blk.d);
                std::memcpy(dst + b * 32, blk.qs, 32);
            } else {
                format::block_q4_0 blk;
                std::memcpy(&blk, src + b * sizeof blk, sizeof blk);
                d[b] = f16_to_f32(blk.d);
                std::memcpy(dst + b * 16, blk.qs, 16);
            }
        }
    }
    return p;
}

void packed_row_to_f32(const packed_weights& p, int64_t r, float* out) {
    const uint8_t* v = p.values.data() + r * p.row_value_bytes();
    const float* d = p.scales.data() + r * (p.cols / format::qk);
    for (int64_t c = 0; c < p.cols; ++c) {
        switch (p.kind) {
        case device_kind::f32: std::memcpy(&out[c], v + c * 4, 4); break;
        case device_kind::f16:
        case device_kind::bf16: {
            uint16_t h;
            std::memcpy(&h, v + c * 2, 2);
            out[c] = p.kind == device_kind::f16 ? f16_to_f32(h) : bf16_to_f32(h);
            break;
        }
        case device_kind::q8: out[c] = d[c / 32] * float(int8_t(v[c])); break;
        case device_kind::q4: {
            const uint8_t byte = v[(c / 32) * 16 + c % 16];
            out[c] = d[c / 32] * float((c % 32 < 16 ? byte & 15 : byte >> 4) - 8);
            break;
        }
        }
    }
}

} // namespace colibri
