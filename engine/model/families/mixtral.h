#pragma once
// Mixtral: Llama's attention with a softmax-routed block of experts, the top-k weights
// renormalised.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info mixtral{.arch = format::arch::mixtral,
                                     .hf_arch = "MixtralForCausalLM",
                                     .gguf_arch = "llama",
                                     .moe = true,
                                     .hf_moe = {"block_sparse_moe", "gate.weight", "experts.{e}.w1.weight",
                                                "experts.{e}.w3.weight", "experts.{e}.w2.weight", "num_local_experts",
                                                "intermediate_size"},
                                     .norm_topk_default = true,
                                     .gguf_permuted_qk = true,
                                     .hf_window_key = true};

} // namespace colibri::family
