#pragma once
// Text <-> token ids. The model file's tokenizer section is all a tokenizer needs.

#include "format/model_file.h"
#include "tokenizer/number_tokens.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {

/// What becomes of text that spells a special token (`<|endoftext|>`, `<fim_prefix>`).
enum class special_tokens {
    as_text, ///< encoded as the characters it is: user text never becomes a control token
    parsed,  ///< becomes the token (an explicit opt-in, as the reference library's default)
};

class tokenizer {
public:
    virtual ~tokenizer() = default;

    /// Appends the ids of `text` (no BOS/EOS) to `out`. Only special tokens (control tokens)
    /// depend on `specials`; added tokens that are not special are always matched.
    virtual void encode(std::string_view text, std::vector<int32_t>& out,
                        special_tokens specials = special_tokens::as_text) const = 0;
    /// Text of a sequence of ids, as the reference library decodes it.
    virtual std::string decode(std::span<const int32_t> ids) const = 0;
    /// Appends the raw bytes one id stands for inside a text (sentencepiece: U+2581 as a
    /// space, byte pieces as their byte; control tokens nothing). May be partial UTF-8.
    virtual void append_bytes(int32_t id, std::string& out) const = 0;
    /// The piece of one id as stored in the vocabulary (for diagnostics).
    virtual std::string piece(int32_t id) const = 0;
    /// True for control tokens (BOS, EOS, ...) that decode to nothing.
    virtual bool is_control(int32_t id) const = 0;
    /// Id of a piece, or -1.
    virtual int32_t piece_to_id(std::string_view piece) const = 0;
    virtual int32_t n_vocab() const = 0;

    int32_t bos_id() const { return bos_; }
    int32_t eos_id() const { return eos_; }
    bool add_bos() const { return add_bos_; }
    /// True when the model was trained with suffix-first fill-in-the-middle prompts
    /// (format::tok_fim_spm): its FIM prompts use that order unless a request says otherwise.
    bool fim_suffix_first() const { return fim_suffix_first_; }
    /// True when decode drops one leading space of a text (sentencepiece, and BPE
    /// tokenizers whose decoder strips it); text_stream does the same at the start.
    bool strips_leading_space() const { return strips_leading_space_; }
    /// How decode replaces ill-formed UTF-8: true, one U+FFFD per maximal ill-formed
    /// subsequence (Hugging Face byte-level decoders); false, one per bad byte
    /// (sentencepiece). text_stream does the same.
    bool replaces_maximal_subparts() const { return replaces_maximal_subparts_; }
    /// The tokens that spell numbers (looked up on first use).
    const number_tokens& numbers() const {
        std::call_once(numbers_once_,
                       [this] { numbers_ = number_tokens([this](std::string_view p) { return piece_to_id(p); }); });
        return numbers_;
    }

protected:
    int32_t bos_ = -1, eos_ = -1;
    bool add_bos_ = false;
    bool fim_suffix_first_ = false;
    bool strips_leading_space_ = true;
    bool replaces_maximal_subparts_ = false;

private:
    mutable std::once_flag numbers_once_;
    mutable number_tokens numbers_;
};

/// Builds the tokenizer stored in a model file. Throws colibri::error (format) when the
/// section cannot be read, (unsupported) for a kind this build does not handle.
std::unique_ptr<tokenizer> make_tokenizer(const model_file& file);
/// The same from a tokenizer header and its payload (a section not yet in a file); ids
/// must be below n_vocab; `where` names the source in messages.
std::unique_ptr<tokenizer> make_tokenizer(const format::tokenizer_header& th, std::span<const uint8_t> payload,
                                          uint32_t n_vocab, const std::string& where);

/// Streams decoded text: feed ids one at a time, get back valid UTF-8 that never splits a
/// character. For a continuation (at_start false) the text keeps its leading space; at the
/// start of a text, the one leading space sentencepiece adds is dropped (when the
/// tokenizer strips_leading_space), so that the pieces concatenate to decode(ids).
class text_stream {
public:
    text_stream(const tokenizer& tok, bool at_start) : tok_(tok), at_start_(at_start) {}
    /// Adds one id; returns the new complete text (possibly empty).
    std::string push(int32_t id);
    /// Whatever is held back (an incomplete sequence, as U+FFFD); empties the stream.
    std::string flush();

private:
    void append_text(std::string& out, std::string_view bytes) const;

    const tokenizer& tok_;
    bool at_start_;
    std::string pending_; // bytes not yet returned
};

/// Length of the longest prefix of s that does not end inside an incomplete UTF-8 sequence.
size_t utf8_complete_prefix(std::string_view s);

/// Appends s to out, replacing each invalid UTF-8 sequence by U+FFFD.
void append_valid_utf8(std::string& out, std::string_view s);

} // namespace colibri
