#pragma once
// Owners of the CUDA runtime's resources: device memory (and a weight tensor in it),
// streams, events and graph executables. Each frees its resource with it; movable, not
// copyable.

#include "cuda/common.cuh"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace colibri::cuda_detail {

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

// A weight tensor on the device, in the layout of device_weights.h.
struct device_weights {
    device_kind kind = device_kind::f32;
    int64_t rows = 0, cols = 0, row_bytes = 0;
    device_memory values, scales;
    const uint8_t* v() const { return static_cast<const uint8_t*>(values.get()); }
    const float* s() const { return static_cast<const float*>(scales.get()); }
    const float* f32() const { return static_cast<const float*>(values.get()); }
};

// A handle of the runtime, destroyed by Destroy with its owner (null: nothing owned).
template <class Handle, class Destroy>
class unique_handle {
public:
    unique_handle() = default;
    explicit unique_handle(Handle h) noexcept : h_(h) {}
    ~unique_handle() { reset(); }
    unique_handle(unique_handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    unique_handle& operator=(unique_handle&& o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    unique_handle(const unique_handle&) = delete;
    unique_handle& operator=(const unique_handle&) = delete;

    Handle get() const { return h_; }
    explicit operator bool() const { return h_ != nullptr; }
    void reset() noexcept {
        if (h_ != nullptr) Destroy{}(h_);
        h_ = nullptr;
    }

private:
    Handle h_ = nullptr;
};

struct destroy_stream {
    void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); } // after the work queued on it
};
struct destroy_event {
    void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
struct destroy_graph_exec {
    void operator()(cudaGraphExec_t g) const noexcept { cudaGraphExecDestroy(g); }
};

using cuda_stream = unique_handle<cudaStream_t, destroy_stream>;
using cuda_event = unique_handle<cudaEvent_t, destroy_event>;
using cuda_graph_exec = unique_handle<cudaGraphExec_t, destroy_graph_exec>;

/// A stream that does not synchronise with the legacy default stream.
inline cuda_stream make_stream() {
    cudaStream_t s = nullptr;
    COLIBRI_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return cuda_stream(s);
}

inline cuda_event make_event() {
    cudaEvent_t e = nullptr;
    COLIBRI_CUDA(cudaEventCreate(&e));
    return cuda_event(e);
}

} // namespace colibri::cuda_detail
