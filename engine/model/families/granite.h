#pragma once
// Granite dense (Granite 3 code and instruct models): Llama's blocks with Granite's four
// multipliers (embedding, residual, attention, logits).

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info granite{.arch = format::arch::granite,
                                     .hf_arch = "GraniteForCausalLM",
                                     .gguf_arch = "granite",
                                     .granite_scales = true,
                                     .gguf_permuted_qk = true};

} // namespace colibri::family
