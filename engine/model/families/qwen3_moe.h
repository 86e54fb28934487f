#pragma once
// Qwen3-MoE (Qwen3-Coder-30B-A3B): per-head q/k RMSNorm, experts with their top-k weights
// renormalised unless the config says otherwise.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info qwen3_moe{.arch = format::arch::qwen3_moe,
                                       .hf_arch = "Qwen3MoeForCausalLM",
                                       .gguf_arch = "qwen3moe",
                                       .moe = true,
                                       .hf_moe = per_expert_mlp("num_experts", "moe_intermediate_size"),
                                       .blocks = {.qk = format::qk_norm::per_head},
                                       .norm_topk_default = true,
                                       .norm_topk_configurable = true};

} // namespace colibri::family
