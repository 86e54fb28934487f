#pragma once
// Granite-MoE: Mixtral's blocks with fused expert matrices and Granite's four multipliers
// (embedding, residual, attention, logits).

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info granite_moe{
    .arch = format::arch::granite_moe,
    .hf_arch = "GraniteMoeForCausalLM",
    .gguf_arch = "granitemoe",
    .moe = true,
    .hf_moe = {"block_sparse_moe", "router.layer.weight", "", "", "", "num_local_experts", "intermediate_size"},
    .norm_topk_default = true,
    .granite_scales = true,
    .gguf_permuted_qk = true};

} // namespace colibri::family
