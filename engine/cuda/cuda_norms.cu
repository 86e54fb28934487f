// RMSNorm and LayerNorm: one thread block per row.

#include "cuda/cuda_backend_impl.cuh"

namespace colibri::cuda_detail {
namespace {

__global__ void rmsnorm_kernel(const float* x, const float* w, int dim, float eps, float* out) {
    __shared__ float shared[32];
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* o = out + int64_t(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_reduce<false>(ss, shared);
    const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
    // each thread writes only the elements it read: out may alias x
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

// One row per block: the mean, then the variance around it (two passes), then
// (x - mean) / sd * w + b.
__global__ void layernorm_kernel(const float* x, const float* w, const float* b, int dim, float eps, float* out) {
    __shared__ float shared[32];
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* o = out + int64_t(blockIdx.x) * dim;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i];
    const float m = block_reduce<false>(sum, shared) / float(dim);
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (xr[i] - m) * (xr[i] - m);
    const float inv = 1.0f / sqrtf(block_reduce<false>(ss, shared) / float(dim) + eps);
    // each thread writes only the elements it read: out may alias x
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[i], m), inv), w[i]), b[i]);
}

} // namespace

void cuda_backend::rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) {
    select();
    const op_timer timer(*this, "rmsnorm");
    const device_weights& d = weights(w);
    COLIBRI_LAUNCH(rmsnorm_kernel, n, 256, 0, stream_.get())(x, d.f32(), dim, eps, out);
    COLIBRI_LAUNCHED("rmsnorm");
}

void cuda_backend::layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                             float* out) {
    select();
    const op_timer timer(*this, "layernorm");
    const device_weights& dw = weights(w);
    const device_weights& db = weights(b);
    COLIBRI_LAUNCH(layernorm_kernel, n, 256, 0, stream_.get())(x, dw.f32(), db.f32(), dim, eps, out);
    COLIBRI_LAUNCHED("layernorm");
}

} // namespace colibri::cuda_detail
