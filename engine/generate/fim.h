#pragma once
// Fill-in-the-middle prompts from the tokenizer's own special tokens.

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace colibri {

/// FIM token families, each with its tokens' names:
/// starcoder `<fim_prefix>` `<fim_suffix>` `<fim_middle>`; qwen `<|fim_prefix|>` ...;
/// deepseek `<｜fim▁begin｜>` `<｜fim▁hole｜>` `<｜fim▁end｜>`; codellama `▁<PRE>` `▁<SUF>` `▁<MID>`;
/// codestral `[PREFIX]` `[SUFFIX]` (no middle token: [SUFFIX] suffix [PREFIX] prefix).
enum class fim_kind { none, starcoder, qwen, deepseek, codellama, codestral };

std::string_view fim_kind_name(fim_kind k);
/// Parses a family name ("none" included); false when unknown.
bool parse_fim_kind(std::string_view name, fim_kind& out);

struct fim_template {
    fim_kind kind = fim_kind::none;
    int32_t prefix = -1, suffix = -1, middle = -1; ///< middle -1: the family has none (codestral)
    std::vector<int32_t> stop;                     ///< end-of-middle / end-of-text tokens the family uses
    int32_t repo_name = -1, file_sep = -1;         ///< repository-level tokens (starcoder, qwen); -1: none
};

/// Another file given as context for a completion (an open buffer, a yanked snippet).
struct context_file {
    std::string_view name;
    std::string_view text;
};

/// The first family whose three tokens are all in the vocabulary; kind none when none is.
fim_template detect_fim(const tokenizer& tok);
/// The given family's template; throws colibri::error (invalid_argument) naming the
/// missing token when the vocabulary lacks it.
fim_template fim_for(const tokenizer& tok, fim_kind kind);

/// Where the suffix goes. psm: [prefix] prefix [suffix] suffix [middle] — every family's
/// trained order. spm (suffix first): [prefix] [suffix] suffix [middle] prefix — the
/// variant StarCoder and CodeLlama were also trained with; text typed at the cursor then
/// changes only the end of the prompt, so a cached prompt stays valid up to the cursor.
enum class fim_order { psm, spm };

/// Parses "psm" / "spm"; false when it is neither.
bool parse_fim_order(std::string_view name, fim_order& out);

/// Appends the FIM prompt for prefix and suffix to out, in the given order (Codestral's has
/// one order of its own: [SUFFIX] suffix [PREFIX] prefix). Only the framing tokens are
/// control tokens: prefix and suffix are encoded as `specials` says. The prompt takes at most
/// `room` tokens where it can (see fit_fim_parts); none is cut for room < 0.
void build_fim_prompt(const tokenizer& tok, const fim_template& t, std::string_view prefix, std::string_view suffix,
                      fim_order order, std::vector<int32_t>& out, special_tokens specials = special_tokens::as_text,
                      std::int64_t room = -1);

/// A prefix and suffix of more than `room` tokens cut to fit it, nearest the cursor kept, as
/// llama-server's /infill keeps them: the suffix at most a quarter of the room (less where
/// the prefix leaves more), the prefix the end that fits the rest, cut in steps of
/// fim_prefix_step tokens so that typing at the cursor keeps the same first tokens, and with
/// them the cached prompt, for a while. Nothing is cut for room <= 0.
void fit_fim_parts(std::vector<int32_t>& prefix, std::vector<int32_t>& suffix, std::int64_t room);
constexpr std::int64_t fim_prefix_step = 64;

/// The spellings of a family's tokens (null-terminated; "" where it has none).
struct fim_spellings {
    std::string_view prefix, suffix, middle, repo_name, file_sep;
};
/// false for fim_kind::none.
bool fim_spellings_of(fim_kind kind, fim_spellings& out);

/// Appends other files' text to out, for placing before a prompt. With the template's
/// repository tokens it is the layout the model was trained on ([repo_name]myproject\n,
/// then [file_sep]name\n text per file, then [file_sep]filename\n for the file being
/// edited); without them each text follows a "--- snippet ---" line. Both as llama-server
/// builds its infill prompts.
void build_context_prompt(const tokenizer& tok, const fim_template& t, std::span<const context_file> files,
                          std::vector<int32_t>& out, special_tokens specials = special_tokens::as_text);

} // namespace colibri
