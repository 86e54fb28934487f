#pragma once
// OLMoE: RMSNorm over the whole q and k projections, and experts whose top-k weights are
// not renormalised unless the config says so.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info olmoe{.arch = format::arch::olmoe,
                                   .hf_arch = "OlmoeForCausalLM",
                                   .gguf_arch = "olmoe",
                                   .moe = true,
                                   .hf_moe = per_expert_mlp("num_experts", "intermediate_size"),
                                   .blocks = {.qk = format::qk_norm::full},
                                   .norm_topk_configurable = true};

} // namespace colibri::family
