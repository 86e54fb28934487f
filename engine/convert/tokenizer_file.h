#pragma once
// A tokenizer read from whichever file holds one: a .colibri model, a GGUF file or a
// Hugging Face tokenizer.json.

#include "tokenizer/tokenizer.h"

#include <memory>
#include <string>

namespace colibri {

/// The tokenizer of the file at `path` (a GGUF file by its magic, a tokenizer.json by its
/// name, else a .colibri file). Throws colibri::error as the file's own reader does.
std::unique_ptr<tokenizer> load_tokenizer_file(const std::string& path);

} // namespace colibri
