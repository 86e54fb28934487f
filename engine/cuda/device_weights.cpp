#include "cuda/device_weights.h"

#include "core/error.h"
#include "core/half.h"
#include "format/format.h"
#include "format/gguf_blocks.h"

#include <cstring>
#include <string>
#include <string_view>

namespace colibri {

using format::dtype;

namespace {

// The device layout of a type; throws for one it has none for.
device_kind kind_of(dtype t, std::string_view name) {
    switch (format::row_type(t)) {
    case dtype::f32: return device_kind::f32;
    case dtype::f16: return device_kind::f16;
    case dtype::bf16: return device_kind::bf16;
    case dtype::q8_0: return device_kind::q8;
    case dtype::q4_0: return device_kind::q4;
    case dtype::q4_1:
    case dtype::q4_k: return device_kind::q4m;
    case dtype::iq4_nl:
    case dtype::iq4_xs: return device_kind::iq4;
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::q5_k:
    case dtype::q6_k:
    case dtype::q2_k:
    case dtype::q3_k: return device_kind::q8m;
    default:
        throw error(errc::unsupported,
                    "tensor " + std::string(name) + ": no device layout for " + std::string(format::dtype_name(t)));
    }
}

int64_t value_bytes(device_kind k, int64_t cols) {
    switch (k) {
    case device_kind::f32: return cols * 4;
    case device_kind::f16:
    case device_kind::bf16: return cols * 2;
    case device_kind::q8:
    case device_kind::q8m: return cols;
    case device_kind::q4:
    case device_kind::q4m:
    case device_kind::iq4: return cols / 2;
    }
    return 0;
}

// Block b (32 elements) of a plain row of one of GGUF's types as integers: x_i = d[i / 16] q_i +
// m[i / 16], each product and sum as the CPU's dequantisation computes it (iq4 types: q the
// nibble, x_i = d iq4_values[q_i]).
struct int_block {
    int8_t q[32];
    float d[2], m[2];
};

int_block block_ints(dtype t, const uint8_t* row, int64_t b) {
    int_block o{};
    if (t == dtype::q4_1 || t == dtype::q5_0 || t == dtype::q5_1) {
        const format::block32_ints k = format::block32_to_ints(t, row + b * int64_t(format::row_bytes(t, format::qk)));
        for (int i = 0; i < 32; ++i) o.q[i] = static_cast<int8_t>(k.q[i] - k.offset);
        o.d[0] = o.d[1] = k.d;
        o.m[0] = o.m[1] = k.has_min ? k.m : 0.0f;
        return o;
    }
    if (t == dtype::iq4_nl) {
        const auto& k = reinterpret_cast<const format::block_iq4_nl*>(row)[b];
        for (int i = 0; i < 16; ++i) {
            o.q[i] = static_cast<int8_t>(k.qs[i] & 15);
            o.q[i + 16] = static_cast<int8_t>(k.qs[i] >> 4);
        }
        o.d[0] = o.d[1] = f16_to_f32(k.d);
        return o;
    }
    const int j = static_cast<int>(b % 8); // the sub-block of a super-block of 256
    const uint8_t* sb = row + b / 8 * int64_t(format::row_bytes(t, format::qk_k));
    switch (t) {
    case dtype::q4_k:
    case dtype::q5_k: {
        const auto& k = *reinterpret_cast<const format::block_q4_k*>(sb);
        const auto& k5 = *reinterpret_cast<const format::block_q5_k*>(sb);
        int sc, mn;
        format::k_scale_min(k.scales, j, sc, mn);
        const uint8_t* qs = t == dtype::q5_k ? k5.qs : k.qs;
        for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
            if (t == dtype::q5_k) q |= ((k5.qh[l] >> j) & 1) << 4;
            o.q[l] = static_cast<int8_t>(q);
        }
        o.d[0] = o.d[1] = f16_to_f32(k.d) * static_cast<float>(sc);
        o.m[0] = o.m[1] = -(f16_to_f32(k.dmin) * static_cast<float>(mn));
        return o;
    }
    case dtype::q6_k: {
        const auto& k = *reinterpret_cast<const format::block_q6_k*>(sb);
        const int h = j / 4, c = j % 4;
        for (int l = 0; l < 32; ++l) {
            const int lo = (k.ql[64 * h + 32 * (c % 2) + l] >> (4 * (c / 2))) & 15,
                      hi = (k.qh[32 * h + l] >> (2 * c)) & 3;
            o.q[l] = static_cast<int8_t>((lo | (hi << 4)) - 32);
        }
        for (int half = 0; half < 2; ++half) o.d[half] = f16_to_f32(k.d) * static_cast<float>(k.scales[2 * j + half]);
        return o;
    }
    case dtype::q2_k: {
        const auto& k = *reinterpret_cast<const format::block_q2_k*>(sb);
        for (int l = 0; l < 32; ++l) o.q[l] = static_cast<int8_t>(format::k_low2(k.qs, 32 * j + l));
        for (int half = 0; half < 2; ++half) {
            o.d[half] = f16_to_f32(k.d) * static_cast<float>(k.scales[2 * j + half] & 15);
            o.m[half] = -(f16_to_f32(k.dmin) * static_cast<float>(k.scales[2 * j + half] >> 4));
        }
        return o;
    }
    case dtype::q3_k: {
        const auto& k = *reinterpret_cast<const format::block_q3_k*>(sb);
        for (int l = 0; l < 32; ++l) {
            o.q[l] = static_cast<int8_t>(format::k_low2(k.qs, 32 * j + l) - ((k.hmask[l] >> j) & 1 ? 0 : 4));
        }
        for (int half = 0; half < 2; ++half)
            o.d[half] = f16_to_f32(k.d) * static_cast<float>(format::q3_k_scale(k, 2 * j + half));
        return o;
    }
    case dtype::iq4_xs: {
        const auto& k = *reinterpret_cast<const format::block_iq4_xs*>(sb);
        for (int i = 0; i < 16; ++i) {
            o.q[i] = static_cast<int8_t>(k.qs[16 * j + i] & 15);
            o.q[i + 16] = static_cast<int8_t>(k.qs[16 * j + i] >> 4);
        }
        o.d[0] = o.d[1] = f16_to_f32(k.d) * static_cast<float>(format::iq4_xs_scale(k, j));
        return o;
    }
    default: break;
    }
    COLIBRI_ASSERT(false);
    return o;
}

} // namespace

