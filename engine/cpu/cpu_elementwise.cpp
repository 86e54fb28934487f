// Activations (GELU, GeGLU, SwiGLU, soft-capping) and the other operations on rows.

#include "cpu/cpu_backend.h"

#include "cpu/kernels.h"

#include <cmath>
#include <cstring>

namespace colibri {

void cpu_backend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                            int cols) {
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * dst_stride, src + r * src_stride, sizeof(float) * size_t(cols));
}

void cpu_backend::gelu(float* x, int64_t n) {
    split(n, 8 * n, 1024, [&](int64_t b, int64_t e) { kernels::gelu(x + b, e - b); });
}

void cpu_backend::geglu(float* gate, const float* up, int64_t n) {
    split(n, 8 * n, 1024, [&](int64_t b, int64_t e) { kernels::geglu(gate + b, up + b, e - b); });
}

void cpu_backend::softcap(float* x, int64_t n, float cap) {
    split(n, 8 * n, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) x[i] = cap * std::tanh(x[i] / cap);
    });
}

void cpu_backend::add_bias(float* y, const tensor_view& b, int n, int dim) {
    const auto* bf = reinterpret_cast<const float*>(b.data);
    for (int t = 0; t < n; ++t) {
        for (int i = 0; i < dim; ++i) y[t * dim + i] += bf[i];
    }
}

void cpu_backend::swiglu(float* gate, const float* up, int64_t n) {
    // an exponential each, counted as eight multiply-adds for the split threshold: worth
    // the threads for a batch of several tokens (a verifying step's eight), not for one
    // token's experts (a few thousand elements take about what a dispatch does)
    split(n, 8 * n, 1024, [&](int64_t b, int64_t e) { kt_.swiglu(gate + b, up + b, e - b); });
}

void cpu_backend::add_scaled(float* x, const float* y, int64_t n, float s) {
    split(n, n, 4096, [&](int64_t b, int64_t e) { add_scaled_row(x + b, y + b, e - b, s); });
}

void cpu_backend::scale(float* x, int64_t n, float s) {
    split(n, n, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) x[i] *= s;
    });
}

} // namespace colibri
