#pragma once
// The MoE router's decision for one token: softmax over the router's outputs, the k best
// experts (ties to the lower index), optionally only from the best groups of experts, their
// weights renormalised to sum 1 when asked, then scaled.

#include <cstdint>

namespace colibri {

struct routing_rule {
    int n_expert, k;
    bool renorm = false;               ///< the k weights renormalised to sum 1
    int n_group = 1, n_group_used = 1; ///< n_group > 1: only the n_group_used groups whose best expert is best
    float scale = 1.0f;                ///< the weights multiplied by this (after renorm)
};

/// ids[k], weights[k] from logits[n_expert]; probs[n_expert] is scratch.
void route_top_k(const float* logits, const routing_rule& rule, float* probs, int32_t* ids, float* weights);

} // namespace colibri
