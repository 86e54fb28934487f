#pragma once
// Enough of CUDA, on the CPU, to build the CUDA backend's .cu files (engine/cuda/) as
// plain C++ and run their kernels: the tests then check the kernels and the code that
// launches them on any machine (test_cuda_*.cpp, built a second time as
// engine_cuda_emulated_tests).
//
// A launch runs its thread blocks one after another. The threads of a block are fibers
// (ucontext) on the calling thread, each running until it finishes or reaches a
// synchronisation point: __syncthreads() releases the block once every live thread has
// reached it, __shfl_xor_sync() a warp once all its live lanes have. Device memory is host
// memory; streams, events and devices are bookkeeping. Only what the backend uses is here.

#include "core/half.h"

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <utility>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

// ---- types ----

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct __half {
    uint16_t bits;
};

inline float __half2float(__half h) { return colibri::f16_to_f32(h.bits); }
inline __half __float2half_rn(float f) { return __half{colibri::f32_to_f16(f)}; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::max;
using std::min;

// ---- the launch model ----

namespace colibri::emulation {

inline dim3 grid_dim, block_dim, block_idx, thread_idx;

struct fiber {
    ucontext_t ctx; // its first start
    jmp_buf env;    // where it yielded
    bool started = false;
    enum state_t { ready, at_barrier, at_shuffle, done } state = ready;
    float shuffle_value = 0.0f, shuffle_result = 0.0f;
    int shuffle_mask = 0;
};

// Stacks outlive the blocks: a launch runs many blocks of the same threads.
inline std::vector<std::unique_ptr<char[]>>& stacks() {
    static std::vector<std::unique_ptr<char[]>> s;
    return s;
}

struct block_run {
    std::vector<fiber> fibers;
    ucontext_t scheduler;
    jmp_buf scheduler_env;
    int current = 0;
    std::function<void()> body;
    std::vector<unsigned char> dynamic_shared;
};
inline block_run* run = nullptr;

constexpr size_t fiber_stack = 64 << 10;

// Switches after a fiber's first start are _setjmp/_longjmp, which keep the signal mask
// as it is (swapcontext asks the kernel for it every time: most of the time a launch took).
inline void fiber_entry() {
    run->body();
    run->fibers[size_t(run->current)].state = fiber::done;
    _longjmp(run->scheduler_env, 1);
}

// Back to the scheduler from the current fiber.
[[gnu::noinline]] inline void yield(fiber::state_t why) {
    fiber& f = run->fibers[size_t(run->current)];
    f.state = why;
    if (_setjmp(f.env) == 0) _longjmp(run->scheduler_env, 1);
}

// A fiber that starts at fiber_entry on `stack` and returns to `back`. (The functions that
// save contexts are kept apart: what they hold in registers may be restored stale.)
[[gnu::noinline]] inline void prepare(fiber& f, char* stack, ucontext_t* back) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = fiber_stack;
    f.ctx.uc_link = back;
    makecontext(&f.ctx, fiber_entry, 0);
}

// Runs fiber i until it yields or finishes.
[[gnu::noinline]] inline void resume(block_run& b, unsigned i) {
    b.current = int(i);
    thread_idx = dim3(i);
    fiber& f = b.fibers[i];
    if (_setjmp(b.scheduler_env) != 0) return; // the fiber yielded or finished
    if (f.started) _longjmp(f.env, 1);
    f.started = true;
    swapcontext(&b.scheduler, &f.ctx);
}

// One block: its threads as fibers until every one is done.
inline void run_block(const std::function<void()>& body, unsigned threads, size_t shared_bytes) {
    block_run b;
    b.body = body;
    b.dynamic_shared.assign(std::max<size_t>(shared_bytes, 16), 0);
    b.fibers.resize(threads);
    run = &b;
    while (stacks().size() < threads) stacks().emplace_back(new char[fiber_stack]);
    for (unsigned i = 0; i < threads; ++i) prepare(b.fibers[i], stacks()[i].get(), &b.scheduler);
    for (;;) {
        bool any_ran = false, all_done = true;
        for (unsigned i = 0; i < threads; ++i) {
            if (b.fibers[i].state != fiber::ready) continue;
            any_ran = true;
            resume(b, i);
        }
        for (const fiber& f : b.fibers) all_done = all_done && f.state == fiber::done;
        if (all_done) break;
        bool released = false;
        // __syncthreads: every thread not done waits there
        bool all_at_barrier = true;
        for (const fiber& f : b.fibers)
            all_at_barrier = all_at_barrier && (f.state == fiber::done || f.state == fiber::at_barrier);
        if (all_at_barrier) {
            for (fiber& f : b.fibers) {
                if (f.state == fiber::at_barrier) f.state = fiber::ready;
            }
            released = true;
        }
        // __shfl_xor_sync: a warp whose live lanes have all arrived exchanges its values
        for (unsigned w = 0; w * 32 < threads; ++w) {
            const unsigned first = w * 32, last = std::min(threads, first + 32);
            bool arrived = true, any = false;
            for (unsigned i = first; i < last; ++i) {
                arrived = arrived && (b.fibers[i].state == fiber::done || b.fibers[i].state == fiber::at_shuffle);
                any = any || b.fibers[i].state == fiber::at_shuffle;
            }
            if (!arrived || !any) continue;
            for (unsigned i = first; i < last; ++i) {
                fiber& f = b.fibers[i];
                if (f.state != fiber::at_shuffle) continue;
                const unsigned partner = first + ((i - first) ^ unsigned(f.shuffle_mask));
                if (partner >= last || b.fibers[partner].state != fiber::at_shuffle) {
                    std::fprintf(stderr, "cuda emulation: lane %u shuffles with a lane that is not there\n", i);
                    std::abort();
                }
                f.shuffle_result = b.fibers[partner].shuffle_value;
            }
            for (unsigned i = first; i < last; ++i) {
                if (b.fibers[i].state == fiber::at_shuffle) b.fibers[i].state = fiber::ready;
            }
            released = true;
        }
        if (!any_ran && !released) {
            std::fprintf(stderr, "cuda emulation: the block's threads wait on one another for ever\n");
            std::abort();
        }
    }
    run = nullptr;
}

// Stream capture: while a stream is captured, launches are recorded (their arguments by
// value) instead of run; a graph launch runs them in order.
struct recording {
    std::vector<std::function<void()>> launches;
};
inline recording* capturing = nullptr;

// A launch CUDA refuses (an empty grid or block, more than 1024 threads, a grid's y above
// 65535): nothing runs, and cudaGetLastError reports it.
inline bool launch_refused = false;
inline bool valid_launch(dim3 grid, dim3 block) {
    return grid.x > 0 && grid.y > 0 && grid.y <= 65535 && block.x > 0 && block.x <= 1024;
}

// kernel<<<grid, block, shared>>>(args...): every block in turn.
template <class... P>
struct launcher {
    void (*kernel)(P...);
    dim3 grid, block;
    size_t shared;
    template <class... A>
    void operator()(A&&... args) const {
        if (!valid_launch(grid, block)) {
            launch_refused = true;
            return;
        }
        auto run_all = [k = kernel, g = grid, b = block, s = shared](P... a) {
            grid_dim = g;
            block_dim = b;
            const std::function<void()> body = [&] { k(a...); };
            for (unsigned y = 0; y < g.y; ++y) {
                for (unsigned x = 0; x < g.x; ++x) {
                    block_idx = dim3(x, y);
                    run_block(body, b.x, s);
                }
            }
        };
        if (capturing != nullptr) {
            capturing->launches.push_back(
                [run_all, t = std::make_tuple(static_cast<P>(args)...)] { std::apply(run_all, t); });
        } else {
            run_all(static_cast<P>(args)...);
        }
    }
};

template <class... P>
launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared) {
    return {kernel, grid, block, shared};
}

