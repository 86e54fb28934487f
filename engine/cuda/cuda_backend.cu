// The backend operations as CUDA kernels on one stream. Weights are repacked on the host
// (device_weights.h) and copied to the device when an operation first uses them, or, under
// a weight budget, routed experts into per-layer slots when a token needs them.
//
// The kernels are the straightforward ones, each checked against the CPU backend by the
// `gpu` tests (tests/engine/test_cuda_backend.cpp, also run on a CPU emulation of CUDA):
// - matrix products: one warp per output row, each lane a block of 32 weights at a time
//   (16-byte loads, dequantised in registers), up to eight tokens per pass over the row;
// - attention: one token split across the context in chunks, a batch one thread block per
//   token and query head;
// - one token's MoE layer routed on the device (moe_one);
// - the rest element by element, RMSNorm one block per row.
// Host arrays an operation takes (positions, token rows, expert weights) are copied to
// the device with it, in stream order. A session's decode steps run as a CUDA graph.

#include "cuda/cuda_backend.h"

#include "core/error.h"
#include "cuda/bandwidth_probe.h"
#include "cuda/device_weights.h"
#include "format/format.h"
#include "format/row_codec.h"

#if defined(COLIBRI_CUDA_EMULATED) // the tests' CPU emulation (tests/engine/cuda_emulation.h)
#include "cuda_emulation.h"
#define COLIBRI_LAUNCH(kernel, grid, block, shared, stream) ::colibri::emulation::launch(kernel, grid, block, shared)
#define COLIBRI_DYNAMIC_SHARED(T, name) T* name = ::colibri::emulation::dynamic_shared<T>()
#define COLIBRI_UNROLL
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
// kernel<<<...>>>, spelt so that the tests' emulation can run the same launch
#define COLIBRI_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define COLIBRI_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#define COLIBRI_UNROLL _Pragma("unroll")
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace colibri {
namespace {

// A failed allocation is out_of_memory; any other CUDA error leaves the device's state in
// doubt (most are sticky: every later call fails too), so it is a device error.
void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    throw error(e == cudaErrorMemoryAllocation ? errc::out_of_memory : errc::device,
                std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define COLIBRI_CUDA(call) check((call), #call)
// after every kernel launch: a bad configuration is reported here, not by a later call
#define COLIBRI_LAUNCHED(kernel) check(cudaGetLastError(), kernel)

// Device memory that frees itself.
class device_memory {
public:
    device_memory() = default;
    explicit device_memory(size_t bytes) : bytes_(bytes) {
        if (bytes > 0) COLIBRI_CUDA(cudaMalloc(&p_, bytes));
    }
    ~device_memory() { release(); }
    device_memory(device_memory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    device_memory& operator=(device_memory&& o) noexcept {
        if (this != &o) {
            release();
            p_ = std::exchange(o.p_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    device_memory(const device_memory&) = delete;
    device_memory& operator=(const device_memory&) = delete;

    void* get() const { return p_; }
    size_t bytes() const { return bytes_; }
    /// At least `bytes`; the contents are not kept when it grows.
    void reserve(size_t bytes) {
        if (bytes > bytes_) *this = device_memory(std::max(bytes, bytes_ * 2));
    }

private:
    void release() noexcept {
        if (p_ != nullptr) cudaFree(p_); // frees after the work queued before it
        p_ = nullptr;
    }
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

class cuda_buffer final : public device_buffer {
public:
    cuda_buffer(size_t n, cudaStream_t stream) : n_(n), mem_(std::max<size_t>(n, 1) * sizeof(float)) {
        COLIBRI_CUDA(cudaMemsetAsync(mem_.get(), 0, mem_.bytes(), stream));
        COLIBRI_CUDA(cudaStreamSynchronize(stream));
    }
    float* data() override { return static_cast<float*>(mem_.get()); }
    size_t size() const override { return n_; }

private:
    size_t n_;
    device_memory mem_;
};

// A weight tensor on the device.
struct device_weights {
    device_kind kind = device_kind::f32;
    int64_t rows = 0, cols = 0, row_bytes = 0;
    device_memory values, scales;
    const uint8_t* v() const { return static_cast<const uint8_t*>(values.get()); }
    const float* s() const { return static_cast<const float*>(scales.get()); }
    const float* f32() const { return static_cast<const float*>(values.get()); }
};

// ---- reductions ----

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The sum (or maximum) over the thread block, returned to every thread. blockDim.x a
// multiple of 32, at most 1024; `shared` 32 floats.
template <bool Max>
__device__ float block_reduce(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = Max ? warp_max(v) : warp_sum(v);
    __syncthreads(); // `shared` may still be read by a previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : (Max ? -INFINITY : 0.0f);
    return Max ? warp_max(v) : warp_sum(v);
}

// ---- matrix products ----

constexpr int mm_rows = 8; // rows per thread block, one warp each
constexpr int mm_tokens = 8;

// scale_floats(K) as a constant device code may read (the function is host code).
template <device_kind K>
constexpr int kind_scales = scale_floats(K);

// Block b (32 elements) of a row in f32; `scales` the row's, kind_scales<K> per block.
template <device_kind K>
__device__ inline void load_block(const uint8_t* row, const float* scales, int64_t b, float w[32]) {
    if constexpr (K == device_kind::q4m || K == device_kind::iq4) {
        constexpr float iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const int4 v = *reinterpret_cast<const int4*>(row + b * 16);
        const uint8_t* q = reinterpret_cast<const uint8_t*>(&v);
        const float d = scales[kind_scales<K> * b], m = K == device_kind::q4m ? scales[2 * b + 1] : 0.0f;
COLIBRI_UNROLL
        for (int j = 0; j < 16; ++j) {
            if constexpr (K == device_kind::q4m) {
                w[j] = d * float(q[j] & 15) + m;
                w[j + 16] = d * float(q[j] >> 4) + m;
            } else {
                w[j] = d * iq4[q[j] & 15];
                w[j + 16] = d * iq4[q[j] >> 4];
            }
        }
    } else if constexpr (K == device_kind::q8m) {
        const int4* p = reinterpret_cast<const int4*>(row + b * 32);
        const int4 v[2] = {p[0], p[1]};
        const int8_t* q = reinterpret_cast<const int8_t*>(v);
        const float* s = scales + 4 * b; // d, m of elements 0-15, then of 16-31
COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) w[i] = s[2 * (i / 16)] * float(q[i]) + s[2 * (i / 16) + 1];
    } else if constexpr (K == device_kind::q8) {
        const int4* p = reinterpret_cast<const int4*>(row + b * 32);
        const int4 v[2] = {p[0], p[1]};
        const int8_t* q = reinterpret_cast<const int8_t*>(v);
        const float d = scales[b];
COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) w[i] = d * float(q[i]);
    } else if constexpr (K == device_kind::q4) {
        const int4 v = *reinterpret_cast<const int4*>(row + b * 16);
        const uint8_t* q = reinterpret_cast<const uint8_t*>(&v);
        const float d = scales[b];
COLIBRI_UNROLL
        for (int j = 0; j < 16; ++j) {
            w[j] = d * float(int(q[j] & 15) - 8);
            w[j + 16] = d * float(int(q[j] >> 4) - 8);
        }
    } else if constexpr (K == device_kind::f16 || K == device_kind::bf16) {
        const int4* p = reinterpret_cast<const int4*>(row + b * 64);
        const int4 v[4] = {p[0], p[1], p[2], p[3]};
        uint16_t h[32];
        memcpy(h, v, sizeof h);
COLIBRI_UNROLL
        for (int i = 0; i < 32; ++i) {
            w[i] = K == device_kind::f16 ? __half2float(__ushort_as_half(h[i])) : __uint_as_float(uint32_t(h[i]) << 16);
        }
    } else {
        const float4* p = reinterpret_cast<const float4*>(row + b * 128);
COLIBRI_UNROLL
        for (int i = 0; i < 8; ++i) {
            const float4 v = p[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    }
}

// acc[t] = this lane's part of row . xs[t] for t < nt: blocks lane, lane + 32, ... of the
// row's cols / 32 (the warp's sum is the dot product).
template <device_kind K, int T>
__device__ inline void row_dots(const uint8_t* row, const float* sc, int64_t cols, const float* const xs[T], int nt, float acc[T]) {
    const int lane = threadIdx.x & 31;
COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    for (int64_t b = lane; b < cols / 32; b += 32) {
        float w[32];
        load_block<K>(row, sc, b, w);
COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) {
            if (t >= nt) break;
            const float4* xv = reinterpret_cast<const float4*>(xs[t] + b * 32);
            float s = 0.0f;
COLIBRI_UNROLL
            for (int i = 0; i < 8; ++i) {
                const float4 v = xv[i];
                s += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
            }
            acc[t] += s;
        }
    }
}

// y[t, r] = x[t] . w[r] for rows r of the matrix and up to T tokens from blockIdx.y * T:
// a warp per row, its lanes taking blocks of 32 columns in turn. Token t's activations are
// row x_rows[t] of x when x_rows is set. cols a multiple of 32, x rows 16-byte aligned.
template <device_kind K, int T>
__global__ void matmul_kernel(const uint8_t* values, const float* scales, int64_t rows, int64_t cols, int64_t row_bytes,
                              const float* x, const int32_t* x_rows, int n, float* y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * mm_rows + (threadIdx.x >> 5);
    if (r >= rows) return; // no block-wide synchronisation below
    const int t0 = blockIdx.y * T, nt = min(T, n - t0);
    const float* xs[T];
COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) xs[t] = t < nt ? x + int64_t(x_rows != nullptr ? x_rows[t0 + t] : t0 + t) * cols : x;
    float acc[T];
    row_dots<K, T>(values + r * row_bytes, scales != nullptr ? scales + r * (cols / 32) * kind_scales<K> : nullptr, cols, xs, nt,
                   acc);
COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[int64_t(t0 + t) * rows + r] = s;
    }
}

// One token's products with the k experts a route chose (ids[j], on the device): the
// matrix `which` of expert ids[blockIdx.y], its weights found in the layer's table; slot j's
// activations at x + j * x_stride (x_stride 0: one vector for all), its outputs at
// y + j * rows.
struct expert_ptrs {
    const uint8_t* values[3]; // gate, up, down
    const float* scales[3];
};

template <device_kind K>
__global__ void matmul_id_kernel(const expert_ptrs* table, int which, const int32_t* ids, int64_t rows, int64_t cols,
                                 int64_t row_bytes, const float* x, int64_t x_stride, float* y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * mm_rows + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int j = blockIdx.y;
    const expert_ptrs& e = table[ids[j]];
    const float* xs[1] = {x + j * x_stride};
    float acc[1];
    row_dots<K, 1>(e.values[which] + r * row_bytes,
                   e.scales[which] != nullptr ? e.scales[which] + r * (cols / 32) * kind_scales<K> : nullptr,
                   cols, xs, 1, acc);
    const float s = warp_sum(acc[0]);
    if (lane == 0) y[j * rows + r] = s;
}

// The routing of one token (one thread: a router has tens of experts), as the session
// routes on the host: softmax, the k best by repeated arg-max (ties to the lower index,
// NaN never), their weights, renormalised when asked; then in index order, the order the
// session sums them in.
__global__ void route_kernel(const float* logits, int n_expert, int k, bool renorm, int n_group, int n_group_used,
                             float scale, float* probs, int32_t* ids, float* weights) {
    if (threadIdx.x != 0) return;
    float max = logits[0];
    for (int i = 1; i < n_expert; ++i) max = max < logits[i] ? logits[i] : max;
    float sum = 0.0f;
    for (int i = 0; i < n_expert; ++i) {
        probs[i] = expf(logits[i] - max);
        sum = __fadd_rn(sum, probs[i]);
    }
    const float inv = __fdiv_rn(1.0f, sum);
    for (int i = 0; i < n_expert; ++i) probs[i] = __fmul_rn(probs[i], inv);
    if (n_group > 1) { // the experts of the n_group_used groups of best expert only
        const int size = n_expert / n_group;
        uint64_t kept = 0;
        for (int j = 0; j < n_group_used; ++j) {
            int best = -1;
            float best_p = -1.0f;
            for (int g = 0; g < n_group; ++g) {
                if (kept >> g & 1) continue;
                float p = probs[g * size];
                for (int e = 1; e < size; ++e) p = fmaxf(p, probs[g * size + e]);
                if (best < 0 || p > best_p) best = g, best_p = p;
            }
            kept |= uint64_t(1) << best;
        }
        for (int e = 0; e < n_expert; ++e) {
            if (!(kept >> (e / size) & 1)) probs[e] = -1.0f;
        }
    }
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < n_expert; ++e) {
            if (probs[e] >= 0.0f && (best < 0 || probs[e] > probs[best])) best = e;
        }
        if (best < 0) best = j; // only when the router produced NaN: keep ids valid
        ids[j] = best;
        weights[j] = fmaxf(probs[best], 0.0f);
        probs[best] = -1.0f;
        total = __fadd_rn(total, weights[j]);
    }
    for (int j = 0; j < k; ++j) {
        if (renorm) weights[j] = __fdiv_rn(weights[j], total);
        if (scale != 1.0f) weights[j] = __fmul_rn(weights[j], scale);
    }
    for (int j = 1; j < k; ++j) { // insertion sort by index
        for (int i = j; i > 0 && ids[i - 1] > ids[i]; --i) {
            const int32_t id = ids[i];
            ids[i] = ids[i - 1];
            ids[i - 1] = id;
            const float w = weights[i];
            weights[i] = weights[i - 1];
            weights[i - 1] = w;
        }
    }
}

// out[d] = the k experts' outputs y[j] weighted and summed in order, then the shared
// expert's (weight 1, or sigmoid of its gate's output when it has one).
__global__ void moe_sum_kernel(float* out, const float* y, const float* weights, int k, int dim, const float* shared_y,
                               const float* shared_gate) {
    const int d = int(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d >= dim) return;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) o = __fadd_rn(o, __fmul_rn(weights[j], y[int64_t(j) * dim + d]));
    if (shared_y != nullptr) {
        const float w = shared_gate != nullptr ? __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-shared_gate[0]))) : 1.0f;
        o = __fadd_rn(o, __fmul_rn(w, shared_y[d]));
    }
    out[d] = o;
}

