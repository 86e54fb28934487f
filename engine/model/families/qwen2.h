#pragma once
// Qwen2 dense (Qwen2.5, Qwen2.5-Coder): Llama's blocks; the q/k/v biases and, on small
// sizes, the tied embeddings come from the checkpoint.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info qwen2{.arch = format::arch::qwen2, .hf_arch = "Qwen2ForCausalLM", .gguf_arch = "qwen2"};

} // namespace colibri::family
