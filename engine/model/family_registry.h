#pragma once
// The one list of model families, each described in its own file under families/. The
// converters, the loader's messages and the tests iterate it; the runtime itself reads
// only the flat hyperparameters the converters derive from it.

#include "model/family_info.h"

#include <span>
#include <string>
#include <string_view>

namespace colibri {

/// Every family, in the order of format::arch.
std::span<const family_info> families();
/// The family of a Hugging Face architecture; nullptr when none.
const family_info* find_hf_family(std::string_view hf_arch);
/// The family of a GGUF architecture with or without experts (the dense or the MoE family
/// of that name, else whichever there is); nullptr when none.
const family_info* find_gguf_family(std::string_view gguf_arch, bool has_experts);
/// "A, B, C": the Hugging Face or GGUF names, for messages.
std::string known_hf_architectures();
std::string known_gguf_architectures();

} // namespace colibri
