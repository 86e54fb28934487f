// The scalar norms, activations, softmax and conversions against double-precision maths;
// SwiGLU of every kernel table too.

#include "kernel_test_util.h"

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
            for (size_t i = 0; i < std::size(extremes) && i < g.size(); ++i)
                g[i * g.size() / std::size(extremes)] = extremes[i];
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
