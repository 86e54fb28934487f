#include "tokenizer/added_tokens.h"

#include "tokenizer/unicode_text.h"

#include <algorithm>

namespace colibri {

bool looks_special(std::string_view s) {
    const auto wrapped = [s](std::string_view open, std::string_view close) {
        return s.size() >= open.size() + close.size() && s.starts_with(open) && s.ends_with(close);
    };
    return s == "<pad>" || s == "<mask>" || wrapped("<|", "|>") ||
           wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || // U+FF5C
           wrapped("<unused", ">") || wrapped("<fim_", ">") || wrapped("<fim-", ">");
}

void added_token_matcher::add(std::string_view content, token t) {
    if (content.empty()) return;
    uint32_t at = 0;
    for (const char ch : content) {
        const auto c = static_cast<uint8_t>(ch);
        auto& next = nodes_[at].next;
        auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, uint32_t(0)));
        if (it != next.end() && it->first == c) {
            at = it->second;
        } else {
            const auto child = static_cast<uint32_t>(nodes_.size());
            next.insert(it, {c, child});
            nodes_.emplace_back(); // invalidates `next`; not used again below
            at = child;
        }
    }
    nodes_[at].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(t);
    first_byte_[static_cast<uint8_t>(content[0])] = true;
}

int32_t added_token_matcher::longest_at(std::string_view text, size_t i, size_t& len) const {
    int32_t found = -1;
    uint32_t at = 0;
    for (size_t j = i; j < text.size(); ++j) {
        const auto c = static_cast<uint8_t>(text[j]);
        const auto& next = nodes_[at].next;
        auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, uint32_t(0)));
        if (it == next.end() || it->first != c) break;
        at = it->second;
        if (nodes_[at].token >= 0) {
            found = nodes_[at].token;
            len = j + 1 - i;
        }
    }
    return found;
}

size_t added_token_matcher::whitespace_before(std::string_view text, size_t pos) {
    while (pos > 0) {
        size_t start = pos - 1; // back to the lead byte of the previous character
        while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!unicode::is_white_space(unicode::next_code_point(text, i))) break;
        pos = start;
    }
    return pos;
}

size_t added_token_matcher::whitespace_after(std::string_view text, size_t pos) {
    while (pos < text.size()) {
        size_t i = pos;
        if (!unicode::is_white_space(unicode::next_code_point(text, i))) break;
        pos = i;
    }
    return pos;
}

} // namespace colibri
