#pragma once
// What the kernel and CPU backend tests share: the kernel tables this machine can run,
// random data, tolerances and weight matrices as files store them.

#include "core/half.h"
#include "core/softmax.h"
#include "cpu/kernel_table.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "device_test_util.h"
#include "format/row_codec.h"
#include "model/moe_routing.h"
#include "ops/backend.h"
#include "sampling/sampler.h"
#include "test_util.h"
#include "tools/machine_limits.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

using namespace colibri;
using format::dtype;

#if defined(COLIBRI_HAVE_AVX512_EMULATION)
namespace colibri {
// engine/cpu/kernel_table_avx512.cpp built on SIMDe (tests/engine/CMakeLists.txt)
const kernel_table* emulated_avx512_kernel_table(bool vnni);
} // namespace colibri
#endif

namespace kernel_test {

// Every SIMD table this machine can run: the ones its CPU supports, and both AVX-512 tables
// on emulated intrinsics (the only way to run them where the CPU has no AVX-512).
inline std::vector<const kernel_table*> simd_tables() {
    std::vector<const kernel_table*> v = supported_kernel_tables();
    v.pop_back(); // the scalar reference
#if defined(COLIBRI_HAVE_AVX512_EMULATION)
    for (bool vnni : {false, true}) {
        if (const kernel_table* k = emulated_avx512_kernel_table(vnni)) v.push_back(k);
    }
#endif
    return v;
}

// The scalar reference, then every SIMD table.
inline std::vector<const kernel_table*> all_tables() {
    std::vector<const kernel_table*> v = simd_tables();
    v.insert(v.begin(), &scalar_kernel_table());
    return v;
}

inline std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
    xorshift64s rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = scale * (2.0f * rng.uniform() - 1.0f);
    return v;
}

// Tolerance scaled by the magnitude of the summed terms: sum |a_i * b_i|.
inline double dot_tolerance(const float* a, const float* b, int64_t n, double rel) {
    double mag = 0;
    for (int64_t i = 0; i < n; ++i) mag += std::fabs(double(a[i]) * b[i]);
    return rel * mag + 1e-30;
}

inline std::vector<uint8_t> quantize(dtype t, const std::vector<float>& x, int64_t rows, int64_t cols) {
    std::vector<uint8_t> q(format::row_bytes(t, cols) * rows);
    for (int64_t r = 0; r < rows; ++r) {
        format::row_from_f32(t, x.data() + r * cols, q.data() + r * format::row_bytes(t, cols), cols);
    }
    return q;
}

// Weights of type t as a file stores them: quantised rows (K-quants and read-only types of
// random bits), interleaved by eights for the x8 types.
inline std::vector<uint8_t> stored_matrix(dtype t, const std::vector<float>& w, int64_t rows, int64_t cols) {
    const dtype plain = format::row_type(t);
    if (!format::is_interleaved(t) && (format::is_k_quant(t) || format::is_read_only(t))) {
        return test::random_k_rows(t, rows, cols, w.size() + uint64_t(t));
    }
    auto q = format::is_read_only(plain) ? test::random_k_rows(plain, rows, cols, w.size() + uint64_t(t))
                                         : quantize(plain, w, rows, cols);
    if (format::is_interleaved(t)) {
        const std::vector<uint8_t> rows_plain = q;
        format::interleave_x8(t, rows_plain.data(), uint64_t(rows), uint64_t(cols), q.data());
    }
    return q;
}

inline tensor_view matrix_view(dtype t, int64_t rows, int64_t cols, const std::vector<uint8_t>& q) {
    tensor_view tv;
    tv.type = t;
    tv.n_dims = 2;
    tv.shape[0] = uint64_t(rows);
    tv.shape[1] = uint64_t(cols);
    tv.data = q.data();
    tv.size = q.size();
    return tv;
}

} // namespace kernel_test

using namespace kernel_test;
