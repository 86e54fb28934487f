#pragma once
// Hugging Face tokenizer.json (BPE model) -> the compact payload of tokenizer kind 2.

#include "format/format.h"

#include <cstdint>
#include <string>
#include <vector>

namespace colibri {

/// A tokenizer section ready to embed.
struct tokenizer_section {
    format::tokenizer_header header{};
    std::vector<uint8_t> payload;
    uint32_t n_tokens = 0; ///< ids the tokenizer uses (vocabulary and added tokens)
};

/// Translates `tokenizer_json` (a file path) into a kind-2 section. BOS / EOS / pad ids
/// come from config.json and then tokenizer_config.json in the same folder when present;
/// "add BOS" from tokenizer_config.json's add_bos_token, else from a template
/// post-processor that starts with a special token. Throws colibri::error: (format) for
/// invalid JSON or an inconsistent vocabulary, (unsupported) naming any tokenizer.json
/// feature the engine does not implement (docs/tokenizers.md lists them).
tokenizer_section import_tokenizer_json(const std::string& tokenizer_json);

} // namespace colibri
