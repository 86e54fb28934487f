#pragma once
// A stored row's values in f32 and back, for every dtype: the reference every kernel's
// arithmetic is checked against, and the converter's quantiser.

#include "format/format.h"

#include <cstdint>

namespace colibri {
struct tensor_view;
}

namespace colibri::format {

// The row functions take an interleaved type's row in its plain form (x8_row): the layouts
// interleave whole groups of rows, not the elements of one.

/// Dequantises/converts one row of n elements of type t into f32.
void row_to_f32(dtype t, const void* row, float* out, int64_t n);

/// out[t] = row ids[t] of `table` in f32, times scale; out [n, table.cols()].
void rows_to_f32(const tensor_view& table, const int32_t* ids, int n, float scale, float* out);

/// Quantises/converts n f32 values into one row of type t (n a multiple of 32 for q types).
void row_from_f32(dtype t, const float* x, void* out, int64_t n);

} // namespace colibri::format
