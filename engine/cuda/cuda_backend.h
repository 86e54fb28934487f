#pragma once
// The CUDA backend: the backend operations on one NVIDIA GPU. Its buffers are device
// memory; weights are copied to the device (in the layout of device_weights.h) the first
// time an operation uses them and stay there.

#include "ops/backend.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colibri {

/// A routed expert's matrices, which the backend keeps on the device or copies there when
/// a product needs them (cuda_options::weight_budget).
struct expert_tensors {
    int layer = 0, expert = 0;
    const tensor_view* gate = nullptr;
    const tensor_view* up = nullptr;
    const tensor_view* down = nullptr;
};

struct cuda_options {
    int device = 0; ///< CUDA device index
    /// Device memory for weights, in bytes; 0: no limit (every weight stays on the device once
    /// used). With a limit, everything but the routed experts stays on the device, and each
    /// MoE layer keeps as many of its experts as the rest of the budget holds, least
    /// recently used first out; a product on an expert that is not there copies it in first.
    size_t weight_budget = 0;
    /// The model's weights: every tensor (for the budget), and which of them are routed
    /// experts. Needed only with a weight_budget.
    std::vector<const tensor_view*> tensors;
    std::vector<expert_tensors> experts;
};

/// What the expert cache did: experts found on the device, experts copied in, their bytes.
struct expert_cache_stats {
    int slots_per_layer = 0; ///< 0: no budget, every expert stays once used
    uint64_t hits = 0, misses = 0, bytes_copied = 0;
};

/// Throws colibri::error: unsupported when this build has no CUDA or the device cannot be
/// used (the reason in the message).
std::unique_ptr<backend> make_cuda_backend(const cuda_options& options);

/// The device's memory read bandwidth in bytes/s: every thread of a full grid reads 16 bytes
/// at a time through a buffer of `bytes` in device memory, best of `passes` (colibri-bench's
/// ceiling for decode on the device). Throws colibri::error as make_cuda_backend does.
double measure_device_read_bandwidth(int device, size_t bytes, int passes);

/// With COLIBRI_CUDA_PROFILE=1 in the environment when the backend was made, the device time
/// of its operations so far, by operation (one line each, the longest first); steps then run
/// without graphs. Empty when not profiling, or for any other backend.
std::string cuda_profile_report(backend& be);

/// The expert cache's counters of a CUDA backend (all zero for any other backend).
expert_cache_stats cuda_expert_cache_stats(const backend& be);

} // namespace colibri
