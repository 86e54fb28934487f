#pragma once
// The layout the CUDA backend keeps a weight tensor in on the device, built on the host
// from the mapped file. Plain C++ (no CUDA headers), so the repacking is tested on any
// machine.
//
// Every matrix is stored as rows of its elements' values, row after row, with the
// quantisation scales apart: a row's values then start on a 16-byte boundary (the GPU reads
// them sixteen bytes at a time) and a block of 32 elements is 32 bytes (q8, q8m), 16 bytes
// (q4, q4m, iq4) or 64/128 bytes (f16, bf16 / f32) of its row. Every layout is exact: the
// values are the file's.
//   f32, f16, bf16: the values as stored.
//   q8 (q8_0, q8_0x8): int8 values; one f32 scale per block of 32: x = d * q.
//   q4 (q4_0, q4_0x8): a block's 16 bytes as in q4_0, byte j holding element j (low nibble)
//     and element j + 16 (high); one f32 scale per block: x = d * (nibble - 8).
//   q4m (q4_1, q4_k): nibbles as q4's; an f32 scale and min per block: x = d * nibble + m.
//   iq4 (iq4_nl, iq4_xs): nibbles as q4's; one f32 scale per block: x = d * iq4_values[nibble].
//   q8m (q5_0, q5_1, q5_k, q6_k, q2_k, q3_k): int8 values; an f32 scale and min per 16
//     elements: x = d * q + m.
// Interleaved matrices (the x8 types) are taken back to plain rows.

#include "format/model_file.h"

#include <cstdint>
#include <vector>

namespace colibri {

enum class device_kind { f32, f16, bf16, q8, q4, q4m, iq4, q8m };
inline constexpr int device_kind_count = 8;

/// f32 scale data per block of 32 elements: 0 (f32, f16, bf16), 1 (q8, q4, iq4: d), 2 (q4m:
/// d, m), 4 (q8m: d and m of elements 0-15, then of 16-31).
constexpr int scale_floats(device_kind k) {
    return k == device_kind::q8m                                                   ? 4
           : k == device_kind::q4m                                                 ? 2
           : k == device_kind::q8 || k == device_kind::q4 || k == device_kind::iq4 ? 1
                                                                                   : 0;
}

struct packed_weights {
    device_kind kind = device_kind::f32;
    int64_t rows = 0, cols = 0;
    std::vector<uint8_t> values; ///< [rows][row_value_bytes]
    std::vector<float> scales;   ///< [rows][cols / 32][scale_floats(kind)]
    int64_t row_value_bytes() const;
};

/// Bytes w takes on the device (values and scales), without repacking it; and of those, the
/// scales'.
uint64_t packed_bytes(const tensor_view& w);
uint64_t packed_scale_bytes(const tensor_view& w);

/// w repacked for the device. Throws colibri::error (unsupported) for a type it has no
/// layout for.
packed_weights pack_for_device(const tensor_view& w);

/// Row r of a packed matrix in f32 (the reference the device kernels compute against).
void packed_row_to_f32(const packed_weights& p, int64_t r, float* out);

} // namespace colibri
