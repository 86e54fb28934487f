#pragma once
// The payload of a tokenizer section of kind 2 (byte-level BPE): a compact binary form of
// a Hugging Face tokenizer.json, written by the converter and read by the engine.
// docs/model-format.md ("Byte-level BPE payload") is the normative description.

#include <cstdint>

namespace colibri::format::bpe {

inline constexpr uint32_t magic = 0x31455042; ///< "BPE1" as little-endian bytes
inline constexpr uint32_t version = 1;

/// Bits of the payload's model flags.
enum : uint32_t {
    model_byte_fallback = 1u << 0, ///< unknown characters become <0xXX> byte tokens
    model_fuse_unk = 1u << 1,      ///< consecutive unknown tokens fuse into one
    model_ignore_merges = 1u << 2, ///< a word already in the vocabulary is taken whole
    model_flags_known = (1u << 3) - 1,
};

/// Bits of an added token's flags.
enum : uint32_t {
    added_special = 1u << 0,    ///< a control token: skipped when decoding
    added_lstrip = 1u << 1,     ///< swallows the whitespace before it
    added_rstrip = 1u << 2,     ///< swallows the whitespace after it
    added_normalized = 1u << 3, ///< matched in the normalized text, not the raw text
    added_flags_known = (1u << 4) - 1,
};

/// Normalizer steps, applied in order.
enum class normalizer_op : uint32_t {
    nfc = 1,
    nfd = 2,
    nfkc = 3,
    nfkd = 4,
    prepend = 5, ///< str: prepended to a non-empty text
    replace = 6, ///< str pattern, str content: every occurrence of the literal pattern
};

/// Pre-tokenizer steps, applied in order; each splits the pieces the previous one made.
enum class pre_tokenizer_op : uint32_t {
    split = 1,      ///< str regex (Oniguruma syntax), u32 behaviour, u32 invert
    byte_level = 2, ///< u32 add_prefix_space, u32 use_regex (the GPT-2 split pattern)
    digits = 3,     ///< u32 individual_digits
};

/// What a split step does with the text its regex matches.
enum class split_behaviour : uint32_t {
    removed = 0,
    isolated = 1,
    merged_with_previous = 2,
    merged_with_next = 3,
    contiguous = 4,
};

/// Decoder steps, applied in order to the list of token strings.
enum class decoder_op : uint32_t {
    byte_level = 1,    ///< byte-level characters back to bytes, invalid UTF-8 as U+FFFD
    replace = 2,       ///< str pattern, str content: literal replacement in every token
    byte_fallback = 3, ///< <0xXX> tokens back to bytes
    fuse = 4,          ///< all tokens into one
    strip = 5,         ///< str content (one character), u32 start, u32 stop
};

} // namespace colibri::format::bpe