template <class T>
T* dynamic_shared() {
    return reinterpret_cast<T*>(run->dynamic_shared.data());
}

} // namespace colibri::emulation

// ---- warp matrix products (mma.h's wmma, the 16x16x16 shapes the backend uses) ----
// Each thread's fragment holds the whole tile (a real one is spread over the warp's lanes
// in an undocumented way, which the kernels never look into).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
    static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
    float x[rows][cols];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
    for (auto& row : f.x) std::fill(std::begin(row), std::end(row), v);
}

// element (i, j) of an A or B tile from p: row-major at p[i * ldm + j], column-major at
// p[i + j * ldm]
template <class Use, int M, int N, int K, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, __half, Layout>& f, const __half* p, unsigned ldm) {
    using frag = fragment<Use, M, N, K, __half, Layout>;
    for (int i = 0; i < frag::rows; ++i) {
        for (int j = 0; j < frag::cols; ++j) {
            f.x[i][j] = __half2float(std::is_same_v<Layout, row_major> ? p[i * ldm + j] : p[i + j * ldm]);
        }
    }
}

// The warp's lanes ask for the same product one after another: the last one is kept.
template <int M, int N, int K, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, __half, LA>& a,
              const fragment<matrix_b, M, N, K, __half, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    struct last_product {
        fragment<matrix_a, M, N, K, __half, LA> a;
        fragment<matrix_b, M, N, K, __half, LB> b;
        fragment<accumulator, M, N, K, float> c, d;
        bool valid = false;
    };
    static thread_local last_product last;
    if (last.valid && std::memcmp(&last.a, &a, sizeof a) == 0 && std::memcmp(&last.b, &b, sizeof b) == 0 &&
        std::memcmp(&last.c, &c, sizeof c) == 0) {
        d = last.d;
        return;
    }
    last.a = a;
    last.b = b;
    last.c = c;
    fragment<accumulator, M, N, K, float> r;
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            float acc = c.x[i][j];
            for (int k = 0; k < K; ++k) acc += a.x[i][k] * b.x[k][j];
            r.x[i][j] = acc;
        }
    }
    last.d = r;
    last.valid = true;
    d = r;
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) (layout == mem_row_major ? p[i * ldm + j] : p[i + j * ldm]) = f.x[i][j];
    }
}
} // namespace nvcuda::wmma

