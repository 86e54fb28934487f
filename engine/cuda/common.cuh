#pragma once
// What the CUDA backend's .cu files share: the CUDA headers (or the tests' CPU emulation of
// them), error checks, launch helpers, the weight kinds as template constants, and the
// warp and block reductions.

#include "core/error.h"
#include "cuda/device_weights.h"

#if defined(COLIBRI_CUDA_EMULATED) // the tests' CPU emulation (tests/engine/cuda_emulation.h)
#include "cuda_emulation.h"
#define COLIBRI_LAUNCH(kernel, grid, block, shared, stream) ::colibri::emulation::launch(kernel, grid, block, shared)
#define COLIBRI_DYNAMIC_SHARED(T, name) T* name = ::colibri::emulation::dynamic_shared<T>()
#define COLIBRI_UNROLL
#define COLIBRI_UNROLL_BY(n)
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
// kernel<<<...>>>, spelt so that the tests' emulation can run the same launch
#define COLIBRI_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define COLIBRI_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#define COLIBRI_UNROLL _Pragma("unroll")
#define COLIBRI_PRAGMA(text) _Pragma(#text)
#define COLIBRI_UNROLL_BY(n) COLIBRI_PRAGMA(unroll n)
#endif

#include <cstdint>
#include <string>
#include <type_traits>

namespace colibri::cuda_detail {

// A failed allocation is out_of_memory; any other CUDA error leaves the device's state in
// doubt (most are sticky: every later call fails too), so it is a device error.
inline void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    throw error(e == cudaErrorMemoryAllocation ? errc::out_of_memory : errc::device,
                std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define COLIBRI_CUDA(call) ::colibri::cuda_detail::check((call), #call)
// after every kernel launch: a bad configuration is reported here, not by a later call
#define COLIBRI_LAUNCHED(kernel) ::colibri::cuda_detail::check(cudaGetLastError(), kernel)

/// Throws unless `device` names a usable CUDA device.
void require_device(int device);

inline int blocks_for(int64_t n, int threads) { return int((n + threads - 1) / threads); }

// scale_floats(K) as a constant device code may read (the function is host code).
template <device_kind K>
constexpr int kind_scales = scale_floats(K);

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

} // namespace colibri::cuda_detail
