#pragma once
// Llama 1-3 and their fine-tunes (CodeLlama, Mistral 7B): the plain decoder every other
// family varies. RoPE scaling (linear, llama3, YaRN) and q/k/v biases are the checkpoint's.

#include "model/family_info.h"

namespace colibri::family {

inline constexpr family_info llama{
    .arch = format::arch::llama, .hf_arch = "LlamaForCausalLM", .gguf_arch = "llama", .gguf_permuted_qk = true};

} // namespace colibri::family
