#pragma once
// The MoE router's decision for one token: softmax over the router's outputs, the k best
// experts (ties to the lower index), their weights renormalised to sum 1 when asked.

#include <cstdint>

namespace colibri {

/// ids[k], weights[k] from logits[n_expert]; probs[n_expert] is scratch.
void route_top_k(const float* logits, int n_expert, int k, bool renorm, float* probs, int32_t* ids, float* weights);

} // namespace colibri
