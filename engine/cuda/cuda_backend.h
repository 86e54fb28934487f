#pragma once
// The CUDA backend: the backend operations on one NVIDIA GPU. Its buffers are device
// memory; weights are copied to the device (in the layout of device_weights.h) the first
// time an operation uses them and stay there.

#include "ops/backend.h"

#include <memory>

namespace colibri {

struct cuda_options {
    int device = 0; ///< CUDA device index
};

/// Throws colibri::error: unsupported when this build has no CUDA or the device cannot be
/// used (the reason in the message).
std::unique_ptr<backend> make_cuda_backend(const cuda_options& options);

/// The device's memory read bandwidth in bytes/s: every thread of a full grid reads 16 bytes
/// at a time through a buffer of `bytes` in device memory, best of `passes` (colibri-bench's
/// ceiling for decode on the device). Throws colibri::error as make_cuda_backend does.
double measure_device_read_bandwidth(int device, size_t bytes, int passes);

} // namespace colibri
