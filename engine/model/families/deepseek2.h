#pragma once
// DeepSeek-V2 (-Lite, DeepSeek-Coder-V2): multi-head latent attention with a cache of the
// latent, leading dense layers, greedy or group-limited routing with a routed scale, and
// ungated shared experts.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info deepseek2{
    .arch = format::arch::deepseek2,
    .hf_arch = "DeepseekV2ForCausalLM",
    .gguf_arch = "deepseek2",
    .moe = true,
    .hf_moe = per_expert_mlp("n_routed_experts", "moe_intermediate_size"),
    .blocks = {.attention = attention_kind::latent, .shared_experts = shared_experts_kind::ungated},
    .norm_topk_configurable = true};

} // namespace colibri::family
