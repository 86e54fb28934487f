#pragma once
// Weight matrices of every type for the device tests.

#include "core/half.h"
#include "format/format.h"
#include "format/model_file.h"
#include "format/row_codec.h"
#include "sampling/sampler.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace colibri::test {

inline constexpr format::dtype device_test_types[] = {format::dtype::f32,   format::dtype::f16,  format::dtype::bf16,
                                                      format::dtype::q8_0,  format::dtype::q4_0, format::dtype::q8_0x8,
                                                      format::dtype::q4_0x8};
/// The types read from GGUF files, blocks of 32 and super-blocks of 256 (x8: interleaved).
inline constexpr format::dtype device_gguf_types[] = {
    format::dtype::q4_1,   format::dtype::q5_0,     format::dtype::q5_1,   format::dtype::iq4_nl,
    format::dtype::q4_k,   format::dtype::q5_k,     format::dtype::q6_k,   format::dtype::q2_k,
    format::dtype::q3_k,   format::dtype::iq4_xs,   format::dtype::q4_kx8, format::dtype::q5_kx8,
    format::dtype::q6_kx8, format::dtype::iq4_xsx8, format::dtype::q4_1x8, format::dtype::q5_0x8,
    format::dtype::q5_1x8, format::dtype::iq4_nlx8, format::dtype::q2_kx8, format::dtype::q3_kx8};

// Rows of random bits, as GGUF files may hold them, for the types Colibri does not quantise
// to itself the way llama.cpp does (K-quants, read-only types), with finite scales of either
// sign: d, and dmin (q4_k, q5_k, q2_k) or m (q4_1, q5_1) after it.
inline std::vector<uint8_t> random_k_rows(format::dtype t, int64_t rows, int64_t cols, uint64_t seed) {
    using format::dtype;
    xorshift64s rng(seed);
    std::vector<uint8_t> q(format::row_bytes(t, uint64_t(cols)) * uint64_t(rows));
    for (auto& b : q) b = static_cast<uint8_t>(rng.next() >> 56);
    const size_t bb = format::row_bytes(t, uint64_t(format::block_elements(t)));
    const auto scale = [&] {
        return f32_to_f16((rng.uniform() < 0.5 ? -1.0f : 1.0f) * (0.001f + 0.05f * rng.uniform()));
    };
    const bool second =
        t == dtype::q4_k || t == dtype::q5_k || t == dtype::q4_1 || t == dtype::q5_1 || t == dtype::q2_k;
    const size_t d_at = t == dtype::q6_k   ? offsetof(format::block_q6_k, d)
                        : t == dtype::q2_k ? offsetof(format::block_q2_k, d)
                        : t == dtype::q3_k ? offsetof(format::block_q3_k, d)
                                           : 0;
    for (size_t at = 0; at < q.size(); at += bb) {
        const uint16_t d = scale(), m = scale();
        std::memcpy(q.data() + at + d_at, &d, 2);
        if (second) std::memcpy(q.data() + at + d_at + 2, &m, 2);
    }
    return q;
}

/// Random normal values stored as `type` (the x8 types interleaved; the read-only types,
/// which have no quantiser, random blocks), and its view.
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
        if (!format::is_read_only(plain))
            format::row_from_f32(plain, row.data(), plain_rows.data() + uint64_t(r) * rb, cols);
    }
    if (format::is_read_only(plain)) plain_rows = random_k_rows(plain, rows, cols, seed);
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
