#pragma once
// Qwen2-MoE (Qwen1.5-MoE): q/k/v biases, experts plus one shared expert behind a sigmoid
// gate, norm_topk_prob read from the config; mlp_only_layers are dense.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info qwen2_moe{.arch = format::arch::qwen2_moe,
                                       .hf_arch = "Qwen2MoeForCausalLM",
                                       .gguf_arch = "qwen2moe",
                                       .moe = true,
                                       .hf_moe = per_expert_mlp("num_experts", "moe_intermediate_size"),
                                       .blocks = {.shared_experts = shared_experts_kind::gated},
                                       .norm_topk_configurable = true};

} // namespace colibri::family
