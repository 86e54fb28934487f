#pragma once
// Added (special) tokens: found whole in a text before anything else and never split,
// leftmost match first and the longest one there, as the reference library matches them.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {

/// True for an added token that is a control token in all but its flag: tokenizer.json files
/// mark some FIM and chat tokens (`<|fim_prefix|>`, `<｜fim▁begin｜>`) as not special. The
/// spellings llama.cpp's converter reads as control: `<|…|>`, `<｜…｜>`, `<pad>`, `<mask>`,
/// `<unused…>`; and FIM tokens spelled `<fim_…>` or `<fim-…>`.
bool looks_special(std::string_view content);

class added_token_matcher {
public:
    /// What a match yields.
    struct token {
        int32_t id;
        bool lstrip; ///< the match swallows the whitespace before it
        bool rstrip; ///< and the whitespace after it
    };

    /// Adds a token to look for (an empty content is ignored).
    void add(std::string_view content, token t);
    /// True when no token was added.
    bool empty() const { return tokens_.empty(); }

    /// Splits `text`: calls on_text(std::string_view) for each non-empty stretch between
    /// matches and on_token(int32_t id) for each match, in order.
    template <class on_text_fn, class on_token_fn>
    void split(std::string_view text, on_text_fn&& on_text, on_token_fn&& on_token) const {
        if (tokens_.empty()) {
            if (!text.empty()) on_text(text);
            return;
        }
        size_t seg = 0; // start of the text not yet handed out
        for (size_t i = 0; i < text.size();) {
            if (!first_byte_[static_cast<unsigned char>(text[i])]) {
                ++i;
                continue;
            }
            size_t len = 0;
            const int32_t k = longest_at(text, i, len);
            if (k < 0) {
                ++i;
                continue;
            }
            const token& t = tokens_[static_cast<size_t>(k)];
            size_t start = i, stop = i + len;
            if (t.lstrip) start = std::max(seg, whitespace_before(text, start));
            if (t.rstrip) stop = whitespace_after(text, stop);
            if (seg < start) on_text(text.substr(seg, start - seg));
            on_token(t.id);
            seg = i = stop;
        }
        if (seg < text.size()) on_text(text.substr(seg));
    }

private:
    // Index into tokens_ of the longest token starting at text[i], or -1; len gets its length.
    int32_t longest_at(std::string_view text, size_t i, size_t& len) const;
    // Start of the run of white space that ends at `pos` / end of the run starting at `pos`.
    static size_t whitespace_before(std::string_view text, size_t pos);
    static size_t whitespace_after(std::string_view text, size_t pos);

    struct node {
        int32_t token = -1;                             // index into tokens_ when a token ends here
        std::vector<std::pair<uint8_t, uint32_t>> next; // sorted by byte
    };
    std::vector<node> nodes_{1};
    std::vector<token> tokens_;
    bool first_byte_[256] = {};
};

} // namespace colibri
