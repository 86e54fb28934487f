#pragma once
// The vocabulary embedded in a GGUF file -> a .colibri tokenizer section.

#include "convert/bpe_import.h"

namespace colibri {

class gguf_file;

/// Converts the file's `tokenizer.ggml.*` metadata: model "llama" (sentencepiece-style
/// tokens, scores and token types) becomes a kind-1 section holding a synthesized
/// sentencepiece ModelProto; model "gpt2" (byte-level BPE: tokens, merges and the
/// pre-tokenizer named by tokenizer.ggml.pre) a kind-2 section. Throws colibri::error
/// (unsupported) naming any other tokenizer model or pre-tokenizer name, (format) for
/// inconsistent metadata.
tokenizer_section import_gguf_tokenizer(const gguf_file& f);

/// The pre-tokenizer names of tokenizer.ggml.pre that import_gguf_tokenizer knows.
std::string gguf_known_pre_tokenizers();

} // namespace colibri
