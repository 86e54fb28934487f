#pragma once
// Fill-in-the-middle prompts from the tokenizer's own special tokens.

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace colibri {

/// FIM token families, each with its tokens' names:
/// starcoder `<fim_prefix>` `<fim_suffix>` `<fim_middle>`; qwen `<|fim_prefix|>` ...;
/// deepseek `<｜fim▁begin｜>` `<｜fim▁hole｜>` `<｜fim▁end｜>`; codellama `▁<PRE>` `▁<SUF>` `▁<MID>`.
enum class fim_kind { none, starcoder, qwen, deepseek, codellama };

std::string_view fim_kind_name(fim_kind k);
/// Parses a family name ("none" included); false when unknown.
bool parse_fim_kind(std::string_view name, fim_kind& out);

struct fim_template {
    fim_kind kind = fim_kind::none;
    int32_t prefix = -1, suffix = -1, middle = -1;
    std::vector<int32_t> stop; ///< end-of-middle / end-of-text tokens the family uses
};

/// The first family whose three tokens are all in the vocabulary; kind none when none is.
fim_template detect_fim(const tokenizer& tok);
/// The given family's template; throws colibri::error (invalid_argument) naming the
/// missing token when the vocabulary lacks it.
fim_template fim_for(const tokenizer& tok, fim_kind kind);

/// Prefix-suffix-middle order: [prefix] prefix [suffix] suffix [middle]. Appends to out.
void build_fim_prompt(const tokenizer& tok, const fim_template& t, std::string_view prefix,
                      std::string_view suffix, std::vector<int32_t>& out);

} // namespace colibri