// The same for float rows whose length is not a multiple of 32 (small test models): a
// warp per row and token, element by element.
template <device_kind K>
__global__ void matmul_any_kernel(const uint8_t* values, int64_t rows, int64_t cols, int64_t row_bytes, const float* x,
                                  const int32_t* x_rows, int n, float* y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = int64_t(blockIdx.x) * mm_rows + (threadIdx.x >> 5);
    const int t = blockIdx.y;
    if (r >= rows || t >= n) return;
    const float* xt = x + int64_t(x_rows != nullptr ? x_rows[t] : t) * cols;
    const uint8_t* row = values + r * row_bytes;
    float acc = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
        float w;
        if constexpr (K == device_kind::f32) {
            w = reinterpret_cast<const float*>(row)[c];
        } else {
            const uint16_t h = reinterpret_cast<const uint16_t*>(row)[c];
            w = K == device_kind::f16 ? __half2float(__ushort_as_half(h)) : __uint_as_float(uint32_t(h) << 16);
        }
        acc += w * xt[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[int64_t(t) * rows + r] = acc;
}

// ---- element-wise and row operations ----

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

// One warp per output of head_matmul: output o is row o % rows of head (o / rows) % n_head's
// matrix (f32 or f16) with vector o / rows of x.
template <bool F16>
__global__ void head_matmul_kernel(const uint8_t* w, int64_t row_bytes, int rows, int cols, int n_head, const float* x,
                                   int64_t x_stride, float* y, int64_t y_stride, int64_t outputs) {
    const int64_t o = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (o >= outputs) return; // a whole warp
    const int64_t i = o / rows, r = o % rows;
    const uint8_t* row = w + ((i % n_head) * rows + r) * row_bytes;
    const float* xi = x + i * x_stride;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        const float v = F16 ? __half2float(reinterpret_cast<const __half*>(row)[c]) : reinterpret_cast<const float*>(row)[c];
        acc += v * xi[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[i * y_stride + r] = acc;
}

__global__ void copy_rows_kernel(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t total,
                                 int cols) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) dst[(i / cols) * dst_stride + i % cols] = src[(i / cols) * src_stride + i % cols];
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t total, int dim) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % dim];
}

