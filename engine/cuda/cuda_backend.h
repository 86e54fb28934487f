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

} // namespace colibri
