#include "tokenizer/tokenizer.h"

#include "tokenizer/unicode_text.h"

namespace colibri {

namespace {

// Length of the UTF-8 sequence starting at s[i] if it is valid, else 0.
size_t valid_sequence(std::string_view s, size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t need;
    uint32_t cp;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) {
        need = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4;
        cp = c & 0x07;
    } else return 0;
    if (i + need > s.size()) return 0;
    for (size_t k = 1; k < need; ++k) {
        const auto cc = static_cast<unsigned char>(s[i + k]);
        if ((cc & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (cc & 0x3F);
    }
    // overlong forms, surrogates and values past U+10FFFF are invalid
    static constexpr uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return need;
}

} // namespace

size_t utf8_complete_prefix(std::string_view s) {
    // Look back at most 3 bytes for the lead byte of a sequence that is still open.
    const size_t n = s.size();
    for (size_t back = 1; back <= 4 && back <= n; ++back) {
        const auto c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue; // continuation byte: keep looking
        size_t need = 1;
        if ((c & 0xE0) == 0xC0) need = 2;
        else if ((c & 0xF0) == 0xE0) need = 3;
        else if ((c & 0xF8) == 0xF0) need = 4;
        return need > back ? n - back : n;
    }
    return n;
}

void append_valid_utf8(std::string& out, std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const size_t len = valid_sequence(s, i);
        if (len == 0) {
            out += "\xEF\xBF\xBD";
            ++i;
        } else {
            out.append(s.substr(i, len));
            i += len;
        }
    }
}

std::string text_stream::push(int32_t id) {
    tok_.append_bytes(id, pending_);
    if (at_start_ && !pending_.empty()) {
        if (pending_[0] == ' ' && tok_.strips_leading_space()) pending_.erase(0, 1);
        at_start_ = false;
    }
    const size_t complete = utf8_complete_prefix(pending_);
    std::string out;
    append_text(out, std::string_view(pending_).substr(0, complete));
    pending_.erase(0, complete);
    return out;
}

void text_stream::append_text(std::string& out, std::string_view bytes) const {
    if (tok_.replaces_maximal_subparts()) unicode::append_utf8_lossy(out, bytes);
    else append_valid_utf8(out, bytes);
}

std::string text_stream::flush() {
    std::string out;
    append_text(out, pending_);
    pending_.clear();
    return out;
}

} // namespace colibri
