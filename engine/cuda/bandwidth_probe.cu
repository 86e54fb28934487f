// The bandwidth probe (bandwidth_probe.h): a grid-stride read of a device buffer, timed
// with events.

#include "cuda/bandwidth_probe.h"

#include "cuda/cuda_resources.cuh"

#include <algorithm>

namespace colibri {
namespace {

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

} // namespace

double measure_device_read_bandwidth(int device, size_t bytes, int passes) {
    using namespace cuda_detail;
    require_device(device);
    COLIBRI_CUDA(cudaSetDevice(device));
    bytes = bytes / 16 * 16;
    device_memory buf(bytes), sink(sizeof(int));
    COLIBRI_CUDA(cudaMemset(buf.get(), 0x5a, bytes));
    int sms = 0;
    COLIBRI_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const cuda_event start = make_event(), stop = make_event();
    float best_ms = 0.0f;
    for (int pass = 0; pass < std::max(passes, 1) + 1; ++pass) { // the first pass warms up
        COLIBRI_CUDA(cudaEventRecord(start.get()));
        COLIBRI_LAUNCH(read_kernel, sms * 8, 256, 0, nullptr)
        (static_cast<const int4*>(buf.get()), int64_t(bytes / 16), static_cast<int*>(sink.get()));
        COLIBRI_LAUNCHED("read");
        COLIBRI_CUDA(cudaEventRecord(stop.get()));
        COLIBRI_CUDA(cudaEventSynchronize(stop.get()));
        float ms = 0.0f;
        COLIBRI_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
        if (pass > 0 && (best_ms == 0.0f || ms < best_ms)) best_ms = ms;
    }
    return double(bytes) / (double(best_ms) * 1e-3);
}

} // namespace colibri