// Pairs (i, i + head_dim / 2) of each head rotated by pos * theta^(-2i / head_dim) / ff[i]
// (ff null: 1), cos and sin times attn; the angle in double as on the CPU.
__global__ void rope_kernel(float* x, int64_t pairs, int n_heads, int head_dim, const int32_t* pos, float theta,
                            const float* ff, float attn) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    const int half = head_dim / 2;
    const int i = int(idx % half);
    const int64_t head = idx / half; // token * n_heads + h
    const int t = int(head / n_heads);
    double freq = pow(double(theta), -2.0 * i / head_dim);
    if (ff != nullptr) freq /= double(ff[i]);
    const double angle = double(pos[t]) * freq;
    const float c = float(double(attn) * cos(angle)), s = float(double(attn) * sin(angle));
    float* v = x + head * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
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
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[i], m), inv), w[i]), b[i]);
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

// out[t, d] = sum over i < k of weight[t * k + i] * rows[index[t * k + i], d], in order of i.
__global__ void weighted_sum_kernel(float* out, const float* rows, const int32_t* index, const float* weight, int n, int k,
                                    int dim) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n) * dim) return;
    const int64_t t = i / dim, d = i % dim;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) o = __fadd_rn(o, __fmul_rn(weight[t * k + j], rows[int64_t(index[t * k + j]) * dim + d]));
    out[i] = o;
}

// ---- attention ----

// The batch's keys and values into each head's rows at pos[t].
__global__ void kv_store_kernel(const float* k_new, const float* v_new, void* k_cache, void* v_cache, bool f16,
                                const int32_t* pos, int n, int n_head_kv, int head_dim, int n_ctx) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t kv_dim = int64_t(n_head_kv) * head_dim;
    if (i >= int64_t(n) * kv_dim) return;
    const int64_t t = i / kv_dim, h = (i % kv_dim) / head_dim, d = i % head_dim;
    const int64_t to = (h * n_ctx + pos[t]) * head_dim + d;
    if (f16) {
        static_cast<__half*>(k_cache)[to] = __float2half_rn(k_new[i]);
        static_cast<__half*>(v_cache)[to] = __float2half_rn(v_new[i]);
    } else {
        static_cast<float*>(k_cache)[to] = k_new[i];
        static_cast<float*>(v_cache)[to] = v_new[i];
    }
}

template <bool F16>
__device__ inline float cache_at(const void* cache, int64_t i) {
    if constexpr (F16) return __half2float(static_cast<const __half*>(cache)[i]);
    else return static_cast<const float*>(cache)[i];
}

// Token t = blockIdx.x / n_head, query head h = blockIdx.x % n_head, over cache rows
// 0..pos[t] of its KV head: scores into `scores` (n_ctx floats per block), softmax, then the
// weighted values. Dynamic shared memory: head_dim floats (the query).
template <bool F16>
__global__ void attention_kernel(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos, int n_head,
                                 int n_head_kv, int head_dim, int n_ctx, float scale, int window, float softcap,
                                 float* scores, float* out) {
    COLIBRI_DYNAMIC_SHARED(float, q_s);
    __shared__ float shared[32];
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int kvh = h / (n_head / n_head_kv);
    const int len = pos[t] + 1, lo = window > 0 ? max(0, len - window) : 0; // rows lo..len-1
    const float* qh = q + (int64_t(t) * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = qh[d];
    __syncthreads();
    const int64_t base = int64_t(kvh) * n_ctx * head_dim;
    float* s = scores + int64_t(blockIdx.x) * n_ctx;
    float m = -INFINITY;
    for (int j = lo + int(threadIdx.x); j < len; j += blockDim.x) {
        const int64_t row = base + int64_t(j) * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_s[d] * cache_at<F16>(k_cache, row + d);
        dot *= scale;
        if (softcap > 0) dot = softcap * tanhf(dot / softcap);
        s[j] = dot;
        m = fmaxf(m, dot);
    }
    m = block_reduce<true>(m, shared);
    float sum = 0.0f;
    for (int j = lo + int(threadIdx.x); j < len; j += blockDim.x) {
        const float e = expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared); // also orders the writes to s before the reads below
    const float inv = 1.0f / sum;
    float* o = out + (int64_t(t) * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = lo; j < len; ++j) acc += s[j] * inv * cache_at<F16>(v_cache, base + int64_t(j) * head_dim + d);
        o[d] = acc;
    }
}

// ---- the bandwidth probe ----

// Reads n 16-byte words, grid-stride; a word's XOR lands in *sink only when it is zero
// (never, for the probe's non-zero fill), so the reads cannot be dropped.
__global__ void read_kernel(const int4* p, int64_t n, int* sink) {
    int acc = 0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fffffff) *sink = acc;
}

// One token's attention split across the sequence (flash-decoding): block (h, s) takes
// query head h over cache rows [s * attention_chunk, ...) up to pos[0], its scores in shared
// memory, and leaves its maximum score, the sum of exp(score - max) and the values weighted
// by those (unnormalised) in `partial` ([n_head][splits][head_dim + 2]). A split past the
// token's position leaves max -inf and nothing else. Dynamic shared memory: head_dim +
// attention_chunk floats.
constexpr int attention_chunk = 256;

template <bool F16>
__global__ void attention_split_kernel(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                                       int n_head, int n_head_kv, int head_dim, int n_ctx, float scale, int window,
                                       float softcap, float* partial) {
    COLIBRI_DYNAMIC_SHARED(float, shared_mem);
    __shared__ float shared[32];
    float* q_s = shared_mem;
    float* s = shared_mem + head_dim;
    const int h = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int kvh = h / (n_head / n_head_kv);
    const int len = pos[0] + 1, lo = window > 0 ? max(0, len - window) : 0;
    const int first = max(lo, split * attention_chunk), last = min(len, split * attention_chunk + attention_chunk);
    float* out = partial + (int64_t(h) * splits + split) * (head_dim + 2);
    if (first >= last) { // every thread the same: no synchronisation skipped by some only
        if (threadIdx.x == 0) {
            out[head_dim] = -INFINITY;
            out[head_dim + 1] = 0.0f;
        }
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) out[d] = 0.0f;
        return;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = q[int64_t(h) * head_dim + d];
    __syncthreads();
    const int64_t base = int64_t(kvh) * n_ctx * head_dim;
    float m = -INFINITY;
    for (int j = first + int(threadIdx.x); j < last; j += blockDim.x) {
        const int64_t row = base + int64_t(j) * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_s[d] * cache_at<F16>(k_cache, row + d);
        dot *= scale;
        if (softcap > 0) dot = softcap * tanhf(dot / softcap);
        s[j - first] = dot;
        m = fmaxf(m, dot);
    }
    m = block_reduce<true>(m, shared);
    float sum = 0.0f;
    for (int j = first + int(threadIdx.x); j < last; j += blockDim.x) {
        const float e = expf(s[j - first] - m);
        s[j - first] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared); // also orders the writes to s before the reads below
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = first; j < last; ++j) acc += s[j - first] * cache_at<F16>(v_cache, base + int64_t(j) * head_dim + d);
        out[d] = acc;
    }
    if (threadIdx.x == 0) {
        out[head_dim] = m;
        out[head_dim + 1] = sum;
    }
}