#define threadIdx (::colibri::emulation::thread_idx)
#define blockIdx (::colibri::emulation::block_idx)
#define blockDim (::colibri::emulation::block_dim)
#define gridDim (::colibri::emulation::grid_dim)

inline void __syncthreads() { colibri::emulation::yield(colibri::emulation::fiber::at_barrier); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    using namespace colibri::emulation;
    fiber& f = run->fibers[size_t(run->current)];
    f.shuffle_value = v;
    f.shuffle_mask = lane_mask;
    yield(fiber::at_shuffle);
    return run->fibers[size_t(run->current)].shuffle_result;
}

// ---- the runtime API ----

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorMemoryAllocation = 2,
    cudaErrorStreamCaptureUnsupported = 900
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal,
    cudaStreamCaptureModeThreadLocal,
    cudaStreamCaptureModeRelaxed
};
using cudaGraph_t = colibri::emulation::recording*;
using cudaGraphExec_t = colibri::emulation::recording*;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
using cudaStream_t = struct emulated_stream*;
using cudaEvent_t = struct emulated_event*;
constexpr unsigned cudaStreamNonBlocking = 1;
struct cudaDeviceProp {
    char name[256];
};

inline const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess                         ? "no error"
           : e == cudaErrorStreamCaptureUnsupported ? "operation not permitted when stream is capturing"
           : e == cudaErrorInvalidConfiguration     ? "invalid configuration argument"
                                                    : "emulated error";
}
// What CUDA refuses while a stream is captured (copies from pageable memory, waits).
inline cudaError_t not_while_capturing() {
    return colibri::emulation::capturing != nullptr ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
    return std::exchange(colibri::emulation::launch_refused, false) ? cudaErrorInvalidConfiguration : cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    std::snprintf(p->name, sizeof p->name, "CUDA emulated on the CPU");
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
    *v = 2;
    return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (not_while_capturing() != cudaSuccess) return not_while_capturing();
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
    std::free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    std::memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) { return cudaMemset(p, v, n); }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
    if (not_while_capturing() != cudaSuccess) return not_while_capturing();
    std::memcpy(d, s, n);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    *s = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return not_while_capturing(); }
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (colibri::emulation::capturing != nullptr) return cudaErrorInvalidValue;
    colibri::emulation::capturing = new colibri::emulation::recording;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
    *g = colibri::emulation::capturing;
    colibri::emulation::capturing = nullptr;
    return *g != nullptr ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
    *e = new colibri::emulation::recording(*g);
    return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    if (not_while_capturing() != cudaSuccess) return not_while_capturing();
    for (const auto& launch : e->launches) launch();
    return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
    *e = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
    *ms = 1.0f;
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
