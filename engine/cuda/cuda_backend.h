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
/// a product needs them (cuda_options::weight_budget; backend::expert_cache_usage counts
/// what it did).
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

/// Throws colibri::error: unsupported when this build has no CUDA or the device cannot be
/// used (the reason in the message).
std::unique_ptr<backend> make_cuda_backend(const cuda_options& options);

/// How many one-token steps ran from recordings (CUDA graphs), and what kept any from being
/// recorded; with COLIBRI_CUDA_PROFILE=1 in the environment when the backend was made, also
/// the device time of its operations so far, by operation (one line each, the longest
/// first), steps then running without graphs. Empty for any other backend.
std::string cuda_profile_report(backend& be);

} // namespace colibri