// The splits of each query head (blockIdx.x) put together: every split's sums rescaled to
// the largest maximum, then divided by the total.
__global__ void attention_combine_kernel(const float* partial, int splits, int head_dim, float* out) {
    const int h = blockIdx.x;
    const float* p = partial + int64_t(h) * splits * (head_dim + 2);
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, p[int64_t(s) * (head_dim + 2) + head_dim]);
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float* ps = p + int64_t(s) * (head_dim + 2);
        if (ps[head_dim + 1] > 0.0f) total += ps[head_dim + 1] * expf(ps[head_dim] - m);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const float* ps = p + int64_t(s) * (head_dim + 2);
            if (ps[head_dim + 1] > 0.0f) acc += ps[d] * expf(ps[head_dim] - m);
        }
        out[int64_t(h) * head_dim + d] = acc / total;
    }
}

int blocks_for(int64_t n, int threads) { return int((n + threads - 1) / threads); }

// f(kind) with the kind as a compile-time constant (kind.value), for the kernels' templates.
template <class F>
void with_kind(device_kind kind, F&& f) {
    switch (kind) {
    case device_kind::f32: f(std::integral_constant<device_kind, device_kind::f32>{}); return;
    case device_kind::f16: f(std::integral_constant<device_kind, device_kind::f16>{}); return;
    case device_kind::bf16: f(std::integral_constant<device_kind, device_kind::bf16>{}); return;
    case device_kind::q8: f(std::integral_constant<device_kind, device_kind::q8>{}); return;
    case device_kind::q4: f(std::integral_constant<device_kind, device_kind::q4>{}); return;
    case device_kind::q4m: f(std::integral_constant<device_kind, device_kind::q4m>{}); return;
    case device_kind::iq4: f(std::integral_constant<device_kind, device_kind::iq4>{}); return;
    case device_kind::q8m: f(std::integral_constant<device_kind, device_kind::q8m>{}); return;
    }
}

class cuda_backend final : public backend {
public:
    explicit cuda_backend(const cuda_options& o) : device_(o.device) {
        COLIBRI_CUDA(cudaSetDevice(device_));
        cudaDeviceProp prop{};
        COLIBRI_CUDA(cudaGetDeviceProperties(&prop, device_));
        name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
        COLIBRI_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        if (o.weight_budget > 0) plan_expert_cache(o);
        const char* profile = std::getenv("COLIBRI_CUDA_PROFILE");
        profiling_ = profile != nullptr && *profile != '\0' && std::strcmp(profile, "0") != 0;
    }

    ~cuda_backend() override {
        cudaStreamSynchronize(stream_);
        for (const timing& t : pending_) {
            cudaEventDestroy(t.start);
            cudaEventDestroy(t.stop);
        }
        for (auto& [key, g] : steps_) {
            if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
        }
        cudaStreamDestroy(stream_); // the device memory goes with the members
    }

    std::string name() const override { return name_; }
    int n_threads() const override { return 1; }
    expert_cache_stats expert_cache_usage() const override { return stats_; }

    std::unique_ptr<device_buffer> alloc(size_t n) override {
        select();
        return std::make_unique<cuda_buffer>(n, stream_);
    }

    const float* to_host(const float* p, size_t n, std::vector<float>& staging) override {
        select();
        if (staging.size() < n) staging.resize(n);
        if (capturing_) { // the host cannot wait in a recording: the step is run plainly instead
            capture_failed_ = true;
            return staging.data();
        }
        COLIBRI_CUDA(cudaMemcpyAsync(staging.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        COLIBRI_CUDA(cudaStreamSynchronize(stream_));
        return staging.data();
    }

    void from_host(const float* src, size_t n, float* dst) override {
        select();
        COLIBRI_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        COLIBRI_CUDA(cudaStreamSynchronize(stream_));
    }

    void embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) override {
        select();
        const op_timer timer(*this, "embed");
        // the rows on the host, from the mapped table, then one copy
        embed_rows_.resize(size_t(n) * table.cols());
        format::rows_to_f32(table, ids, n, scale, embed_rows_.data());
        COLIBRI_CUDA(cudaMemcpyAsync(out, embed_rows_.data(), embed_rows_.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
        COLIBRI_CUDA(cudaStreamSynchronize(stream_)); // embed_rows_ is reused by the next call
    }

    void matmul(const tensor_view& w, const float* x, int n, float* y) override {
        select();
        product(w, x, nullptr, n, y);
    }

    void matmul_many(const matmul_job* jobs, int n_jobs) override {
        select();
        for (int j = 0; j < n_jobs; ++j) {
            const int32_t* rows = jobs[j].x_rows != nullptr ? upload(jobs[j].x_rows, size_t(jobs[j].n), 0) : nullptr;
            product(*jobs[j].w, jobs[j].x, rows, jobs[j].n, jobs[j].y);
        }
    }

    void ffn_many(const ffn_job* jobs, int n_jobs) override {
        select();
        const op_timer timer(*this, "ffn_many");
        for (int j = 0; j < n_jobs; ++j) {
            const ffn_job& f = jobs[j];
            const int32_t* rows = f.x_rows != nullptr ? upload(f.x_rows, size_t(f.n), 0) : nullptr;
            product(*f.gate, f.x, rows, f.n, f.g);
            product(*f.up, f.x, rows, f.n, f.u);
            if (f.gelu) geglu(f.g, f.u, int64_t(f.n) * int64_t(f.gate->rows()));
            else swiglu(f.g, f.u, int64_t(f.n) * int64_t(f.gate->rows()));
            product(*f.down, f.g, nullptr, f.n, f.y);
        }
    }

    void head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                     int64_t y_stride) override {
        select();
        const op_timer timer(*this, "head_matmul");
        const device_weights& d = weights(w);
        if (d.kind != device_kind::f32 && d.kind != device_kind::f16) {
            throw error(errc::unsupported, "per-head products of f32 or f16 weights only");
        }
        const int rows = static_cast<int>(d.rows / n_head);
        const int64_t outputs = int64_t(n) * n_head * rows;
        const auto kernel = d.kind == device_kind::f16 ? head_matmul_kernel<true> : head_matmul_kernel<false>;
        COLIBRI_LAUNCH(kernel, blocks_for(outputs * 32, 256), 256, 0, stream_)(d.v(), d.row_bytes, rows, static_cast<int>(d.cols),
                                                                          n_head, x, x_stride, y, y_stride, outputs);
        COLIBRI_LAUNCHED("head_matmul");
    }

    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int cols) override {
        select();
        const op_timer timer(*this, "copy_rows");
        const int64_t total = rows * cols;
        COLIBRI_LAUNCH(copy_rows_kernel, blocks_for(total, 256), 256, 0, stream_)(dst, dst_stride, src, src_stride, total, cols);
        COLIBRI_LAUNCHED("copy_rows");
    }

    void rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) override {
        select();
        const op_timer timer(*this, "rmsnorm");
        const device_weights& d = weights(w);
        COLIBRI_LAUNCH(rmsnorm_kernel, n, 256, 0, stream_)(x, d.f32(), dim, eps, out);
        COLIBRI_LAUNCHED("rmsnorm");
    }

