// RMSNorm and LayerNorm, a batch's rows across the threads.

#include "cpu/cpu_backend.h"

#include "cpu/kernels.h"

namespace colibri {

void cpu_backend::rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) {
    const auto* wf = reinterpret_cast<const float*>(w.data);
    // a prefill batch's rows across the threads (about three operations per element)
    split(n, 3LL * n * dim, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) kernels::rmsnorm(out + t * dim, x + t * dim, wf, dim, eps);
    });
}

void cpu_backend::layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                            float* out) {
    const auto* wf = reinterpret_cast<const float*>(w.data);
    const auto* bf = reinterpret_cast<const float*>(b.data);
    split(n, 4LL * n * dim, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) kernels::layernorm(out + t * dim, x + t * dim, wf, bf, dim, eps);
    });
}

} // namespace colibri
