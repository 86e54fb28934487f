// Stored rows: dot_row of every type against its dequantised values, and the quantisers' error.

#include "kernel_test_util.h"

TEST_CASE("dot_row of every dtype matches double precision of its stored values") {
    for (dtype t :
         {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q5_k, dtype::q6_k,
          dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::iq4_nl, dtype::iq4_xs, dtype::q2_k, dtype::q3_k}) {
        for (int64_t n : {32, 96, 256, 4096}) {
            if (n % format::block_elements(t) != 0) continue;
            CAPTURE(format::dtype_name(t));
            CAPTURE(n);
            auto w = random_vec(n, 11 + n), x = random_vec(n, 12 + n);
            auto q = stored_matrix(t, w, 1, n);
            std::vector<float> stored(n);
            format::row_to_f32(t, q.data(), stored.data(), n);
            double ref = 0;
            for (int64_t i = 0; i < n; ++i) ref += double(stored[i]) * x[i];
            const float got = kernels::dot_row(t, q.data(), x.data(), n);
            CHECK(std::fabs(got - ref) <= dot_tolerance(stored.data(), x.data(), n, 1e-5));
        }
    }
}

TEST_CASE("quantisation error stays within its bound") {
    const int64_t n = 4096;
    auto w = random_vec(n, 99);
    // symmetric int8: |error| <= d/2 with d = amax/127 per block (plus f16 rounding of d)
    // 4-bit: levels -8..7 of a fitted scale; the largest error is at most one step amax/8
    // (a value on the short side of the range), the RMS error far less (checked below)
    struct bound {
        dtype t;
        double max_err_in_amax;
    } cases[] = {{dtype::q8_0, 0.5 / 127}, {dtype::q4_0, 1.0 / 8}};
    for (auto c : cases) {
        auto q = quantize(c.t, w, 1, n);
        std::vector<float> back(n);
        format::row_to_f32(c.t, q.data(), back.data(), n);
        for (int64_t b = 0; b < n / 32; ++b) {
            double amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(w[b * 32 + i])));
            for (int i = 0; i < 32; ++i) {
                CHECK(std::fabs(back[b * 32 + i] - w[b * 32 + i]) <= amax * c.max_err_in_amax * 1.01 + 1e-7);
            }
        }
        // RMS error relative to the RMS of uniform weights: int8 ~0.3%, 4-bit ~8%
        double se = 0, sw = 0;
        for (int64_t i = 0; i < n; ++i) {
            se += double(back[i] - w[i]) * (back[i] - w[i]);
            sw += double(w[i]) * w[i];
        }
        MESSAGE(format::dtype_name(c.t) << " relative RMS error " << std::sqrt(se / sw));
        CHECK(std::sqrt(se / sw) < (c.t == dtype::q8_0 ? 0.005 : 0.09));
    }
    // an all-zero block stays zero (no division by zero)
    std::vector<float> zeros(32, 0.0f);
    auto q = quantize(dtype::q4_0, zeros, 1, 32);
    std::vector<float> back(32, 1.0f);
    format::row_to_f32(dtype::q4_0, q.data(), back.data(), 32);
    for (float v : back) CHECK(v == 0.0f);
}

TEST_CASE("the K-quant quantiser loses no more than llama.cpp's on the same rows") {
    // llama.cpp's own quantisation of Gaussian, heavy-tailed and mixed-scale rows
    // (tests/reference/generate_gguf_kquants.py); both dequantised by our decoder, which the
    // GGUF tests hold bit-exact with llama.cpp's.
    const int64_t rows = 48, cols = 1024;
    const auto x = test::read_array<float>(test::fixture("gguf/kquant-rows.f32.bin"));
    REQUIRE(x.size() == size_t(rows * cols));
    for (dtype t : {dtype::q4_k, dtype::q5_k, dtype::q6_k}) {
        CAPTURE(format::dtype_name(t));
        const auto theirs =
            test::read_bytes(test::fixture("gguf/kquant-rows." + std::string(format::dtype_name(t)) + ".bin"));
        const size_t rb = format::row_bytes(t, uint64_t(cols));
        REQUIRE(theirs.size() == rb * rows);
        std::vector<uint8_t> ours(rb * rows);
        std::vector<float> a(cols), b(cols);
        double sse_ours = 0, sse_theirs = 0, worst_row = 0;
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x.data() + r * cols;
            format::row_from_f32(t, xr, ours.data() + r * rb, cols);
            format::row_to_f32(t, ours.data() + r * rb, a.data(), cols);
            format::row_to_f32(t, theirs.data() + r * rb, b.data(), cols);
            double ea = 0, eb = 0;
            for (int64_t i = 0; i < cols; ++i) {
                ea += double(a[i] - xr[i]) * (a[i] - xr[i]);
                eb += double(b[i] - xr[i]) * (b[i] - xr[i]);
            }
            sse_ours += ea;
            sse_theirs += eb;
            worst_row = std::max(worst_row, ea / eb);
        }
        MESSAGE(format::dtype_name(t) << ": squared error ours/llama.cpp " << sse_ours / sse_theirs << ", worst row "
                                      << worst_row);
        CHECK(sse_ours <= 1.0 * sse_theirs);
        CHECK(worst_row < 1.05);
    }
    // an all-zero super-block stays zero
    for (dtype t : {dtype::q4_k, dtype::q5_k, dtype::q6_k}) {
        std::vector<float> zeros(256, 0.0f), back(256, 1.0f);
        std::vector<uint8_t> q(format::row_bytes(t, 256));
        format::row_from_f32(t, zeros.data(), q.data(), 256);
        format::row_to_f32(t, q.data(), back.data(), 256);
        for (float v : back) CHECK(v == 0.0f);
    }
}
