#pragma once
// UTF-8 helpers and Unicode normalisation (ICU) for the BPE tokenizer.

#include <cstdint>
#include <string>
#include <string_view>

namespace colibri::unicode {

/// True when s is well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
bool is_valid_utf8(std::string_view s);

/// Appends s to out with every ill-formed subsequence replaced by one U+FFFD, following
/// the Unicode "maximal subpart" practice (what Python's decode(errors="replace") and
/// Rust's String::from_utf8_lossy do), so lossy text matches the reference libraries.
void append_utf8_lossy(std::string& out, std::string_view s);

/// Appends the UTF-8 form of code point cp (which must be a Unicode scalar value).
void append_utf8(std::string& out, uint32_t cp);

/// Decodes the code point at s[i] of well-formed UTF-8 and advances i past it.
uint32_t next_code_point(std::string_view s, size_t& i);

/// Byte length of the character whose lead byte is c, in well-formed UTF-8.
inline size_t char_length(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool is_white_space(uint32_t cp);

/// The four Unicode normalisation forms.
enum class normal_form { nfc, nfd, nfkc, nfkd };

/// Normalises well-formed UTF-8 with ICU. ASCII text is returned unchanged without a
/// call into ICU (it is invariant under all four forms).
class normalizer {
public:
    explicit normalizer(normal_form form);
    /// out = normalise(in). Throws colibri::error (internal) if ICU fails.
    void normalize(std::string_view in, std::string& out) const;

private:
    const void* icu_; // const icu::Normalizer2*, owned by ICU
};

} // namespace colibri::unicode
