#pragma once
// Gemma 2: Gemma 3's norms, GeGLU and embedding scale without q/k norm; windowed and
// global layers alternate; attention and final logits soft-capped.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info gemma2{
    .arch = format::arch::gemma2,
    .hf_arch = "Gemma2ForCausalLM",
    .gguf_arch = "gemma2",
    .blocks = {.norm = norm_kind::rms_plus_one, .sandwich_norm = true, .ffn = ffn_kind::geglu},
    .embed_scale_sqrt = true,
    .swa_pattern = 2,
    .gguf_wide_query_layers = 46};

} // namespace colibri::family
