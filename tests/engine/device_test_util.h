#pragma once
// Weight matrices of every type for the device tests.

#include "cpu/kernels.h"
#include "format/format.h"
#include "format/model_file.h"

#include <cstdint>
#include <random>
#include <vector>

namespace colibri::test {

inline constexpr format::dtype device_test_types[] = {format::dtype::f32,  format::dtype::f16,    format::dtype::bf16,
                                                      format::dtype::q8_0, format::dtype::q4_0,   format::dtype::q8_0x8,
                                                      format::dtype::q4_0x8};

/// Random normal values stored as `type` (q4_0x8 and q8_0x8 interleaved), and its view.
struct test_matrix {
    std::vector<uint8_t> bytes;
    tensor_view view;
};

inline test_matrix make_matrix(format::dtype type, int64_t rows, int64_t cols, uint64_t seed) {
    const format::dtype plain = format::row_type(type);
    const uint64_t rb = format::row_bytes(plain, uint64_t(cols));
    std::vector<uint8_t> plain_rows(size_t(rows) * rb);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = normal(rng);
        kernels::from_f32_row(plain, row.data(), plain_rows.data() + uint64_t(r) * rb, cols);
    }
    test_matrix m;
    if (format::is_interleaved(type)) {
        m.bytes.resize(plain_rows.size());
        format::interleave_x8(type, plain_rows.data(), uint64_t(rows), uint64_t(cols), m.bytes.data());
    } else {
        m.bytes = std::move(plain_rows);
    }
    m.view.name = "test";
    m.view.type = type;
    m.view.n_dims = 2;
    m.view.shape[0] = uint64_t(rows);
    m.view.shape[1] = uint64_t(cols);
    m.view.data = m.bytes.data(); // the vector's memory: it moves with the struct
    m.view.size = m.bytes.size();
    return m;
}

/// A vector of n random f32 values (a norm's weight, a bias) and its view.
inline test_matrix make_vector(int64_t n, uint64_t seed, float mean = 0.0f) {
    test_matrix m = make_matrix(format::dtype::f32, 1, n, seed);
    auto* f = reinterpret_cast<float*>(m.bytes.data());
    for (int64_t i = 0; i < n; ++i) f[i] += mean;
    m.view.n_dims = 1;
    m.view.shape[0] = uint64_t(n);
    m.view.shape[1] = 0;
    return m;
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, float sd = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
}

} // namespace colibri::test
