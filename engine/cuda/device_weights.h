#pragma once
// The layout the CUDA backend keeps a weight tensor in on the device, built on the host
// from the mapped file. Plain C++ (no CUDA headers), so the repacking is tested on any
// machine.
//
// Every matrix is stored as rows of its elements' values, row after row, with the
// quantisation scales apart: a row's values then start on a 16-byte boundary (the GPU reads
// them sixteen bytes at a time) and a block of 32 elements is 32 bytes (q8), 16 bytes (q4)
// or 64/128 bytes (f16, bf16 / f32) of its row.
//   f32, f16, bf16: the values as stored.
//   q8 (q8_0, q8_0x8): int8 values; one f32 scale per block of 32: x = d * q.
//   q4 (q4_0, q4_0x8): a block's 16 bytes as in q4_0, byte j holding element j (low nibble)
//     and element j + 16 (high); one f32 scale per block: x = d * (nibble - 8).
// Interleaved matrices (q4_0x8, q8_0x8) are taken back to plain rows.

#include "format/model_file.h"

#include <cstdint>
#include <vector>

namespace colibri {

enum class device_kind { f32, f16, bf16, q8, q4 };

struct packed_weights {
    device_kind kind = device_kind::f32;
    int64_t rows = 0, cols = 0;
    std::vector<uint8_t> values; ///< [rows][row_value_bytes]
    std::vector<float> scales;   ///< q8, q4: [rows][cols / 32]
    int64_t row_value_bytes() const;
};

/// Bytes w takes on the device (values and scales), without repacking it.
uint64_t packed_bytes(const tensor_view& w);

/// w repacked for the device. Throws colibri::error (unsupported) for a type it has no
/// layout for.
packed_weights pack_for_device(const tensor_view& w);

/// Row r of a packed matrix in f32 (the reference the device kernels compute against).
void packed_row_to_f32(const packed_weights& p, int64_t r, float* out);

} // namespace colibri
