// Element-wise operations (activations, bias, scaling) and row copies: a thread per
// element.

#include "cuda/cuda_backend_impl.cuh"

namespace colibri::cuda_detail {
namespace {

__global__ void copy_rows_kernel(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t total,
                                 int cols) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) dst[(i / cols) * dst_stride + i % cols] = src[(i / cols) * src_stride + i % cols];
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t total, int dim) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % dim];
}

__global__ void gelu_kernel(float* x, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

__global__ void geglu_kernel(float* gate, const float* up, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = gate[i];
    gate[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))) * up[i];
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void swiglu_kernel(float* gate, const float* up, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

__global__ void add_scaled_kernel(float* x, const float* y, int64_t n, float s) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], __fmul_rn(s, y[i]));
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], s);
}

} // namespace

void cuda_backend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                             int cols) {
    select();
    const op_timer timer(*this, "copy_rows");
    const int64_t total = rows * cols;
    COLIBRI_LAUNCH(copy_rows_kernel, blocks_for(total, 256), 256, 0, stream_.get())
    (dst, dst_stride, src, src_stride, total, cols);
    COLIBRI_LAUNCHED("copy_rows");
}

void cuda_backend::add_bias(float* y, const tensor_view& b, int n, int dim) {
    select();
    const op_timer timer(*this, "add_bias");
    const device_weights& d = weights(b);
    const int64_t total = int64_t(n) * dim;
    COLIBRI_LAUNCH(add_bias_kernel, blocks_for(total, 256), 256, 0, stream_.get())(y, d.f32(), total, dim);
    COLIBRI_LAUNCHED("add_bias");
}

void cuda_backend::gelu(float* x, int64_t n) {
    select();
    const op_timer timer(*this, "gelu");
    COLIBRI_LAUNCH(gelu_kernel, blocks_for(n, 256), 256, 0, stream_.get())(x, n);
    COLIBRI_LAUNCHED("gelu");
}

void cuda_backend::geglu(float* gate, const float* up, int64_t n) {
    select();
    const op_timer timer(*this, "geglu");
    COLIBRI_LAUNCH(geglu_kernel, blocks_for(n, 256), 256, 0, stream_.get())(gate, up, n);
    COLIBRI_LAUNCHED("geglu");
}

void cuda_backend::softcap(float* x, int64_t n, float cap) {
    select();
    const op_timer timer(*this, "softcap");
    COLIBRI_LAUNCH(softcap_kernel, blocks_for(n, 256), 256, 0, stream_.get())(x, n, cap);
    COLIBRI_LAUNCHED("softcap");
}

void cuda_backend::swiglu(float* gate, const float* up, int64_t n) {
    select();
    const op_timer timer(*this, "swiglu");
    COLIBRI_LAUNCH(swiglu_kernel, blocks_for(n, 256), 256, 0, stream_.get())(gate, up, n);
    COLIBRI_LAUNCHED("swiglu");
}

void cuda_backend::add_scaled(float* x, const float* y, int64_t n, float s) {
    select();
    const op_timer timer(*this, "add_scaled");
    COLIBRI_LAUNCH(add_scaled_kernel, blocks_for(n, 256), 256, 0, stream_.get())(x, y, n, s);
    COLIBRI_LAUNCHED("add_scaled");
}

void cuda_backend::scale(float* x, int64_t n, float s) {
    select();
    const op_timer timer(*this, "scale");
    COLIBRI_LAUNCH(scale_kernel, blocks_for(n, 256), 256, 0, stream_.get())(x, n, s);
    COLIBRI_LAUNCHED("scale");
}

} // namespace colibri::cuda_detail
