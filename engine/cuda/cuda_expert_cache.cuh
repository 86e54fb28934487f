#pragma once
// The expert cache of a CUDA backend under a weight budget: each MoE layer's slots of
// device memory, the routed experts copied into them when a token needs them, least
// recently used first out.

#include "cuda/cuda_backend.h"
#include "cuda/cuda_resources.cuh"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace colibri::cuda_detail {

class expert_cache {
public:
    /// Everything but the routed experts stays on the device; the rest of the budget is
    /// shared out evenly as slots per MoE layer. Throws out_of_memory when the budget does
    /// not hold the other weights and one expert per layer.
    void plan(const cuda_options& o);
    /// Whether routed experts go through the slots (some do not fit).
    bool active() const { return !expert_of_.empty(); }
    /// `w` on the device when it is a cached expert's matrix (its expert copied in on
    /// `stream` first when not in its layer's slots); null for any other tensor.
    const device_weights* find(const tensor_view& w, cudaStream_t stream);
    const expert_cache_stats& stats() const { return stats_; }

private:
    struct expert_slot {
        const expert_tensors* holds = nullptr;
        uint64_t last_use = 0;
        device_weights m[3]; // gate, up, down
    };
    struct expert_ref {
        const expert_tensors* e;
        int which; // 0 gate, 1 up, 2 down
    };

    static const tensor_view* matrix(const expert_tensors& e, int which) {
        return which == 0 ? e.gate : which == 1 ? e.up : e.down;
    }
    const device_weights& cached_expert(const expert_ref& r, cudaStream_t stream);

    std::vector<expert_tensors> experts_;
    std::unordered_map<const uint8_t*, expert_ref> expert_of_; // a cached expert's matrices
    std::vector<std::vector<expert_slot>> layer_cache_;        // by layer
    expert_cache_stats stats_;
    uint64_t tick_ = 0;
};

} // namespace colibri::cuda_detail
