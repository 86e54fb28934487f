// Scalar reference kernels against double-precision maths, and the CPU backend against
// the reference kernels on odd and large shapes, with 1 and 3 threads.

#include "core/half.h"
#include "core/softmax.h"
#include "cpu/kernels.h"
#include "tools/machine_limits.h"
#include "cpu/thread_pool.h"
#include "cpu/kernel_table.h"
#include "format/row_codec.h"
#include "model/moe_routing.h"
#include "ops/backend.h"
#include "sampling/sampler.h"
#include "device_test_util.h"
#include "test_util.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <string>
#include <thread>
#include <chrono>
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

namespace {

// Every SIMD table this machine can run: the ones its CPU supports, and both AVX-512 tables
// on emulated intrinsics (the only way to run them where the CPU has no AVX-512).
std::vector<const kernel_table*> simd_tables() {
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
std::vector<const kernel_table*> all_tables() {
    std::vector<const kernel_table*> v = simd_tables();
    v.insert(v.begin(), &scalar_kernel_table());
    return v;
}

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
    xorshift64s rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = scale * (2.0f * rng.uniform() - 1.0f);
    return v;
}

// Tolerance scaled by the magnitude of the summed terms: sum |a_i * b_i|.
double dot_tolerance(const float* a, const float* b, int64_t n, double rel) {
    double mag = 0;
    for (int64_t i = 0; i < n; ++i) mag += std::fabs(double(a[i]) * b[i]);
    return rel * mag + 1e-30;
}

std::vector<uint8_t> quantize(dtype t, const std::vector<float>& x, int64_t rows, int64_t cols) {
    std::vector<uint8_t> q(format::row_bytes(t, cols) * rows);
    for (int64_t r = 0; r < rows; ++r) {
        format::row_from_f32(t, x.data() + r * cols, q.data() + r * format::row_bytes(t, cols), cols);
    }
    return q;
}

// Weights of type t as a file stores them: quantised rows (K-quants and read-only types of
// random bits), interleaved by eights for the x8 types.
std::vector<uint8_t> stored_matrix(dtype t, const std::vector<float>& w, int64_t rows, int64_t cols) {
    const dtype plain = format::row_type(t);
    if (!format::is_interleaved(t) && (format::is_k_quant(t) || format::is_read_only(t))) {
        return test::random_k_rows(t, rows, cols, w.size() + uint64_t(t));
    }
    auto q = format::is_read_only(plain) ? test::random_k_rows(plain, rows, cols, w.size() + uint64_t(t)) : quantize(plain, w, rows, cols);
    if (format::is_interleaved(t)) {
        const std::vector<uint8_t> rows_plain = q;
        format::interleave_x8(t, rows_plain.data(), uint64_t(rows), uint64_t(cols), q.data());
    }
    return q;
}

tensor_view matrix_view(dtype t, int64_t rows, int64_t cols, const std::vector<uint8_t>& q) {
    tensor_view tv;
    tv.type = t;
    tv.n_dims = 2;
    tv.shape[0] = uint64_t(rows);
    tv.shape[1] = uint64_t(cols);
    tv.data = q.data();
    tv.size = q.size();
    return tv;
}

} // namespace

TEST_CASE("rmsnorm matches double precision") {
    for (int n : {1, 7, 64, 4099}) {
        auto x = random_vec(n, 1 + n, 3.0f), w = random_vec(n, 2 + n);
        std::vector<float> out(n);
        kernels::rmsnorm(out.data(), x.data(), w.data(), n, 1e-6f);
        double ss = 0;
        for (float v : x) ss += double(v) * v;
        const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; ++i) CHECK(out[i] == doctest::Approx(x[i] * inv * w[i]).epsilon(1e-5));
    }
}

TEST_CASE("layernorm matches double precision, a large mean included") {
    for (int n : {1, 7, 64, 4099}) {
        auto x = random_vec(n, 3 + n, 3.0f), w = random_vec(n, 4 + n), b = random_vec(n, 5 + n);
        for (float& v : x) v += 1000.0f; // a large mean over a small spread
        std::vector<float> out(n);
        kernels::layernorm(out.data(), x.data(), w.data(), b.data(), n, 1e-5f);
        double mean = 0, var = 0;
        for (float v : x) mean += v;
        mean /= n;
        for (float v : x) var += (v - mean) * (v - mean);
        const double inv = 1.0 / std::sqrt(var / n + 1e-5);
        for (int i = 0; i < n; ++i) CHECK(out[i] == doctest::Approx((x[i] - mean) * inv * w[i] + b[i]).epsilon(1e-4));
    }
}

TEST_CASE("gelu is PyTorch's tanh approximation") {
    const std::vector<float> x = {-6.0f, -1.5f, -0.1f, 0.0f, 0.3f, 1.0f, 2.5f, 8.0f};
    std::vector<float> y = x;
    kernels::gelu(y.data(), int64_t(y.size()));
    for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i];
        const double want = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        CHECK(y[i] == doctest::Approx(want).epsilon(1e-6));
    }
    CHECK(y[3] == 0.0f);
    // GeGLU: the gate's gelu times up
    std::vector<float> g = x;
    const std::vector<float> up = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f, -2.0f, 0.25f, 1.0f};
    kernels::geglu(g.data(), up.data(), int64_t(g.size()));
    for (size_t i = 0; i < x.size(); ++i) CHECK(g[i] == doctest::Approx(y[i] * up[i]).epsilon(1e-6));
}

