#pragma once
// Gemma 3 (text): RMSNorm by (1 + w) before and after the attention and the FFN, GeGLU,
// per-head q/k norm, embeddings times sqrt(n_embd), five windowed layers to each global
// one with a RoPE base of their own, final logit soft-capping where the config has it.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info gemma3{.arch = format::arch::gemma3,
                                    .hf_arch = "Gemma3ForCausalLM",
                                    .gguf_arch = "gemma3",
                                    .blocks = {.qk = format::qk_norm::per_head,
                                               .norm = norm_kind::rms_plus_one,
                                               .sandwich_norm = true,
                                               .ffn = ffn_kind::geglu},
                                    .embed_scale_sqrt = true,
                                    .swa_pattern = 6,
                                    .rope_theta_swa = 10000.0f,
                                    .gguf_wide_query_layers = 62};

} // namespace colibri::family