    void layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                   float* out) override {
        select();
        const op_timer timer(*this, "layernorm");
        const device_weights& dw = weights(w);
        const device_weights& db = weights(b);
        COLIBRI_LAUNCH(layernorm_kernel, n, 256, 0, stream_)(x, dw.f32(), db.f32(), dim, eps, out);
        COLIBRI_LAUNCHED("layernorm");
    }

    void gelu(float* x, int64_t n) override {
        select();
        const op_timer timer(*this, "gelu");
        COLIBRI_LAUNCH(gelu_kernel, blocks_for(n, 256), 256, 0, stream_)(x, n);
        COLIBRI_LAUNCHED("gelu");
    }

    void geglu(float* gate, const float* up, int64_t n) override {
        select();
        const op_timer timer(*this, "geglu");
        COLIBRI_LAUNCH(geglu_kernel, blocks_for(n, 256), 256, 0, stream_)(gate, up, n);
        COLIBRI_LAUNCHED("geglu");
    }

    void softcap(float* x, int64_t n, float cap) override {
        select();
        const op_timer timer(*this, "softcap");
        COLIBRI_LAUNCH(softcap_kernel, blocks_for(n, 256), 256, 0, stream_)(x, n, cap);
        COLIBRI_LAUNCHED("softcap");
    }

    void add_bias(float* y, const tensor_view& b, int n, int dim) override {
        select();
        const op_timer timer(*this, "add_bias");
        const device_weights& d = weights(b);
        const int64_t total = int64_t(n) * dim;
        COLIBRI_LAUNCH(add_bias_kernel, blocks_for(total, 256), 256, 0, stream_)(y, d.f32(), total, dim);
        COLIBRI_LAUNCHED("add_bias");
    }

    void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& rp) override {
        select();
        const op_timer timer(*this, "rope");
        const int32_t* p = upload(pos, size_t(n), position_slot);
        const float* ff = rp.freq_factors != nullptr ? weights(*rp.freq_factors).f32() : nullptr;
        const int64_t pairs = int64_t(n) * n_heads * (head_dim / 2);
        COLIBRI_LAUNCH(rope_kernel, blocks_for(pairs, 256), 256, 0, stream_)(x, pairs, n_heads, head_dim, p, rp.theta,
                                                                             ff, rp.attn_factor);
        COLIBRI_LAUNCHED("rope");
    }

    void attention(const attention_args& a) override {
        select();
        const op_timer timer(*this, "attention");
        const int32_t* p = upload(a.pos, size_t(a.n), position_slot);
        const int64_t stored = int64_t(a.n) * a.n_head_kv * a.head_dim;
        COLIBRI_LAUNCH(kv_store_kernel, blocks_for(stored, 256), 256, 0, stream_)(a.k_new, a.v_new, a.k_cache, a.v_cache, a.kv_f16, p, a.n,
                                                                     a.n_head_kv, a.head_dim, a.n_ctx);
        COLIBRI_LAUNCHED("kv_store");
        if (a.n == 1) {
            // split across the whole context, so that the grid is the same at every position
            // (a recorded step replays it) and a long context keeps every multiprocessor busy
            const int splits = (a.n_ctx + attention_chunk - 1) / attention_chunk;
            grow(scores_, size_t(a.n_head) * size_t(splits) * size_t(a.head_dim + 2) * sizeof(float));
            float* partial = static_cast<float*>(scores_.get());
            const size_t shared = size_t(a.head_dim + attention_chunk) * sizeof(float);
            const auto kernel = a.kv_f16 ? attention_split_kernel<true> : attention_split_kernel<false>;
            COLIBRI_LAUNCH(kernel, dim3(unsigned(a.n_head), unsigned(splits)), 128, shared, stream_)(
                a.q, a.k_cache, a.v_cache, p, a.n_head, a.n_head_kv, a.head_dim, a.n_ctx, a.scale, a.window, a.softcap, partial);
            COLIBRI_LAUNCHED("attention_split");
            COLIBRI_LAUNCH(attention_combine_kernel, a.n_head, 128, 0, stream_)(partial, splits, a.head_dim, a.out);
            COLIBRI_LAUNCHED("attention_combine");
            return;
        }
        const int heads = a.n * a.n_head;
        grow(scores_, size_t(heads) * size_t(a.n_ctx) * sizeof(float));
        float* scores = static_cast<float*>(scores_.get());
        const size_t shared = size_t(a.head_dim) * sizeof(float);
        const auto kernel = a.kv_f16 ? attention_kernel<true> : attention_kernel<false>;
        COLIBRI_LAUNCH(kernel, heads, 128, shared, stream_)(a.q, a.k_cache, a.v_cache, p, a.n_head, a.n_head_kv, a.head_dim,
                                                             a.n_ctx, a.scale, a.window, a.softcap, scores, a.out);
        COLIBRI_LAUNCHED("attention");
    }

    void swiglu(float* gate, const float* up, int64_t n) override {
        select();
        const op_timer timer(*this, "swiglu");
        COLIBRI_LAUNCH(swiglu_kernel, blocks_for(n, 256), 256, 0, stream_)(gate, up, n);
        COLIBRI_LAUNCHED("swiglu");
    }

    void add_scaled(float* x, const float* y, int64_t n, float s) override {
        select();
        const op_timer timer(*this, "add_scaled");
        COLIBRI_LAUNCH(add_scaled_kernel, blocks_for(n, 256), 256, 0, stream_)(x, y, n, s);
        COLIBRI_LAUNCHED("add_scaled");
    }

    void scale(float* x, int64_t n, float s) override {
        select();
        const op_timer timer(*this, "scale");
        COLIBRI_LAUNCH(scale_kernel, blocks_for(n, 256), 256, 0, stream_)(x, n, s);
        COLIBRI_LAUNCHED("scale");
    }

    void weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n, int k,
                           int dim) override {
        select();
        const op_timer timer(*this, "weighted_sum_rows");
        const int32_t* idx = upload(index, size_t(n) * size_t(k), 2);
        const float* wt = upload(weight, size_t(n) * size_t(k), 3);
        const int64_t total = int64_t(n) * dim;
        COLIBRI_LAUNCH(weighted_sum_kernel, blocks_for(total, 256), 256, 0, stream_)(out, rows, idx, wt, n, k, dim);
        COLIBRI_LAUNCHED("weighted_sum_rows");
    }

    // Routing on the device: the router's product, route_kernel, the chosen experts' products
    // through the layer's table of expert weights (no wait for the host), the shared expert,
    // the weighted sum. Left to the session under a weight budget (the expert cache copies on
    // the host's schedule) and for layers whose experts differ in shape or type.
    bool moe_one(const moe_step& st) override {
        if (!expert_of_.empty()) return false;
        select();
        const op_timer timer(*this, "moe_one");
        const expert_table* table = table_for(st);
        if (table == nullptr) return false;
        const int k = st.k;
        const int64_t dim = static_cast<int64_t>(st.router->cols()), n_ff = table->gate.rows;
        moe_.logits.reserve_floats(*this, size_t(st.n_expert));
        moe_.probs.reserve_floats(*this, size_t(st.n_expert));
        moe_.weights.reserve_floats(*this, size_t(k));
        moe_.ids.reserve_floats(*this, size_t(k)); // int32 in float-sized cells
        moe_.g.reserve_floats(*this, size_t(k) * size_t(n_ff));
        moe_.u.reserve_floats(*this, size_t(k) * size_t(n_ff));
        moe_.y.reserve_floats(*this, size_t(k) * size_t(dim));
        float* logits = moe_.logits.f();
        auto* ids = reinterpret_cast<int32_t*>(moe_.ids.f());
        product(*st.router, st.x, nullptr, 1, logits);
        COLIBRI_LAUNCH(route_kernel, 1, 32, 0, stream_)(logits, st.n_expert, k, st.renorm, st.n_group, st.n_group_used, st.scale,
                                                        moe_.probs.f(), ids, moe_.weights.f());
        COLIBRI_LAUNCHED("route");
        const auto* ptrs = static_cast<const expert_ptrs*>(table->ptrs.get());
        launch_by_id(table->gate, ptrs, 0, ids, k, st.x, 0, moe_.g.f());
        launch_by_id(table->up, ptrs, 1, ids, k, st.x, 0, moe_.u.f());
        swiglu(moe_.g.f(), moe_.u.f(), int64_t(k) * n_ff);
        launch_by_id(table->down, ptrs, 2, ids, k, moe_.g.f(), n_ff, moe_.y.f());
        const float* shared_y = nullptr;
        const float* shared_gate = nullptr;
        if (st.shared != nullptr) {
            const int64_t sff = static_cast<int64_t>(st.shared->gate->rows());
            moe_.sg.reserve_floats(*this, size_t(sff));
            moe_.su.reserve_floats(*this, size_t(sff));
            moe_.sy.reserve_floats(*this, size_t(dim));
            const ffn_job job{st.shared->gate, st.shared->up, st.shared->down, st.x, 1, nullptr, moe_.sg.f(), moe_.su.f(), moe_.sy.f()};
            ffn_many(&job, 1);
            shared_y = moe_.sy.f();
            if (st.shared_gate != nullptr) {
                moe_.sgate.reserve_floats(*this, 1);
                product(*st.shared_gate, st.x, nullptr, 1, moe_.sgate.f());
                shared_gate = moe_.sgate.f();
            }
        }
        COLIBRI_LAUNCH(moe_sum_kernel, blocks_for(dim, 256), 256, 0, stream_)(st.out, moe_.y.f(), moe_.weights.f(), k, int(dim),
                                                                            shared_y, shared_gate);
        COLIBRI_LAUNCHED("moe_sum");
        return true;
    }

    // ---- one-token steps as CUDA graphs ----

    bool step_replay(const void* key, int32_t pos) override {
        auto it = steps_.find(key);
        if (it == steps_.end() || it->second.exec == nullptr) return false;
        select();
        set_step_position(pos);
        COLIBRI_CUDA(cudaGraphLaunch(it->second.exec, stream_));
        return true;
    }

    // The first step of a key runs plainly (it copies weights in and sizes the scratch
    // buffers), the second is recorded. Not under a weight budget: its copies follow the
    // routing.
    bool step_begin(const void* key, int32_t pos) override {
        step_graph& g = steps_[key];
        if (g.give_up || g.steps++ == 0 || !expert_of_.empty() || profiling_) return false; // a graph hides its operations' times
        select();
        set_step_position(pos);
        COLIBRI_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        capturing_ = true;
        capture_failed_ = false;
        return true;
    }

    bool step_end(const void* key) override {
        capturing_ = false;
        cudaGraph_t graph = nullptr;
        COLIBRI_CUDA(cudaStreamEndCapture(stream_, &graph));
        step_graph& g = steps_[key];
        if (capture_failed_) {
            cudaGraphDestroy(graph);
            g.give_up = true;
            return false;
        }
        const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
        cudaGraphDestroy(graph);
        COLIBRI_CUDA(made);
        COLIBRI_CUDA(cudaGraphLaunch(g.exec, stream_)); // the recorded step has not run yet
        return true;
    }

    void step_forget(const void* key) override {
        auto it = steps_.find(key);
        if (it == steps_.end()) return;
        if (it->second.exec != nullptr) {
            cudaStreamSynchronize(stream_);
            cudaGraphExecDestroy(it->second.exec);
        }
        steps_.erase(it);
    }

    // ---- the profile (COLIBRI_CUDA_PROFILE=1) ----

    // The device time of each operation, by name: calls, total milliseconds, one line each,
    // the longest first ("" when not profiling).
    std::string profile_report() {
        if (!profiling_) return {};
        resolve_timings();
        std::vector<std::pair<std::string, op_total>> rows(totals_.begin(), totals_.end());
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
        double all = 0;
        for (const auto& r : rows) all += r.second.ms;
        std::string out = "device time by operation (graphs off while profiling):\n";
        char line[160];
        for (const auto& [name, t] : rows) {
            std::snprintf(line, sizeof line, "  %-24s %9llu calls %10.3f ms %9.2f us each %5.1f%%\n", name.c_str(),
                          static_cast<unsigned long long>(t.calls), t.ms, 1000.0 * t.ms / double(std::max<uint64_t>(t.calls, 1)),
                          all > 0 ? 100.0 * t.ms / all : 0.0);
            out += line;
        }
        return out;
    }

