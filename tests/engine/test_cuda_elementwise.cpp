// The CUDA backend against the CPU backend (label gpu; the same file on the CUDA emulation):
// RMSNorm, RoPE, biases, the activations, element-wise operations and token embeddings.

#include "api/runtime.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda/device_weights.h"
#include "cuda_test_util.h"
#include "device_test_util.h"
#include "model/model.h"
#include "model/session.h"
#include "test_util.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace colibri;
using namespace colibri::test;

TEST_CASE("RMSNorm, RoPE, biases, SwiGLU and the element-wise operations match the CPU's on the device") {
    if (!gpu_present()) return;
    const int n = 5, dim = 96, heads = 6, hd = 16;
    const std::vector<float> x = test::random_floats(size_t(n) * dim, 1, 3.0f);
    const std::vector<float> y = test::random_floats(size_t(n) * dim, 2);
    const test::test_matrix norm = test::make_vector(dim, 3, 1.0f);
    const std::vector<int32_t> pos = {0, 1, 7, 300, 4095};
    SUBCASE("rmsnorm, separate and in place") {
        compare([&](backend& be, buffers& b) {
            float* out = b.zeros(x.size());
            be.rmsnorm(b.put(x), norm.view, n, dim, 1e-6f, out);
            return b.get(out, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rmsnorm(in, norm.view, n * heads, hd, 1e-5f, in); // per head, as Qwen3's q/k norms
            return b.get(in, x.size());
        });
    }
    SUBCASE("layernorm and gelu") {
        const test::test_matrix bias = test::make_vector(dim, 4);
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.layernorm(in, norm.view, bias.view, n, dim, 1e-5f, in);
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.gelu(in, int64_t(x.size()));
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* g = b.put(x);
            be.geglu(g, b.put(y), int64_t(x.size()));
            return b.get(g, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.softcap(in, int64_t(x.size()), 1.5f);
            return b.get(in, x.size());
        });
    }
    SUBCASE("rope") {
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rope(in, n, heads, hd, pos.data(), {10000.0f});
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rope(in, n, 3, 32, pos.data(), {1e6f});
            return b.get(in, x.size());
        });
        const test::test_matrix factors = test::make_vector(16, 9, 4.0f); // scaled RoPE: llama3, YaRN
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rope(in, n, 3, 32, pos.data(), {5e5f, &factors.view, 1.2f});
            return b.get(in, x.size());
        });
    }
    SUBCASE("bias, swiglu, add_scaled, scale") {
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.add_bias(in, norm.view, n, dim);
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* g = b.put(x);
            be.swiglu(g, b.put(y), int64_t(x.size()));
            return b.get(g, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.add_scaled(in, b.put(y), int64_t(x.size()), 0.7f);
            be.scale(in, int64_t(x.size()), -1.5f);
            return b.get(in, x.size());
        });
    }
    SUBCASE("weighted sums of rows") {
        const int k = 3;
        const std::vector<float> rows = test::random_floats(size_t(8) * dim, 4);
        const std::vector<int32_t> index = {0, 3, 7, 1, 2, 6, 5, 5, 4, 7, 0, 2, 6, 3, 1};
        const std::vector<float> weight = test::random_floats(size_t(n) * k, 5);
        compare([&](backend& be, buffers& b) {
            float* out = b.zeros(size_t(n) * dim);
            be.weighted_sum_rows(out, b.put(rows), index.data(), weight.data(), n, k, dim);
            return b.get(out, size_t(n) * dim);
        });
    }
}

TEST_CASE("token embeddings of every table type match the CPU's on the device") {
    if (!gpu_present()) return;
    const std::vector<int32_t> ids = {5, 0, 31, 17, 5};
    for (format::dtype type : test::device_test_types) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix table = test::make_matrix(type, 32, 64, 9);
        for (float scale : {1.0f, 8.0f}) {
            compare([&](backend& be, buffers& b) {
                float* out = b.zeros(ids.size() * 64);
                be.embed(table.view, ids.data(), int(ids.size()), scale, out);
                return b.get(out, ids.size() * 64);
            });
        }
    }
}
