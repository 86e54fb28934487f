// The CUDA backend against the CPU backend (label gpu; the same file on the CUDA emulation):
// matrix products of every weight type, per-head products and row copies.

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

namespace {

// w . x for n tokens of x, on the CPU reference and on the device.
void compare_matmul(const tensor_view& w, const std::vector<float>& x, int n, int64_t rows) {
    compare([&](backend& be, buffers& b) {
        float* y = b.zeros(size_t(n) * size_t(rows));
        be.matmul(w, b.put(x), n, y);
        return b.get(y, size_t(n) * size_t(rows));
    });
}

} // namespace

TEST_CASE("matrix products of every weight type match the CPU's on the device") {
    if (!gpu_present()) return;
    struct shape {
        int64_t rows, cols;
    };
    for (format::dtype type : test::device_test_types) {
        for (const shape s : {shape{8, 32}, shape{24, 96}, shape{72, 1024}, shape{1024, 2816}}) {
            const test::test_matrix w = test::make_matrix(type, s.rows, s.cols, uint64_t(s.rows + s.cols));
            for (int n : {1, 3, 9, 20, 40}) {
                if (n >= 16 && s.rows > 72) continue; // tensor-core tiles: the smaller shapes (emulation time)
                CAPTURE(format::dtype_name(type));
                CAPTURE(s.rows);
                CAPTURE(s.cols);
                CAPTURE(n);
                const std::vector<float> x = test::random_floats(size_t(n) * size_t(s.cols), 11);
                compare_matmul(w.view, x, n, s.rows);
                // the tokens taken by index from a larger activation buffer
                const std::vector<float> pool = test::random_floats(size_t(n + 5) * size_t(s.cols), 12);
                std::vector<int32_t> rows(static_cast<size_t>(n));
                for (int t = 0; t < n; ++t) rows[size_t(t)] = (t * 7 + 3) % (n + 5);
                compare([&](backend& be, buffers& b) {
                    float* y = b.zeros(size_t(n) * size_t(s.rows));
                    const matmul_job job{&w.view, b.put(pool), n, y, rows.data()};
                    be.matmul_many(&job, 1);
                    return b.get(y, size_t(n) * size_t(s.rows));
                });
            }
        }
    }
    // GGUF's types (super-blocks of 256 for the K and i types)
    for (format::dtype type : test::device_gguf_types) {
        for (const shape s : {shape{8, 256}, shape{40, 768}}) {
            const test::test_matrix w = test::make_matrix(type, s.rows, s.cols, uint64_t(s.rows + s.cols));
            for (int n : {1, 9, 20}) {
                CAPTURE(format::dtype_name(type));
                CAPTURE(s.rows);
                CAPTURE(n);
                const std::vector<float> x = test::random_floats(size_t(n) * size_t(s.cols), 14);
                compare_matmul(w.view, x, n, s.rows);
            }
        }
    }
    // float rows of a length that is not a multiple of 32
    for (format::dtype type : {format::dtype::f32, format::dtype::f16, format::dtype::bf16}) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix w = test::make_matrix(type, 5, 37, 3);
        const int64_t cols = 37;
        for (int n : {1, 4}) {
            const std::vector<float> x = test::random_floats(size_t(n) * cols, 13);
            compare_matmul(w.view, x, n, 5);
        }
    }
}

TEST_CASE("per-head products and row copies match the CPU's on the device") {
    if (!gpu_present()) return;
    const int n_head = 4, rows = 24, cols = 72, n = 3;
    const std::vector<float> x = test::random_floats(size_t(n) * n_head * (cols + 8), 7);
    for (format::dtype type : {format::dtype::f32, format::dtype::f16}) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix w = test::make_matrix(type, int64_t(n_head) * rows, cols, 8);
        compare([&](backend& be, buffers& b) {
            float* y = b.zeros(size_t(n) * n_head * (rows + 5));
            be.head_matmul(w.view, n_head, b.put(x), cols + 8, n, y, rows + 5);
            return b.get(y, size_t(n) * n_head * (rows + 5));
        });
    }
    compare([&](backend& be, buffers& b) {
        float* y = b.zeros(size_t(n) * 50);
        be.copy_rows(y + 3, 50, b.put(x), cols, n, 40);
        return b.get(y, size_t(n) * 50);
    });
}