private:
    void select() const { COLIBRI_CUDA(cudaSetDevice(device_)); }

    // Events around an operation on the stream, when profiling and not inside another timed
    // operation.
    class op_timer {
    public:
        op_timer(cuda_backend& be, const char* name) : be_(be), name_(name) {
            if (!be_.profiling_ || be_.timer_depth_++ > 0) return;
            COLIBRI_CUDA(cudaEventCreate(&start_));
            COLIBRI_CUDA(cudaEventCreate(&stop_));
            COLIBRI_CUDA(cudaEventRecord(start_, be_.stream_));
        }
        ~op_timer() {
            if (!be_.profiling_ || --be_.timer_depth_ > 0) return;
            cudaEventRecord(stop_, be_.stream_);
            be_.pending_.push_back({name_, start_, stop_});
            if (be_.pending_.size() >= 4096) be_.resolve_timings();
        }
        op_timer(const op_timer&) = delete;
        op_timer& operator=(const op_timer&) = delete;

    private:
        cuda_backend& be_;
        const char* name_;
        cudaEvent_t start_ = nullptr, stop_ = nullptr;
    };

    // The pending events' times added to the totals (waits for the stream).
    void resolve_timings() {
        cudaStreamSynchronize(stream_);
        for (const timing& t : pending_) {
            float ms = 0.0f;
            if (cudaEventElapsedTime(&ms, t.start, t.stop) == cudaSuccess) {
                op_total& total = totals_[t.name];
                ++total.calls;
                total.ms += ms;
            }
            cudaEventDestroy(t.start);
            cudaEventDestroy(t.stop);
        }
        pending_.clear();
    }

    struct timing {
        const char* name;
        cudaEvent_t start, stop;
    };
    struct op_total {
        uint64_t calls = 0;
        double ms = 0;
    };
    bool profiling_ = false;
    int timer_depth_ = 0;
    std::vector<timing> pending_;
    std::map<std::string, op_total> totals_;

    void set_step_position(int32_t pos) {
        step_position_host_ = pos;
        COLIBRI_CUDA(cudaMemcpyAsync(step_position_.get(), &step_position_host_, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    }

    struct step_graph {
        int steps = 0;       // steps begun
        bool give_up = false; // a step could not be recorded: run them plainly
        cudaGraphExec_t exec = nullptr;
    };
    std::unordered_map<const void*, step_graph> steps_;
    bool capturing_ = false, capture_failed_ = false;
    device_memory step_position_{sizeof(int32_t)};
    int32_t step_position_host_ = 0;
    static constexpr int position_slot = 1;

    // ---- routing on the device ----

    // A layer's experts: the shape and type of each of their matrices (the same for all),
    // and the device table of their weights.
    struct matrix_shape {
        device_kind kind;
        int64_t rows, cols, row_bytes;
    };
    struct expert_table {
        matrix_shape gate, up, down;
        device_memory ptrs; // expert_ptrs[n_expert]
    };

    // The layer's table (every expert copied to the device first), or null when its experts
    // differ in shape or type, or have rows the warp-per-row kernel does not take.
    const expert_table* table_for(const moe_step& st) {
        if (auto it = tables_.find(st.experts); it != tables_.end()) return it->second.get();
        std::vector<expert_ptrs> ptrs(size_t(st.n_expert));
        matrix_shape shapes[3]{};
        bool usable = true;
        for (int e = 0; e < st.n_expert && usable; ++e) {
            const tensor_view* m[3] = {st.experts[e].gate, st.experts[e].up, st.experts[e].down};
            for (int w = 0; w < 3; ++w) {
                const device_weights& d = weights(*m[w]);
                const matrix_shape s{d.kind, d.rows, d.cols, d.row_bytes};
                if (e == 0) shapes[w] = s;
                usable = usable && s.kind == shapes[w].kind && s.rows == shapes[w].rows && s.cols == shapes[w].cols && s.cols % 32 == 0;
                ptrs[size_t(e)].values[w] = d.v();
                ptrs[size_t(e)].scales[w] = d.s();
            }
        }
        std::unique_ptr<expert_table> t;
        if (usable) {
            t = std::make_unique<expert_table>(expert_table{shapes[0], shapes[1], shapes[2], device_memory(ptrs.size() * sizeof(expert_ptrs))});
            COLIBRI_CUDA(cudaMemcpyAsync(t->ptrs.get(), ptrs.data(), ptrs.size() * sizeof(expert_ptrs), cudaMemcpyHostToDevice, stream_));
            COLIBRI_CUDA(cudaStreamSynchronize(stream_));
        }
        return (tables_[st.experts] = std::move(t)).get();
    }

    void launch_by_id(const matrix_shape& m, const expert_ptrs* table, int which, const int32_t* ids, int k, const float* x,
                      int64_t x_stride, float* y) {
        const dim3 grid(unsigned((m.rows + mm_rows - 1) / mm_rows), unsigned(k));
        with_kind(m.kind, [&](auto kind) {
            const auto kernel = matmul_id_kernel<kind.value>;
            COLIBRI_LAUNCH(kernel, grid, 32 * mm_rows, 0, stream_)(table, which, ids, m.rows, m.cols, m.row_bytes, x, x_stride, y);
        });
        COLIBRI_LAUNCHED("matmul_id");
    }

    // Scratch of moe_one, each grown as needed.
    struct scratch {
        device_memory mem;
        float* f() const { return static_cast<float*>(mem.get()); }
        void reserve_floats(cuda_backend& be, size_t n) { be.grow(mem, std::max<size_t>(n, 1) * sizeof(float)); }
    };
    struct moe_scratch {
        scratch logits, probs, weights, ids, g, u, y, sg, su, sy, sgate;
    } moe_;
    std::unordered_map<const expert_weights*, std::unique_ptr<expert_table>> tables_; // null: the session routes

    // m holds at least `bytes`, once the operations queued with its old memory are done.
    void grow(device_memory& m, size_t bytes) {
        if (bytes <= m.bytes()) return;
        if (capturing_) { // not while recording: the recorded step is dropped
            capture_failed_ = true;
            return;
        }
        COLIBRI_CUDA(cudaStreamSynchronize(stream_));
        m.reserve(bytes);
    }

    // n host values into scratch slot `slot`, copied in stream order (a slot is not reused
    // before the operations queued with it have read it).
    template <class T>
    const T* upload(const T* host, size_t n, int slot) {
        if (capturing_) {
            // a recorded step reads its one position from step_position_, set before each
            // replay; any other host array would be baked in: the step is not recorded
            if (slot == position_slot && n == 1) return reinterpret_cast<const T*>(step_position_.get());
            capture_failed_ = true;
            return reinterpret_cast<const T*>(step_position_.get());
        }
        device_memory& m = scratch_[size_t(slot)];
        grow(m, std::max<size_t>(n, 1) * sizeof(T));
        COLIBRI_CUDA(cudaMemcpyAsync(m.get(), host, n * sizeof(T), cudaMemcpyHostToDevice, stream_));
        return static_cast<const T*>(m.get());
    }

    // w on the device: copied there the first time, or, for a routed expert under a budget,
    // in its layer's expert cache.
    const device_weights& weights(const tensor_view& w) {
        if (!expert_of_.empty()) {
            if (auto e = expert_of_.find(w.data); e != expert_of_.end()) return cached_expert(e->second);
        }
        auto it = weights_.find(w.data);
        if (it != weights_.end()) return it->second;
        if (capturing_) { // no copies while recording (the first, plain step made them)
            capture_failed_ = true;
            static const device_weights none{};
            return none;
        }
        const packed_weights p = pack_for_device(w);
        device_weights d{p.kind, p.rows, p.cols, p.row_value_bytes(), device_memory(p.values.size()),
                         device_memory(p.scales.size() * sizeof(float))};
        COLIBRI_CUDA(cudaMemcpyAsync(d.values.get(), p.values.data(), p.values.size(), cudaMemcpyHostToDevice, stream_));
        if (!p.scales.empty()) {
            COLIBRI_CUDA(cudaMemcpyAsync(d.scales.get(), p.scales.data(), p.scales.size() * sizeof(float),
                                         cudaMemcpyHostToDevice, stream_));
        }
        COLIBRI_CUDA(cudaStreamSynchronize(stream_)); // before p's host memory goes
        return weights_.emplace(w.data, std::move(d)).first->second;
    }

    template <device_kind K>
    void launch_product(const device_weights& d, const float* x, const int32_t* x_rows, int n, float* y) {
        const unsigned row_blocks = unsigned((d.rows + mm_rows - 1) / mm_rows);
        const bool aligned = d.cols % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
        if constexpr (kind_scales<K> > 0) {
            COLIBRI_ASSERT(aligned); // quantised rows are whole blocks; activations are buffers' rows
        } else if (!aligned) {
            const auto kernel = matmul_any_kernel<K>;
            COLIBRI_LAUNCH(kernel, dim3(row_blocks, unsigned(n)), 32 * mm_rows, 0, stream_)(d.v(), d.rows, d.cols, d.row_bytes, x,
                                                                                          x_rows, n, y);
            COLIBRI_LAUNCHED("matmul_any");
            return;
        }
        const auto kernel = n == 1 ? matmul_kernel<K, 1> : matmul_kernel<K, mm_tokens>;
        const unsigned token_blocks = n == 1 ? 1u : unsigned((n + mm_tokens - 1) / mm_tokens);
        COLIBRI_LAUNCH(kernel, dim3(row_blocks, token_blocks), 32 * mm_rows, 0, stream_)(d.v(), d.s(), d.rows, d.cols,
                                                                                        d.row_bytes, x, x_rows, n, y);
        COLIBRI_LAUNCHED("matmul");
    }

    // y[n, rows] = x[n, cols] . w^T, token t's activations at row x_rows[t] of x (device
    // memory) when set.
    void product(const tensor_view& w, const float* x, const int32_t* x_rows, int n, float* y) {
        if (n <= 0) return;
        const device_weights& d = weights(w);
        static const char* const names[2][device_kind_count] = {
            {"product f32 1 token", "product f16 1 token", "product bf16 1 token", "product q8 1 token", "product q4 1 token",
             "product q4m 1 token", "product iq4 1 token", "product q8m 1 token"},
            {"product f32 batch", "product f16 batch", "product bf16 batch", "product q8 batch", "product q4 batch",
             "product q4m batch", "product iq4 batch", "product q8m batch"}};
        const op_timer timer(*this, names[n > 1][int(d.kind)]);
        with_kind(d.kind, [&](auto kind) { launch_product<kind.value>(d, x, x_rows, n, y); });
    }

    // ---- the expert cache (with a weight budget) ----

    struct expert_slot {
        const expert_tensors* holds = nullptr;
        uint64_t last_use = 0;
        device_weights m[3]; // gate, up, down
    };
    struct expert_ref {
        const expert_tensors* e;
        int which; // 0 gate, 1 up, 2 down
    };

    static const tensor_view* matrix(const expert_tensors& e, int which) { return which == 0 ? e.gate : which == 1 ? e.up : e.down; }

    // Everything but the routed experts stays; the rest of the budget is shared out evenly
    // as slots per MoE layer, each slot the size of one of its experts.
    void plan_expert_cache(const cuda_options& o) {
        experts_ = o.experts;
        if (experts_.empty()) return;
        std::unordered_map<const uint8_t*, int> expert_data;
        int layers = 0;
        std::vector<uint64_t> expert_bytes; // by layer
        std::vector<int> per_layer;         // experts by layer
        for (const expert_tensors& e : experts_) {
            layers = std::max(layers, e.layer + 1);
            if (expert_bytes.size() < size_t(layers)) {
                expert_bytes.resize(size_t(layers), 0);
                per_layer.resize(size_t(layers), 0);
            }
            uint64_t b = 0;
            for (int m = 0; m < 3; ++m) {
                b += packed_bytes(*matrix(e, m));
                expert_data[matrix(e, m)->data] = 1;
            }
            expert_bytes[size_t(e.layer)] = std::max(expert_bytes[size_t(e.layer)], b);
            ++per_layer[size_t(e.layer)];
        }
        uint64_t dense = 0, one_of_each = 0;
        for (const tensor_view* t : o.tensors) {
            if (!expert_data.count(t->data)) dense += packed_bytes(*t);
        }
        for (uint64_t b : expert_bytes) one_of_each += b;
        const auto mib = [](uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; };
        if (dense + one_of_each > o.weight_budget) {
            throw error(errc::out_of_memory, "device weight budget of " + mib(o.weight_budget) + ": the weights other than the routed experts take " +
                                                 mib(dense) + ", and one expert per layer " + mib(one_of_each) + " more");
        }
        const int most = *std::max_element(per_layer.begin(), per_layer.end());
        const int slots = int(std::min<uint64_t>(uint64_t(most), (o.weight_budget - dense) / one_of_each));
        stats_.slots_per_layer = slots;
        if (slots >= most) return; // every expert fits: all stay once used
        layer_cache_.resize(size_t(layers));
        for (int l = 0; l < layers; ++l) {
            if (per_layer[size_t(l)] == 0) continue;
            layer_cache_[size_t(l)].resize(size_t(slots));
        }
        for (const expert_tensors& e : experts_) {
            for (int m = 0; m < 3; ++m) expert_of_[matrix(e, m)->data] = expert_ref{&e, m};
            // each layer's slots sized for its largest matrices
            for (expert_slot& slot : layer_cache_[size_t(e.layer)]) {
                for (int m = 0; m < 3; ++m) {
                    const tensor_view& t = *matrix(e, m);
                    const uint64_t scales = packed_scale_bytes(t), values = packed_bytes(t) - scales;
                    if (slot.m[m].values.bytes() < values) slot.m[m].values = device_memory(values);
                    if (slot.m[m].scales.bytes() < scales) slot.m[m].scales = device_memory(scales);
                }
            }
        }
    }

    // Matrix `which` of an expert, its layer's least recently used slot taken for it (and
    // the expert copied in) when it is not there. The stream runs in order, so a slot is
    // overwritten only after the products queued on what it held.
    const device_weights& cached_expert(const expert_ref& r) {
        std::vector<expert_slot>& slots = layer_cache_[size_t(r.e->layer)];
        expert_slot* slot = nullptr;
        for (expert_slot& s : slots) {
            if (s.holds == r.e) slot = &s;
        }
        if (slot != nullptr) {
            if (r.which == 0) ++stats_.hits; // a feed-forward starts with its gate
        } else {
            slot = &*std::min_element(slots.begin(), slots.end(),
                                      [](const expert_slot& a, const expert_slot& b) { return a.last_use < b.last_use; });
            for (int m = 0; m < 3; ++m) {
                const packed_weights p = pack_for_device(*matrix(*r.e, m));
                device_weights& d = slot->m[m];
                d.kind = p.kind;
                d.rows = p.rows;
                d.cols = p.cols;
                d.row_bytes = p.row_value_bytes();
                COLIBRI_CUDA(cudaMemcpyAsync(d.values.get(), p.values.data(), p.values.size(), cudaMemcpyHostToDevice, stream_));
                if (!p.scales.empty()) {
                    COLIBRI_CUDA(cudaMemcpyAsync(d.scales.get(), p.scales.data(), p.scales.size() * sizeof(float),
                                                 cudaMemcpyHostToDevice, stream_));
                }
                COLIBRI_CUDA(cudaStreamSynchronize(stream_)); // before p's host memory goes
                stats_.bytes_copied += p.values.size() + p.scales.size() * sizeof(float);
            }
            slot->holds = r.e;
            ++stats_.misses;
        }
        slot->last_use = ++tick_;
        return slot->m[r.which];
    }

    int device_;
    std::string name_;
    cudaStream_t stream_ = nullptr;
    std::unordered_map<const uint8_t*, device_weights> weights_;
    device_memory scratch_[4]; // upload slots: token rows, positions, expert indices, expert weights
    device_memory scores_;     // attention: [n * n_head, n_ctx]
    std::vector<float> embed_rows_;
    std::vector<expert_tensors> experts_;
    std::unordered_map<const uint8_t*, expert_ref> expert_of_; // a cached expert's matrices
    std::vector<std::vector<expert_slot>> layer_cache_;       // by layer
    expert_cache_stats stats_;
    uint64_t tick_ = 0;
};

// Throws unless `device` names a usable CUDA device.
void require_device(int device) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) throw error(errc::unsupported, "device cuda:" + std::to_string(device) + ": " + cudaGetErrorString(e));
    if (device < 0 || device >= count) {
        throw error(errc::unsupported, "device cuda:" + std::to_string(device) + ": " +
                                           (count == 0 ? std::string("no CUDA GPU is present")
                                                       : "only " + std::to_string(count) + " CUDA device(s) present"));
    }
}

} // namespace

