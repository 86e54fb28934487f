#pragma once
// The byte-level BPE tokenizer (tokenizer kind 2), built from its binary payload.

#include "format/format.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace colibri {

/// Builds a BPE tokenizer from a kind-2 payload (docs/model-format.md). Every id must be
/// below `n_vocab` (the model's vocabulary). Throws colibri::error (format) naming `where`
/// and the field for a malformed payload, (unsupported) for a feature this build lacks.
std::unique_ptr<tokenizer> make_bpe_tokenizer(std::span<const uint8_t> payload, const format::tokenizer_header& th,
                                              uint32_t n_vocab, const std::string& where);

} // namespace colibri