TEST_CASE("softmax matches double precision and sums to one") {
    auto x = random_vec(1000, 3, 20.0f);
    std::vector<double> ref(x.begin(), x.end());
    double mx = *std::max_element(ref.begin(), ref.end()), sum = 0;
    for (double& v : ref) sum += (v = std::exp(v - mx));
    softmax(x.data(), 1000);
    double total = 0;
    for (int i = 0; i < 1000; ++i) {
        CHECK(x[i] == doctest::Approx(ref[i] / sum).epsilon(1e-5));
        total += x[i];
    }
    CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("swiglu of every table matches double precision at any length and extreme gates") {
    for (const kernel_table* kt : all_tables()) {
        const std::string table = kt->name;
        CAPTURE(table);
        for (int64_t n : {1, 7, 8, 9, 1000}) {
            CAPTURE(n);
            auto g = random_vec(size_t(n), 61 + n, 20.0f), u = random_vec(size_t(n), 62 + n, 3.0f);
            const float extremes[] = {-1000.0f, -100.0f, -88.5f, -87.0f, -0.0f, 87.0f, 88.5f, 1000.0f};
            for (size_t i = 0; i < std::size(extremes) && i < g.size(); ++i) g[i * g.size() / std::size(extremes)] = extremes[i];
            std::vector<float> out = g;
            kt->swiglu(out.data(), u.data(), n);
            for (int64_t i = 0; i < n; ++i) {
                const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
                CAPTURE(g[i]);
                // a few ulp, or e^-88 of a vanishing gate
                CHECK(std::fabs(out[i] - want) <= 4e-7 * std::fabs(want) + 1e-35 * (1.0 + std::fabs(g[i] * u[i])));
            }
        }
        float nan_gate = NAN, up = 1.0f;
        kt->swiglu(&nan_gate, &up, 1);
        CHECK(std::isnan(nan_gate));
    }
}

TEST_CASE("half and bfloat16 conversions round to nearest") {
    CHECK(f16_to_f32(f32_to_f16(1.0f)) == 1.0f);
    CHECK(f16_to_f32(f32_to_f16(-2.5f)) == -2.5f);
    CHECK(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
    CHECK(f16_to_f32(0x0001) == doctest::Approx(5.960464477539063e-08)); // smallest subnormal
    CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
    CHECK(bf16_to_f32(f32_to_bf16(3.140625f)) == 3.140625f);
    // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0)
    CHECK(bf16_to_f32(f32_to_bf16(1.00390625f)) == 1.0f);
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST_CASE("dot_row of every dtype matches double precision of its stored values") {
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_k, dtype::q5_k, dtype::q6_k,
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
    struct bound { dtype t; double max_err_in_amax; } cases[] = {{dtype::q8_0, 0.5 / 127}, {dtype::q4_0, 1.0 / 8}};
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
        const auto theirs = test::read_bytes(test::fixture("gguf/kquant-rows." + std::string(format::dtype_name(t)) + ".bin"));
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
        MESSAGE(format::dtype_name(t) << ": squared error ours/llama.cpp " << sse_ours / sse_theirs << ", worst row " << worst_row);
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

TEST_CASE("rope rotates pairs i and i+d/2 by the position angle") {
    const int d = 16;
    auto x = random_vec(d, 5);
    auto y = x;
    kernels::rope_head(y.data(), d, 7, 10000.0f);
    for (int i = 0; i < d / 2; ++i) {
        const double a = 7.0 * std::pow(10000.0, -2.0 * i / d);
        CHECK(y[i] == doctest::Approx(x[i] * std::cos(a) - x[i + d / 2] * std::sin(a)).epsilon(1e-5));
        CHECK(y[i + d / 2] == doctest::Approx(x[i + d / 2] * std::cos(a) + x[i] * std::sin(a)).epsilon(1e-5));
    }
    // position 0 is the identity
    auto z = x;
    kernels::rope_head(z.data(), d, 0, 10000.0f);
    for (int i = 0; i < d; ++i) CHECK(z[i] == x[i]);
    // scaled RoPE: pair i's frequency divided by its factor, cos and sin times attn_factor
    const std::vector<float> factors = {1, 2, 4, 8, 1, 1, 3, 0.5};
    auto w = x;
    kernels::rope_head(w.data(), d, 7, 10000.0f, factors.data(), 1.5f);
    for (int i = 0; i < d / 2; ++i) {
        const double a = 7.0 * std::pow(10000.0, -2.0 * i / d) / factors[i];
        CHECK(w[i] == doctest::Approx(1.5 * (x[i] * std::cos(a) - x[i + d / 2] * std::sin(a))).epsilon(1e-5));
        CHECK(w[i + d / 2] == doctest::Approx(1.5 * (x[i + d / 2] * std::cos(a) + x[i] * std::sin(a))).epsilon(1e-5));
    }
}

TEST_CASE("SIMD row kernels reproduce the scalar reference") {
    const kernel_table& ref = scalar_kernel_table();
    const std::vector<const kernel_table*> simd_list = simd_tables();
    if (simd_list.empty()) {
        MESSAGE("this CPU has no AVX2: only the scalar kernels run here");
        return;
    }
#if defined(COLIBRI_HAVE_AVX512_EMULATION)
    CHECK(simd_list.size() >= 3); // AVX2 and the two emulated AVX-512 tables at least
#endif
    for (const kernel_table* simd : simd_list) {
    const std::string table = simd->name;
    CAPTURE(table);
    for (int64_t n : {32, 64, 96, 256, 1024, 4096 + 32, 4096 + 256}) {
        CAPTURE(n);
        auto w = random_vec(size_t(n), 41 + n, 2.0f), x = random_vec(size_t(n), 42 + n, 3.0f);
        // activation quantisation: identical blocks
        std::vector<block_q8_x> xr(size_t(n / 32)), xs(size_t(n / 32));
        ref.quantize_x(x.data(), xr.data(), n);
        simd->quantize_x(x.data(), xs.data(), n);
        for (size_t b = 0; b < xr.size(); ++b) {
            CHECK(xs[b].d == xr[b].d);
            CHECK(xs[b].sum == xr[b].sum);
            CHECK(std::memcmp(xs[b].qs, xr[b].qs, 32) == 0);
        }
        // eight quantised activation vectors for the integer tiles (up to four for q8_0 and
        // q4_0, up to eight for the interleaved types), and their values
        auto xa = random_vec(size_t(8 * n), 43 + n, 3.0f);
        std::vector<block_q8_x> xqa(size_t(8 * n / 32));
        ref.quantize_x(xa.data(), xqa.data(), 8 * n);
        std::vector<float> xva(size_t(8 * n));
        for (int64_t i = 0; i < 8 * n; ++i) xva[size_t(i)] = xqa[size_t(i / 32)].d * xqa[size_t(i / 32)].qs[i % 32];
        for (dtype t : {dtype::q8_0, dtype::q4_0}) {
            CAPTURE(format::dtype_name(t));
            auto q = quantize(t, w, 1, n);
            std::vector<float> stored(static_cast<size_t>(n));
            format::row_to_f32(t, q.data(), stored.data(), n);
            auto f_dot = t == dtype::q8_0 ? ref.dot_q8_0_f32 : ref.dot_q4_0_f32;
            auto f_simd = t == dtype::q8_0 ? simd->dot_q8_0_f32 : simd->dot_q4_0_f32;
            const double tol = dot_tolerance(stored.data(), x.data(), n, 1e-5);
            CHECK(std::fabs(f_simd(q.data(), x.data(), n) - f_dot(q.data(), x.data(), n)) <= tol);
            // integer tiles: four different rows (a stride apart, or one row repeated with
            // stride 0) by 1-4 vectors, bit-identical to the reference and within rounding of
            // the exact dot of the stored and quantised values
            auto w4 = random_vec(size_t(4 * n), 44 + n, 2.0f);
            auto q4 = quantize(t, w4, 4, n);
            const size_t rb = format::row_bytes(t, n);
            std::vector<float> stored4(size_t(4 * n));
            for (int r = 0; r < 4; ++r) format::row_to_f32(t, q4.data() + r * rb, stored4.data() + r * n, n);
            auto tile_ref = t == dtype::q8_0 ? ref.tile_q8_0 : ref.tile_q4_0;
            auto tile_simd = t == dtype::q8_0 ? simd->tile_q8_0 : simd->tile_q4_0;
            for (size_t stride : {rb, size_t(0)}) {
                for (int n_tok = 1; n_tok <= 4; ++n_tok) {
                    CAPTURE(stride);
                    CAPTURE(n_tok);
                    float want[16], got[16];
                    tile_ref(q4.data(), stride, xqa.data(), size_t(n / 32), n_tok, n, want);
                    tile_simd(q4.data(), stride, xqa.data(), size_t(n / 32), n_tok, n, got);
                    for (int k = 0; k < n_tok; ++k) {
                        for (int r = 0; r < 4; ++r) {
                            CHECK(got[4 * k + r] == want[4 * k + r]);
                            const float* row = stored4.data() + (stride == 0 ? 0 : r) * n;
                            const float* xk = xva.data() + k * n;
                            double exact = 0;
                            for (int64_t i = 0; i < n; ++i) exact += double(row[i]) * xk[i];
                            CHECK(std::fabs(want[4 * k + r] - exact) <= dot_tolerance(row, xk, n, 1e-5));
                        }
                    }
                }
            }
            // four rows a stride apart: the same four results as one row at a time
            std::vector<uint8_t> rows4;
            const size_t stride = q.size() * 3; // rows 0, 3, 6, 9 of a 10-row buffer
            rows4.resize(stride * 3 + q.size());
            for (int k = 0; k < 4; ++k) std::memcpy(rows4.data() + k * stride, q.data(), q.size());
            auto d4 = t == dtype::q8_0 ? simd->dot4_q8_0_f32 : simd->dot4_q4_0_f32;
            float out[4];
            d4(rows4.data(), stride, x.data(), n, out);
            for (float o : out) CHECK(std::fabs(o - f_dot(q.data(), x.data(), n)) <= tol);
            // one row with four activation vectors: bit-identical to one vector at a time
            auto dx4 = t == dtype::q8_0 ? simd->dotx4_q8_0_f32 : simd->dotx4_q4_0_f32;
            dx4(q.data(), xa.data(), size_t(n), n, out);
            for (int k = 0; k < 4; ++k) CHECK(out[k] == f_simd(q.data(), xa.data() + k * n, n));
        }
        // K-quants: four rows (a stride apart, or one repeated) by 1-4 vectors, bit-identical
        // to the reference and within rounding of the exact dot of the stored values
        for (dtype t : {dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::iq4_nl, dtype::iq4_xs,
                        dtype::q2_k, dtype::q3_k}) {
            if (n % format::block_elements(t) != 0) continue;
            CAPTURE(format::dtype_name(t));
            const auto q4 = test::random_k_rows(t, 4, n, 46 + uint64_t(n));
            const size_t rb = format::row_bytes(t, n);
            std::vector<float> stored4(size_t(4 * n));
            for (int r = 0; r < 4; ++r) format::row_to_f32(t, q4.data() + r * rb, stored4.data() + r * n, n);
            const auto pick = [&](const kernel_table& k) { return int8_tile(k, t); };
            for (size_t stride : {rb, size_t(0)}) {
                for (int n_tok = 1; n_tok <= 4; ++n_tok) {
                    CAPTURE(stride);
                    CAPTURE(n_tok);
                    float want[16], got[16];
                    pick(ref)(q4.data(), stride, xqa.data(), size_t(n / 32), n_tok, n, want);
                    pick(*simd)(q4.data(), stride, xqa.data(), size_t(n / 32), n_tok, n, got);
                    for (int k = 0; k < n_tok; ++k) {
                        for (int r = 0; r < 4; ++r) {
                            CHECK(got[4 * k + r] == want[4 * k + r]);
                            const float* row = stored4.data() + (stride == 0 ? 0 : r) * n;
                            const float* xk = xva.data() + k * n;
                            double exact = 0;
                            for (int64_t i = 0; i < n; ++i) exact += double(row[i]) * xk[i];
                            CHECK(std::fabs(want[4 * k + r] - exact) <= dot_tolerance(row, xk, n, 1e-5));
                        }
                    }
                }
            }
        }
        // the interleaved types: four groups of eight rows (and the first again), every count
        // of groups and tokens the tiles take, bit-identical to the reference and within
        // rounding of the exact dot of the stored values
        for (dtype t : {dtype::q4_0x8, dtype::q8_0x8, dtype::q4_kx8, dtype::q5_kx8, dtype::q6_kx8, dtype::iq4_xsx8, dtype::q4_1x8,
                        dtype::q5_0x8, dtype::q5_1x8, dtype::iq4_nlx8}) {
            if (format::row_bytes(t, uint64_t(n)) == 0) continue;
            CAPTURE(format::dtype_name(t));
            const dtype plain = format::row_type(t);
            auto w32 = random_vec(size_t(32 * n), 45 + n, 2.0f);
            const auto q32 = format::is_k_quant(plain) || format::is_read_only(plain) ? test::random_k_rows(plain, 32, n, 45 + uint64_t(n)) : quantize(plain, w32, 32, n);
            const size_t rb = format::row_bytes(t, n), gb = 8 * rb;
            std::vector<uint8_t> x8(5 * gb);
            format::interleave_x8(t, q32.data(), 32, uint64_t(n), x8.data());
            std::memcpy(x8.data() + 4 * gb, x8.data(), gb);
            std::vector<float> stored32(size_t(32 * n));
            std::vector<uint8_t> row(rb);
            for (int r = 0; r < 32; ++r) {
                format::x8_row(t, x8.data(), uint64_t(n), uint64_t(r), row.data());
                CHECK(std::memcmp(row.data(), q32.data() + r * rb, rb) == 0);
                format::row_to_f32(t, row.data(), stored32.data() + r * n, n);
            }
            const auto tile_ref = int8_x8_kernels(ref, t).tile, tile_simd = int8_x8_kernels(*simd, t).tile;
            // decode's four streams: groups anywhere (the fifth is the first), each with its
            // own activations or all with the same, as each group alone
            const auto streams_ref = int8_x8_kernels(ref, t).streams, streams_simd = int8_x8_kernels(*simd, t).streams;
            for (bool own_x : {true, false}) {
                CAPTURE(own_x);
                const int order[4] = {3, 0, 4, 1}; // groups
                const void* groups[4];
                const block_q8_x* stream_x[4];
                for (int s = 0; s < 4; ++s) {
                    groups[s] = x8.data() + size_t(order[s]) * gb;
                    stream_x[s] = xqa.data() + size_t(own_x ? 7 - 2 * s : 5) * size_t(n / 32);
                }
                float want[32], got[32], alone[8];
                streams_ref(groups, stream_x, n, want);
                streams_simd(groups, stream_x, n, got);
                for (int s = 0; s < 4; ++s) {
                    tile_ref(groups[s], 0, 1, stream_x[s], 0, 1, n, alone);
                    for (int r = 0; r < 8; ++r) {
                        CHECK(want[s * 8 + r] == alone[r]);
                        CHECK(got[s * 8 + r] == alone[r]);
                    }
                }
            }
            for (int n_tok = 1; n_tok <= 8; ++n_tok) {
                for (int n_groups = 1; n_groups <= 4; ++n_groups) {
                    for (size_t stride : {gb, gb * size_t(4 / n_groups), size_t(0)}) {
                        CAPTURE(n_tok);
                        CAPTURE(n_groups);
                        CAPTURE(stride);
                        float want[256], got[256];
                        tile_ref(x8.data(), stride, n_groups, xqa.data(), size_t(n / 32), n_tok, n, want);
                        tile_simd(x8.data(), stride, n_groups, xqa.data(), size_t(n / 32), n_tok, n, got);
                        for (int k = 0; k < n_tok; ++k) {
                            for (int g = 0; g < n_groups; ++g) {
                                for (int r = 0; r < 8; ++r) {
                                    const int i = (k * n_groups + g) * 8 + r;
                                    CHECK(got[i] == want[i]);
                                    const size_t group = (size_t(g) * stride / gb) % 4; // the fifth group is the first
                                    const float* wr = stored32.data() + (group * 8 + size_t(r)) * size_t(n);
                                    const float* xk = xva.data() + k * n;
                                    double exact = 0;
                                    for (int64_t c = 0; c < n; ++c) exact += double(wr[c]) * xk[c];
                                    CHECK(std::fabs(want[i] - exact) <= dot_tolerance(wr, xk, n, 1e-5));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for (int64_t n : {1, 7, 33, 1000, 4099}) {
        CAPTURE(n);
        auto w = random_vec(size_t(n), 51 + n), x = random_vec(size_t(n), 52 + n);
        const double tol = dot_tolerance(w.data(), x.data(), n, 1e-5);
        CHECK(std::fabs(simd->dot_f32(w.data(), x.data(), n) - ref.dot_f32(w.data(), x.data(), n)) <= tol);
        // one row with four vectors (n + 3 apart): each the bits of dot_f32 alone
        const auto x4 = random_vec(size_t(4 * (n + 3)), 53 + n);
        float out4[4];
        simd->dotx4_f32(w.data(), x4.data(), size_t(n + 3), n, out4);
        for (int k = 0; k < 4; ++k) CHECK(out4[k] == simd->dot_f32(w.data(), x4.data() + k * (n + 3), n));
        // four rows (n + 5 apart) with one vector: each the bits of dot_f32 alone
        const auto w4 = random_vec(size_t(4 * (n + 5)), 54 + n);
        simd->dot4_f32(w4.data(), size_t(n + 5), x.data(), n, out4);
        for (int k = 0; k < 4; ++k) CHECK(out4[k] == simd->dot_f32(w4.data() + k * (n + 5), x.data(), n));
        for (dtype t : {dtype::f16, dtype::bf16}) {
            auto q = quantize(t, w, 1, n);
            auto r = t == dtype::f16 ? ref.dot_f16 : ref.dot_bf16;
            auto v = t == dtype::f16 ? simd->dot_f16 : simd->dot_bf16;
            CHECK(std::fabs(v(q.data(), x.data(), n) - r(q.data(), x.data(), n)) <= tol);
        }
    }
    }
}

TEST_CASE("thread pool balanced split hands out every item exactly once") {
    for (int threads : {1, 2, 3}) {
        thread_pool pool(threads);
        for (int64_t n : {0, 1, 5, 1000, 4099}) {
            for (int64_t grain : {0, 1, 3, 64, 5000}) {
                CAPTURE(threads);
                CAPTURE(n);
                CAPTURE(grain);
                std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
                std::atomic<int> calls{0}, empty{0};
                std::atomic<int64_t> small{0}; // items in calls of at most grain items
                pool.parallel_balanced(n, grain, [&](int64_t b, int64_t e) { // runs on the pool's threads
                    if (b >= e) empty.fetch_add(1);
                    if (e - b <= std::max<int64_t>(grain, 1)) small.fetch_add(e - b);
                    for (int64_t i = b; i < e; ++i) seen[size_t(i)].fetch_add(1);
                    calls.fetch_add(1);
                });
                CHECK(empty.load() == 0);
                for (int64_t i = 0; i < n; ++i) REQUIRE(seen[size_t(i)].load() == 1);
                if (threads == 1 || n <= std::max<int64_t>(grain, 1)) {
                    CHECK(calls.load() == (n > 0 ? 1 : 0)); // all of it at once
                } else {
                    // one equal share per thread of three quarters, the rest in chunks
                    CHECK(small.load() >= n / 4);
                    CHECK(calls.load() <= threads + (n / 4 + threads * std::max<int64_t>(grain, 1)) / std::max<int64_t>(grain, 1) + 1);
                }
            }
        }
    }
}

TEST_CASE("thread pool parts run every step once and idle threads take halves of the rest") {
    for (int threads : {1, 2, 3}) {
        thread_pool pool(threads);
        for (bool serial : {false, true}) {
            for (bool slow_first : {false, true}) {
                CAPTURE(threads);
                CAPTURE(serial);
                CAPTURE(slow_first);
                const int parts = serial ? 1 : threads;
                const auto steps = [&](int p) { return int64_t(p == 1 ? 0 : 500 + 37 * p); }; // part 1 is empty
                std::vector<std::vector<std::atomic<int>>> seen;
                for (int p = 0; p < parts; ++p) seen.emplace_back(size_t(steps(p)));
                std::vector<std::thread::id> by(size_t(steps(0))); // the thread of each step of part 0
                std::atomic<int> bad{0};                          // calls out of range
                pool.parallel_parts(serial, steps, [&](int p, int64_t k0, int64_t k1) {
                    if (p < 0 || p >= parts || k0 < 0 || k0 >= k1 || k1 > steps(p)) {
                        bad.fetch_add(1);
                        return;
                    }
                    if (p == 0 && k0 == 0 && slow_first) std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    for (int64_t k = k0; k < k1; ++k) {
                        seen[size_t(p)][size_t(k)].fetch_add(1);
                        if (p == 0) by[size_t(k)] = std::this_thread::get_id();
                    }
                });
                CHECK(bad.load() == 0);
                for (int p = 0; p < parts; ++p) {
                    for (int64_t k = 0; k < steps(p); ++k) REQUIRE(seen[size_t(p)][size_t(k)].load() == 1);
                }
                // while part 0's first call sleeps, the other threads run out and take from it
                const auto others = std::count_if(by.begin(), by.end(), [&](std::thread::id t) { return t != by[0]; });
                if (slow_first && parts > 1) CHECK(others > 0);
                if (parts == 1) CHECK(others == 0);
            }
        }
    }
}

TEST_CASE("thread pool parts after prologues run no step before its part's prologue and share the rest") {
    for (int threads : {1, 2, 3}) {
        thread_pool pool(threads);
        for (int slow : {-1, 0, 1}) { // a thread whose prologue sleeps (none, the caller, a worker)
            CAPTURE(threads);
            CAPTURE(slow);
            const auto steps = [&](int p) { return int64_t(p == 1 ? 0 : 400 + 29 * p); }; // part 1 is empty
            const size_t nt = static_cast<size_t>(threads);
            std::vector<std::atomic<int>> prologues(nt);
            std::vector<std::vector<std::atomic<int>>> seen;
            for (int p = 0; p < threads; ++p) seen.emplace_back(size_t(steps(p)));
            std::vector<std::vector<std::thread::id>> by(nt);
            for (int p = 0; p < threads; ++p) by[size_t(p)].resize(size_t(steps(p)));
            std::atomic<int> bad{0}; // calls out of range or before their part's prologue ended
            pool.parallel_parts_after(
                [&](int p) {
                    if (p == slow) std::this_thread::sleep_for(std::chrono::milliseconds(40));
                    prologues[size_t(p)].fetch_add(1);
                },
                steps,
                [&](int p, int64_t k0, int64_t k1) {
                    if (p < 0 || p >= threads || k0 < 0 || k0 >= k1 || k1 > steps(p) || prologues[size_t(p)].load() != 1) {
                        bad.fetch_add(1);
                        return;
                    }
                    // the slow part's first call sleeps too: the waiting threads get to run on a loaded machine
                    if (p == slow && k0 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(40));
                    for (int64_t k = k0; k < k1; ++k) {
                        seen[size_t(p)][size_t(k)].fetch_add(1);
                        by[size_t(p)][size_t(k)] = std::this_thread::get_id();
                    }
                });
            CHECK(bad.load() == 0);
            for (int p = 0; p < threads; ++p) {
                CHECK(prologues[size_t(p)].load() == 1);
                for (int64_t k = 0; k < steps(p); ++k) REQUIRE(seen[size_t(p)][size_t(k)].load() == 1);
            }
            // the others wait out the slow prologue, then take from its part
            if (slow >= 0 && slow < threads && steps(slow) > 0) {
                const auto& b = by[size_t(slow)];
                const auto others = std::count_if(b.begin(), b.end(), [&](std::thread::id t) { return t != b.front(); });
                if (threads > 1) CHECK(others > 0);
                else CHECK(others == 0);
            }
        }
    }
}

TEST_CASE("the read pass sums every word of its range whatever the number of streams") {
    constexpr size_t bytes = 64 * 8 * 37; // 37 steps of every stream count
    alignas(32) std::array<uint64_t, bytes / 8> words{};
    uint64_t expected = 0;
    for (size_t i = 0; i < words.size(); ++i) expected += (words[i] = 0x9E3779B97F4A7C15ull * (i + 1));
    for (const kernel_table* kt : all_tables()) {
        for (int streams : {1, 2, 4, 8}) {
            CAPTURE(kt->name);
            CAPTURE(streams);
            CHECK(kt->read_sum(words.data(), bytes, streams) == expected);
        }
    }
}

TEST_CASE("the read probe keeps a buffer of whole 1 MiB chunks per thread and measures it again and again") {
    constexpr size_t mib = size_t(1) << 20;
    read_probe two(2, 5 * mib + 3, best_kernel_table());
    CHECK(two.bytes() == 4 * mib); // two chunks per thread
    read_probe three(3, 1, best_kernel_table());
    CHECK(three.bytes() == 3 * mib); // at least one each
    for (int i = 0; i < 3; ++i) {
        const double rate = two.measure(2);
        CHECK(rate > 1e8); // bytes/s: memory (or caches, for buffers this small) reads faster than 100 MB/s
        CHECK(rate < 1e13);
    }
    CHECK(three.measure(1) > 1e8);
    CHECK(two.measure(0) == 0.0); // no pass, no rate
}

TEST_CASE("decode walks every product of a dispatch across matrices and threads as each alone") {
    // one token per job: streamed q4_0x8 and q8_0x8 jobs of two widths, a plain q8_0 job
    // among them, and f32 activations (nothing streamed); every output once, and each the
    // bits of the job alone on the reference kernels
    struct spec { dtype t; int64_t rows, cols; } specs[] = {{dtype::q4_0x8, 64, 352}, {dtype::q4_0x8, 2000, 352}, {dtype::q8_0, 12, 352},
                                                            {dtype::q8_0x8, 24, 352}, {dtype::q4_0x8, 8, 64},    {dtype::q8_0x8, 136, 64},
                                                            {dtype::q4_0x8, 512, 352}};
    std::vector<std::vector<uint8_t>> weights;
    std::vector<tensor_view> views;
    std::vector<std::vector<float>> xs;
    for (const spec& sp : specs) {
        weights.push_back(stored_matrix(sp.t, random_vec(size_t(sp.rows * sp.cols), 61 + weights.size()), sp.rows, sp.cols));
        // jobs 0 and 1 read the same activations (an expert's gate and up, or every expert's in decode)
        xs.push_back(weights.size() == 2 ? xs[0] : random_vec(size_t(sp.cols), 71 + weights.size()));
    }
    for (size_t i = 0; i < weights.size(); ++i) views.push_back(matrix_view(specs[i].t, specs[i].rows, specs[i].cols, weights[i]));
    for (bool int8_act : {true, false}) {
        cpu_options ro;
        ro.kernels = &scalar_kernel_table();
        ro.int8_activations = int8_act;
        auto ref = make_cpu_backend(ro, 4096);
        std::vector<std::vector<float>> want;
        for (size_t i = 0; i < views.size(); ++i) {
            want.emplace_back(size_t(specs[i].rows));
            ref->matmul(views[i], xs[i].data(), 1, want.back().data());
        }
        for (const kernel_table* kt : all_tables()) {
            for (int threads : {1, 2, 3}) {
                const std::string table = kt->name;
                CAPTURE(table);
                CAPTURE(threads);
                CAPTURE(int8_act);
                cpu_options o;
                o.n_threads = threads;
                o.kernels = kt;
                o.int8_activations = int8_act;
                auto be = make_cpu_backend(o, 4096);
                for (int rep = 0; rep < 3; ++rep) {
                    std::vector<std::vector<float>> got;
                    std::vector<matmul_job> jobs;
                    for (size_t i = 0; i < views.size(); ++i) got.emplace_back(size_t(specs[i].rows), NAN);
                    for (size_t i = 0; i < views.size(); ++i) jobs.push_back({&views[i], xs[i].data(), 1, got[i].data()});
                    be->matmul_many(jobs.data(), int(jobs.size()));
                    for (size_t i = 0; i < views.size(); ++i) {
                        CAPTURE(i);
                        for (int64_t r = 0; r < specs[i].rows; ++r) {
                            CAPTURE(r);
                            if (int8_act) REQUIRE(got[i][size_t(r)] == want[i][size_t(r)]);
                            else REQUIRE(std::fabs(got[i][size_t(r)] - want[i][size_t(r)]) <= 1e-4f * (1.0f + std::fabs(want[i][size_t(r)])));
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("backend matmul matches the reference on odd and large shapes") {
    struct shape { int64_t rows, cols; int n; } shapes[] = {{1, 32, 1}, {7, 64, 3}, {257, 96, 1}, {33, 1024, 5}, {1000, 352, 2}, {37, 64, 70},
                                                            {8, 32, 1}, {24, 1024, 3}, {264, 96, 1}, {136, 352, 4}, {40, 64, 70},
                                                            {7, 256, 3}, {37, 512, 70}, {1000, 256, 2}};
    for (const kernel_table* kt : all_tables())
    for (bool int8_act : {false, true})
    for (int threads : {1, 3}) {
        cpu_options o;
        o.n_threads = threads;
        o.kernels = kt;
        o.int8_activations = int8_act;
        auto be = make_cpu_backend(o, 4096);
        for (auto s : shapes) {
            for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_0, dtype::q4_0x8, dtype::q8_0x8,
                            dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::iq4_nl,
                            dtype::iq4_xs, dtype::q2_k, dtype::q3_k, dtype::iq4_xsx8, dtype::q4_1x8, dtype::q5_0x8,
                            dtype::q5_1x8, dtype::iq4_nlx8}) {
                if (format::is_interleaved(t) && s.rows % 8 != 0) continue;
                if (format::row_bytes(t, uint64_t(s.cols)) == 0) continue;
                const std::string table = kt->name;
                CAPTURE(table);
                CAPTURE(int8_act);
                CAPTURE(threads);
                CAPTURE(format::dtype_name(t));
                CAPTURE(s.rows);
                CAPTURE(s.n);
                auto w = random_vec(size_t(s.rows * s.cols), 21);
                const auto q = stored_matrix(t, w, s.rows, s.cols);
                auto x = random_vec(size_t(s.n * s.cols), 22);
                const tensor_view tv = matrix_view(t, s.rows, s.cols, q);
                std::vector<float> y(size_t(s.n * s.rows));
                be->matmul(tv, x.data(), s.n, y.data());
                // with int8 activations the reference sees the same quantised activations
                const bool quant_x = int8_act && format::is_quantized(t);
                std::vector<float> xs = x;
                if (quant_x) {
                    std::vector<block_q8_x> xq(size_t(s.cols / 32));
                    for (int tok = 0; tok < s.n; ++tok) {
                        scalar_kernel_table().quantize_x(x.data() + tok * s.cols, xq.data(), s.cols);
                        for (int64_t c = 0; c < s.cols; ++c) xs[tok * s.cols + c] = xq[c / 32].d * xq[c / 32].qs[c % 32];
                    }
                }
                const uint64_t rb = format::row_bytes(t, s.cols);
                std::vector<float> row(s.cols);
                for (int tok = 0; tok < s.n; ++tok) {
                    for (int64_t r = 0; r < s.rows; ++r) {
                        if (format::is_interleaved(t)) {
                            std::vector<uint8_t> plain(rb);
                            format::x8_row(t, q.data(), uint64_t(s.cols), uint64_t(r), plain.data());
                            format::row_to_f32(t, plain.data(), row.data(), s.cols);
                        } else {
                            format::row_to_f32(t, q.data() + r * rb, row.data(), s.cols);
                        }
                        double ref = 0;
                        for (int64_t c = 0; c < s.cols; ++c) ref += double(row[c]) * xs[tok * s.cols + c];
                        REQUIRE(std::fabs(y[tok * s.rows + r] - ref) <= dot_tolerance(row.data(), xs.data() + tok * s.cols, s.cols, 1e-5));
                    }
                }
                // batching never changes a result: each token alone gives the same bits
                std::vector<float> y1(size_t(s.rows));
                for (int tok = 0; tok < s.n; ++tok) {
                    be->matmul(tv, x.data() + tok * s.cols, 1, y1.data());
                    for (int64_t r = 0; r < s.rows; ++r) REQUIRE(y1[size_t(r)] == y[size_t(tok * s.rows + r)]);
                }
            }
        }
    }
}

TEST_CASE("interleaved products split at any row give the results of the product alone and embed reads its rows") {
    // a q4_0x8 or q8_0x8 job after one of 12 rows starts mid-way through a chunk of the
    // split: each group must still be computed once, by the range that holds its first row
    const int64_t cols = 352;
    for (const dtype x8 : {dtype::q4_0x8, dtype::q8_0x8}) {
    const dtype plain_type = format::row_type(x8);
    CAPTURE(format::dtype_name(x8));
    auto make = [&](dtype t, int64_t rows, uint64_t seed) { return stored_matrix(t, random_vec(size_t(rows * cols), seed), rows, cols); };
    auto view = [&](dtype t, int64_t rows, const std::vector<uint8_t>& q) { return matrix_view(t, rows, cols, q); };
    const auto small = make(plain_type, 12, 31), big = make(x8, 2000, 32), big_plain = make(plain_type, 2000, 32);
    const tensor_view ts = view(plain_type, 12, small), tb = view(x8, 2000, big), tp = view(plain_type, 2000, big_plain);
    for (const kernel_table* kt : all_tables()) {
        for (int threads : {1, 2, 3}) {
            for (int n : {1, 2, 3, 9}) {
                const std::string table = kt->name;
                CAPTURE(table);
                CAPTURE(threads);
                CAPTURE(n);
                cpu_options o;
                o.n_threads = threads;
                o.kernels = kt;
                auto be = make_cpu_backend(o, 4096);
                const auto x = random_vec(size_t(n * cols), 33);
                std::vector<float> y_small(size_t(n * 12)), y_big(size_t(n * 2000), NAN), y_alone(size_t(n * 2000));
                const matmul_job jobs[2] = {{&ts, x.data(), n, y_small.data()}, {&tb, x.data(), n, y_big.data()}};
                be->matmul_many(jobs, 2);
                be->matmul(tb, x.data(), n, y_alone.data());
                for (size_t i = 0; i < y_big.size(); ++i) REQUIRE(y_big[i] == y_alone[i]);
                // the same rows stored plainly: equal within the f32 rounding of the sums
                std::vector<float> y_plain(size_t(n * 2000));
                be->matmul(tp, x.data(), n, y_plain.data());
                for (size_t i = 0; i < y_big.size(); ++i) REQUIRE(std::fabs(y_big[i] - y_plain[i]) <= 1e-4f * (1.0f + std::fabs(y_plain[i])));
            }
        }
    }
    auto be = make_cpu_backend(cpu_options{}, 4096);
    const int32_t ids[3] = {1999, 0, 77};
    std::vector<float> e8(3 * cols), e0(3 * cols);
    be->embed(tb, ids, 3, 0.5f, e8.data());
    be->embed(tp, ids, 3, 0.5f, e0.data());
    CHECK(e8 == e0);
    }
}

TEST_CASE("jobs that take their activations by row index give the bits of the rows copied out") {
    // a prefill's experts: gate and up pairs that share their row indices, some rows taken
    // by several jobs and some by none, two experts with as many tokens but other rows, a job
    // on all rows in order among them, for every weight type, int8 and f32 activations, one
    // and three threads
    constexpr int64_t cols = 352;
    constexpr int n_rows = 40;
    const auto x = random_vec(size_t(n_rows * cols), 95);
    const std::vector<std::vector<int32_t>> picks = {{3, 3, 17, 39}, {0}, {5, 9, 11, 12, 20, 21, 22, 23, 30, 31, 38}, {39, 0, 7}, {1, 2, 5, 8}};
    for (dtype t : {dtype::q4_0x8, dtype::q8_0x8, dtype::q8_0, dtype::q4_0, dtype::f32})
    for (bool int8_act : {false, true})
    for (int threads : {1, 3}) {
        CAPTURE(format::dtype_name(t));
        CAPTURE(int8_act);
        CAPTURE(threads);
        cpu_options o;
        o.n_threads = threads;
        o.int8_activations = int8_act;
        auto be = make_cpu_backend(o, 4096);
        const int64_t rows = 48;
        std::vector<std::vector<uint8_t>> weights;
        std::vector<tensor_view> views(2 * picks.size() + 1);
        for (size_t i = 0; i < views.size(); ++i) {
            weights.push_back(stored_matrix(t, random_vec(size_t(rows * cols), 96 + i), rows, cols));
            views[i] = matrix_view(t, rows, cols, weights.back());
        }
        std::vector<std::vector<float>> copied, got(views.size()), want(views.size());
        std::vector<matmul_job> by_index, by_copy;
        for (size_t p = 0; p < picks.size(); ++p) {
            std::vector<float> c;
            for (int32_t r : picks[p]) c.insert(c.end(), x.begin() + r * cols, x.begin() + (r + 1) * cols);
            copied.push_back(std::move(c));
        }
        for (size_t p = 0; p < picks.size(); ++p) {
            const int n = static_cast<int>(picks[p].size());
            for (size_t h = 0; h < 2; ++h) { // gate and up
                const size_t v = 2 * p + h;
                got[v].assign(size_t(n * rows), NAN);
                want[v].assign(size_t(n * rows), NAN);
                by_index.push_back({&views[v], x.data(), n, got[v].data(), picks[p].data()});
                by_copy.push_back({&views[v], copied[p].data(), n, want[v].data()});
            }
        }
        const size_t all = views.size() - 1; // every row in order
        got[all].assign(size_t(n_rows * rows), NAN);
        want[all].assign(size_t(n_rows * rows), NAN);
        by_index.push_back({&views[all], x.data(), n_rows, got[all].data()});
        by_copy.push_back({&views[all], x.data(), n_rows, want[all].data()});
        be->matmul_many(by_index.data(), static_cast<int>(by_index.size()));
        be->matmul_many(by_copy.data(), static_cast<int>(by_copy.size()));
        for (size_t v = 0; v < views.size(); ++v) {
            CAPTURE(v);
            for (size_t i = 0; i < got[v].size(); ++i) REQUIRE(got[v][i] == want[v][i]);
        }
    }
}

TEST_CASE("ffn_many gives the bits of its products and swiglu run one job at a time") {
    // decode's experts shared out whole across the threads (eight of one size; two and a
    // larger shared expert) or not (three on two threads), and a prefill's experts taking
    // their tokens by index, for every weight type, int8 and f32 activations, 1-3 threads
    constexpr int64_t dim = 256, n_ff = 96, n_sh = 160;
    const auto x = random_vec(size_t(4 * dim), 130);
    const int32_t picks[] = {2, 0, 3};
    struct set { int experts; bool shared; int n; };
    for (dtype t : {dtype::q4_0x8, dtype::q8_0x8, dtype::q8_0, dtype::f32})
    for (const kernel_table* kt : all_tables())
    for (bool int8_act : {true, false})
    for (int threads : {1, 2, 3})
    for (set st : {set{8, false, 1}, set{2, true, 1}, set{3, false, 1}, set{2, true, 3}}) {
        const std::string table = kt->name;
        CAPTURE(format::dtype_name(t));
        CAPTURE(table);
        CAPTURE(int8_act);
        CAPTURE(threads);
        CAPTURE(st.experts);
        CAPTURE(st.n);
        cpu_options o;
        o.n_threads = threads;
        o.kernels = kt;
        o.int8_activations = int8_act;
        auto be = make_cpu_backend(o, 4096);
        const int n_jobs = st.experts + (st.shared ? 1 : 0);
        std::vector<std::vector<uint8_t>> weights;
        std::vector<tensor_view> views(3 * size_t(n_jobs));
        for (int j = 0; j < n_jobs; ++j) {
            const int64_t ff = j == st.experts ? n_sh : n_ff;
            const int64_t rows[3] = {ff, ff, dim}, cols[3] = {dim, dim, ff};
            for (int m = 0; m < 3; ++m) {
                weights.push_back(stored_matrix(t, random_vec(size_t(rows[m] * cols[m]), 131 + weights.size(), 0.5f), rows[m], cols[m]));
                views[size_t(3 * j + m)] = matrix_view(t, rows[m], cols[m], weights.back());
            }
        }
        // each job's buffers after the one before, as a session lays them out
        const int64_t ff_all = int64_t(st.n) * (st.experts * n_ff + (st.shared ? n_sh : 0));
        std::vector<float> g(size_t(ff_all), NAN), u(size_t(ff_all), NAN), y(size_t(n_jobs * st.n * dim), NAN);
        std::vector<ffn_job> jobs;
        int64_t at = 0;
        for (int j = 0; j < n_jobs; ++j) {
            const int64_t ff = int64_t(views[size_t(3 * j)].rows());
            jobs.push_back({&views[size_t(3 * j)], &views[size_t(3 * j + 1)], &views[size_t(3 * j + 2)], x.data(), st.n,
                            st.n > 1 && j < st.experts ? picks : nullptr, g.data() + at, u.data() + at,
                            y.data() + size_t(j * st.n * dim)});
            at += st.n * ff;
        }
        be->ffn_many(jobs.data(), n_jobs);
        for (int j = 0; j < n_jobs; ++j) {
            CAPTURE(j);
            const ffn_job& f = jobs[size_t(j)];
            const size_t ff = f.gate->rows() * size_t(st.n);
            std::vector<float> wg(ff), wu(ff), wy(size_t(st.n * dim));
            const matmul_job gate_up[2] = {{f.gate, x.data(), st.n, wg.data(), f.x_rows}, {f.up, x.data(), st.n, wu.data(), f.x_rows}};
            be->matmul_many(gate_up, 2);
            be->swiglu(wg.data(), wu.data(), int64_t(ff));
            be->matmul(*f.down, wg.data(), st.n, wy.data());
            for (size_t i = 0; i < ff; ++i) REQUIRE(f.g[i] == wg[i]);
            for (size_t i = 0; i < wy.size(); ++i) REQUIRE(f.y[i] == wy[i]);
        }
    }
}

TEST_CASE("backend sums weighted rows in order as add_scaled does") {
    for (int threads : {1, 3}) {
        cpu_options o;
        o.n_threads = threads;
        auto be = make_cpu_backend(o, 256);
        for (auto [n, k, dim] : {std::tuple{1, 9, 1024}, std::tuple{7, 2, 33}, std::tuple{300, 8, 512}}) { // the last across the threads
            CAPTURE(threads);
            CAPTURE(n);
            const int n_rows = 2 * n * k + 5;
            const auto rows = random_vec(size_t(n_rows) * dim, 91 + n);
            std::vector<int32_t> index(size_t(n) * k);
            std::vector<float> weight(size_t(n) * k);
            xorshift64s rng(92 + uint64_t(n));
            for (size_t i = 0; i < index.size(); ++i) {
                index[i] = static_cast<int32_t>(rng.uniform() * n_rows) % n_rows;
                weight[i] = 2.0f * rng.uniform() - 1.0f;
            }
            std::vector<float> got(size_t(n) * dim, NAN), want(size_t(n) * dim, 0.0f);
            be->weighted_sum_rows(got.data(), rows.data(), index.data(), weight.data(), n, k, dim);
            for (int t = 0; t < n; ++t) {
                for (int i = 0; i < k; ++i) {
                    be->add_scaled(want.data() + size_t(t) * dim, rows.data() + size_t(index[size_t(t * k + i)]) * dim, dim, weight[size_t(t * k + i)]);
                }
            }
            CHECK(got == want);
        }
    }
}

TEST_CASE("per-head products and row copies match a direct computation") {
    const int n_head = 3, rows = 5, cols = 40, n = 4;
    const int64_t x_stride = cols + 3, y_stride = rows + 2; // gaps between the vectors stay untouched
    const auto x = random_vec(size_t(n) * n_head * x_stride, 31);
    for (format::dtype type : {format::dtype::f32, format::dtype::f16}) {
        for (int threads : {1, 3}) {
            CAPTURE(format::dtype_name(type));
            CAPTURE(threads);
            cpu_options o;
            o.n_threads = threads;
            auto be = make_cpu_backend(o, 256);
            const test::test_matrix w = test::make_matrix(type, int64_t(n_head) * rows, cols, 32);
            std::vector<float> got(size_t(n) * n_head * y_stride, -7.0f), want = got, row(cols);
            be->head_matmul(w.view, n_head, x.data(), x_stride, n, got.data(), y_stride);
            for (int i = 0; i < n * n_head; ++i) {
                for (int r = 0; r < rows; ++r) {
                    format::row_to_f32(type, w.view.data + size_t((i % n_head) * rows + r) * format::row_bytes(type, cols), row.data(), cols);
                    double dot = 0;
                    for (int c = 0; c < cols; ++c) dot += double(row[size_t(c)]) * x[size_t(i * x_stride + c)];
                    want[size_t(i * y_stride + r)] = float(dot);
                }
            }
            for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
        }
    }
    auto be = make_cpu_backend(cpu_options{}, 256);
    std::vector<float> dst(4 * 10, -1.0f);
    be->copy_rows(dst.data() + 2, 10, x.data() + 1, 7, 4, 5);
    for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < 10; ++c) CHECK(dst[size_t(r * 10 + c)] == (c >= 2 && c < 7 ? x[size_t(r * 7 + 1 + c - 2)] : -1.0f));
    }
}

TEST_CASE("routing takes the best experts of the best groups, renormalises when asked, then scales") {
    // 8 experts in 4 groups of 2; group scores (their best): g0 0.9, g1 0.8, g2 0.85, g3 0.1 (as logits)
    const std::vector<float> logits = {0.9f, 0.0f, 0.8f, 0.79f, 0.85f, 0.2f, 0.1f, 0.05f};
    std::vector<float> probs(8);
    std::vector<int32_t> ids(3);
    std::vector<float> w(3);
    std::vector<float> p = logits;
    softmax(p.data(), 8);
    routing_rule rule{8, 3};
    route_top_k(logits.data(), rule, probs.data(), ids.data(), w.data());
    CHECK(ids == std::vector<int32_t>{0, 4, 2}); // no groups: the three best
    rule.n_group = 4;
    rule.n_group_used = 2; // groups 0 and 2: experts 0, 1, 4, 5
    rule.scale = 2.5f;
    route_top_k(logits.data(), rule, probs.data(), ids.data(), w.data());
    CHECK(ids == std::vector<int32_t>{0, 4, 5});
    CHECK(w[0] == p[0] * 2.5f);
    CHECK(w[2] == p[5] * 2.5f);
    rule.renorm = true;
    route_top_k(logits.data(), rule, probs.data(), ids.data(), w.data());
    const float sum = p[0] + p[4] + p[5];
    CHECK(w[1] == p[4] / sum * 2.5f);
}

TEST_CASE("attention kernels give the same bits whatever the next keys they are told of") {
    // the next call's keys are only asked for from memory: never read into a result
    const auto next_f32 = random_vec(400 * 136, 41);
    std::vector<uint16_t> next_f16(next_f32.size());
    for (size_t i = 0; i < next_f32.size(); ++i) next_f16[i] = f32_to_f16(next_f32[i]);
    for (const kernel_table* kt : all_tables())
    for (int hd : {8, 12, 64, 128, 136})
    for (int n_q : {1, 2, 3, 4})
    for (int n : {1, 6, 37, 70, 300}) {
        const std::string table = kt->name;
        CAPTURE(table);
        CAPTURE(hd);
        CAPTURE(n_q);
        CAPTURE(n);
        const auto q = random_vec(size_t(n_q) * hd, 42), k = random_vec(size_t(n) * hd, 43), v = random_vec(size_t(n) * hd, 44);
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        for (size_t i = 0; i < k.size(); ++i) {
            k16[i] = f32_to_f16(k[i]);
            v16[i] = f32_to_f16(v[i]);
        }
        std::vector<float> scores(size_t(n_q) * n), want(size_t(n_q) * hd), got(want.size());
        kt->attend(q.data(), n_q, k.data(), v.data(), n, hd, 0.3f, scores.data(), want.data(), nullptr, 0);
        for (int next_n : {1, 5, 64, 400}) {
            kt->attend(q.data(), n_q, k.data(), v.data(), n, hd, 0.3f, scores.data(), got.data(), next_f32.data(), next_n);
            CHECK(got == want);
        }
        kt->attend_f16(q.data(), n_q, k16.data(), v16.data(), n, hd, 0.3f, scores.data(), want.data(), nullptr, 0);
        for (int next_n : {1, 5, 64, 400}) {
            kt->attend_f16(q.data(), n_q, k16.data(), v16.data(), n, hd, 0.3f, scores.data(), got.data(), next_f16.data(), next_n);
            CHECK(got == want);
        }
    }
}

TEST_CASE("backend attention stores the batch and matches a direct computation with grouped heads") {
    for (const kernel_table* kt : all_tables())
    for (bool f16 : {false, true})
    for (int hd : {8, 12, 64, 128, 136})
    for (auto [n_head, n_head_kv] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{3, 1}})
    for (float scale : {0.35f, 40.0f}) { // 40: score differences past e^-87, where weights vanish
        const std::string table = kt->name;
        CAPTURE(table);
        CAPTURE(f16);
        CAPTURE(hd);
        CAPTURE(n_head_kv);
        CAPTURE(scale);
        // a batch of every position of the context: token t attends to 0..t
        const int n_ctx = 70, n = n_ctx;
        cpu_options o;
        o.n_threads = 2;
        o.kernels = kt;
        auto be = make_cpu_backend(o, 256);
        auto kn = random_vec(n * n_head_kv * hd, 31), vn = random_vec(n * n_head_kv * hd, 32);
        auto q = random_vec(n * n_head * hd, 33);
        std::vector<float> out(n * n_head * hd), scratch(2 * (n_head / n_head_kv) * n_ctx);
        std::vector<float> kc(n_head_kv * n_ctx * hd), vc(n_head_kv * n_ctx * hd); // f16 uses half
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; ++t) pos[t] = t;
        attention_args a{q.data(), kn.data(), vn.data(), kc.data(), vc.data(), f16, pos.data(), out.data(),
                         scratch.data(), n, n_ctx, n_head, n_head_kv, hd, scale};
        be->attention(a);
        // the last token again on its own (decode), its cache rows wiped first: it stores
        // them again, and gives the same bits
        const std::vector<float> kc_batch = kc, vc_batch = vc;
        const size_t row_floats = f16 ? size_t(hd) / 2 : size_t(hd);
        for (int h = 0; h < n_head_kv; ++h) {
            const size_t at = (size_t(h) * n_ctx + size_t(n - 1)) * row_floats;
            std::fill_n(kc.begin() + at, row_floats, 0.0f);
            std::fill_n(vc.begin() + at, row_floats, 0.0f);
        }
        std::vector<float> out1(n_head * hd);
        attention_args a1 = a;
        a1.q += (n - 1) * n_head * hd;
        a1.k_new += (n - 1) * n_head_kv * hd;
        a1.v_new += (n - 1) * n_head_kv * hd;
        a1.pos = pos.data() + n - 1;
        a1.out = out1.data();
        a1.n = 1;
        be->attention(a1);
        REQUIRE(std::memcmp(kc.data(), kc_batch.data(), kc.size() * sizeof(float)) == 0);
        REQUIRE(std::memcmp(vc.data(), vc_batch.data(), vc.size() * sizeof(float)) == 0);
        for (int i = 0; i < n_head * hd; ++i) REQUIRE(out1[i] == out[(n - 1) * n_head * hd + i]);
        const auto stored = [&](const std::vector<float>& x, size_t i) { return f16 ? f16_to_f32(f32_to_f16(x[i])) : x[i]; };
        for (int t : {0, 4, 31, 32, 40, 69}) { // across the kernels' chunks of keys
            for (int h = 0; h < n_head; ++h) {
                const int kvh = h / (n_head / n_head_kv);
                std::vector<double> s(t + 1);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; ++j) {
                    double d = 0;
                    for (int i = 0; i < hd; ++i) d += double(q[(t * n_head + h) * hd + i]) * stored(kn, size_t((j * n_head_kv + kvh) * hd + i));
                    s[j] = d * double(scale);
                    mx = std::max(mx, s[j]);
                }
                for (double& v : s) sum += (v = std::exp(v - mx));
                for (int i = 0; i < hd; ++i) {
                    double ref = 0;
                    for (int j = 0; j <= t; ++j) ref += s[j] / sum * stored(vn, size_t((j * n_head_kv + kvh) * hd + i));
                    // f32 rounding only: an exponential off by 1e-5 fails at the small scale;
                    // at 40 the scores' own rounding is amplified forty times
                    CHECK(out[(t * n_head + h) * hd + i] == doctest::Approx(ref).epsilon(scale < 1 ? 1e-6 : 1e-4));
                }
            }
        }
    }
}
