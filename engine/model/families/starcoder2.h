#pragma once
// StarCoder2: LayerNorm with biases, a GELU MLP (c_fc, c_proj), biases on every projection
// and a sliding window on every layer (4096 in every checkpoint).

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info starcoder2{.arch = format::arch::starcoder2,
                                        .hf_arch = "Starcoder2ForCausalLM",
                                        .gguf_arch = "starcoder2",
                                        .blocks = {.norm = norm_kind::layer_norm, .ffn = ffn_kind::gelu_mlp},
                                        .sliding_window = 4096};

} // namespace colibri::family