int64_t packed_weights::row_value_bytes() const { return value_bytes(kind, cols); }

uint64_t packed_scale_bytes(const tensor_view& w) {
    return w.rows() * w.cols() / format::qk * uint64_t(scale_floats(kind_of(w.type, w.name))) * sizeof(float);
}

uint64_t packed_bytes(const tensor_view& w) {
    return w.rows() * uint64_t(value_bytes(kind_of(w.type, w.name), int64_t(w.cols()))) + packed_scale_bytes(w);
}

packed_weights pack_for_device(const tensor_view& w) {
    packed_weights p;
    p.rows = static_cast<int64_t>(w.rows());
    p.cols = static_cast<int64_t>(w.cols());
    p.kind = kind_of(w.type, w.name);
    const dtype plain = format::row_type(w.type);
    const uint64_t rb = format::row_bytes(plain, w.cols());
    const int64_t vb = p.row_value_bytes(), blocks = p.cols / format::qk, sf = scale_floats(p.kind);
    p.values.resize(size_t(p.rows * vb));
    p.scales.resize(size_t(p.rows * blocks * sf));
    std::vector<uint8_t> row(format::is_interleaved(w.type) ? rb : 0);
    for (int64_t r = 0; r < p.rows; ++r) {
        const uint8_t* src = w.data + uint64_t(r) * rb;
        if (format::is_interleaved(w.type)) {
            format::x8_row(w.type, w.data, w.cols(), uint64_t(r), row.data());
            src = row.data();
        }
        uint8_t* dst = p.values.data() + r * vb;
        float* d = p.scales.data() + r * blocks * sf;
        for (int64_t b = 0; b < blocks && sf > 0; ++b) {
            if (p.kind == device_kind::q8) {
                format::block_q8_0 blk;
                std::memcpy(&blk, src + b * int64_t(sizeof blk), sizeof blk);
                d[b] = f16_to_f32(blk.d);
                std::memcpy(dst + b * 32, blk.qs, 32);
            } else if (p.kind == device_kind::q4) {
                format::block_q4_0 blk;
                std::memcpy(&blk, src + b * int64_t(sizeof blk), sizeof blk);
                d[b] = f16_to_f32(blk.d);
                std::memcpy(dst + b * 16, blk.qs, 16);
            } else {
                const int_block k = block_ints(plain, src, b);
                if (p.kind == device_kind::q8m) {
                    std::memcpy(dst + b * 32, k.q, 32);
                    const float s[4] = {k.d[0], k.m[0], k.d[1], k.m[1]};
                    std::memcpy(d + 4 * b, s, sizeof s);
                } else { // q4m, iq4: nibbles
                    for (int i = 0; i < 16; ++i) dst[b * 16 + i] = static_cast<uint8_t>(k.q[i] | (k.q[i + 16] << 4));
                    d[sf * b] = k.d[0];
                    if (p.kind == device_kind::q4m) d[2 * b + 1] = k.m[0];
                }
            }
        }
        if (sf == 0) std::memcpy(dst, src, size_t(vb));
    }
    return p;
}

void packed_row_to_f32(const packed_weights& p, int64_t r, float* out) {
    const uint8_t* v = p.values.data() + r * p.row_value_bytes();
    const int sf = scale_floats(p.kind);
    const float* d = p.scales.data() + r * (p.cols / format::qk) * sf;
    for (int64_t c = 0; c < p.cols; ++c) {
        const float* s = d + (c / 32) * sf; // the block's scale data
        const auto nibble = [&] {
            const uint8_t byte = v[(c / 32) * 16 + c % 16];
            return c % 32 < 16 ? byte & 15 : byte >> 4;
        };
        switch (p.kind) {
        case device_kind::f32: std::memcpy(&out[c], v + c * 4, 4); break;
        case device_kind::f16:
        case device_kind::bf16: {
            uint16_t h;
            std::memcpy(&h, v + c * 2, 2);
            out[c] = p.kind == device_kind::f16 ? f16_to_f32(h) : bf16_to_f32(h);
            break;
        }
        case device_kind::q8: out[c] = s[0] * float(int8_t(v[c])); break;
        case device_kind::q4: out[c] = s[0] * float(nibble() - 8); break;
        case device_kind::q4m: out[c] = s[0] * float(nibble()) + s[1]; break;
        case device_kind::iq4: out[c] = s[0] * float(format::iq4_values[nibble()]); break;
        case device_kind::q8m: {
            const float* h = s + 2 * (c % 32 / 16);
            out[c] = h[0] * float(int8_t(v[c])) + h[1];
            break;
        }
        }
    }
}

} // namespace colibri