std::unique_ptr<backend> make_cuda_backend(const cuda_options& options) {
    require_device(options.device);
    return std::make_unique<cuda_backend>(options);
}

std::string cuda_profile_report(backend& be) {
    auto* c = dynamic_cast<cuda_backend*>(&be);
    return c != nullptr ? c->profile_report() : std::string();
}

double measure_device_read_bandwidth(int device, size_t bytes, int passes) {
    require_device(device);
    COLIBRI_CUDA(cudaSetDevice(device));
    bytes = bytes / 16 * 16;
    device_memory buf(bytes), sink(sizeof(int));
    COLIBRI_CUDA(cudaMemset(buf.get(), 0x5a, bytes));
    int sms = 0;
    COLIBRI_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaEvent_t start, stop;
    COLIBRI_CUDA(cudaEventCreate(&start));
    COLIBRI_CUDA(cudaEventCreate(&stop));
    float best_ms = 0.0f;
    for (int pass = 0; pass < std::max(passes, 1) + 1; ++pass) { // the first pass warms up
        COLIBRI_CUDA(cudaEventRecord(start));
        COLIBRI_LAUNCH(read_kernel, sms * 8, 256, 0, nullptr)(static_cast<const int4*>(buf.get()), int64_t(bytes / 16),
                                                           static_cast<int*>(sink.get()));
        COLIBRI_LAUNCHED("read");
        COLIBRI_CUDA(cudaEventRecord(stop));
        COLIBRI_CUDA(cudaEventSynchronize(stop));
        float ms = 0.0f;
        COLIBRI_CUDA(cudaEventElapsedTime(&ms, start, stop));
        if (pass > 0 && (best_ms == 0.0f || ms < best_ms)) best_ms = ms;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return double(bytes) / (double(best_ms) * 1e-3);
}

} // namespace colibri
