#pragma once
// Qwen3 dense: Llama's blocks with per-head q/k RMSNorm.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info qwen3{.arch = format::arch::qwen3,
                                   .hf_arch = "Qwen3ForCausalLM",
                                   .gguf_arch = "qwen3",
                                   .blocks = {.qk = format::qk_norm::per_head}};

} // namespace colibri::family
