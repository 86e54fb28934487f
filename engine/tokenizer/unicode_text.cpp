#include "tokenizer/unicode_text.h"

#include "core/error.h"

#include <unicode/bytestream.h>
#include <unicode/errorcode.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

namespace colibri::unicode {

namespace {

// Length of the well-formed sequence at s[i], or 0; `maximal` gets the length of the
// longest prefix of a well-formed sequence found there (at least 1), which is what one
// U+FFFD replaces.
size_t sequence_at(std::string_view s, size_t i, size_t& maximal) {
    const auto c = static_cast<unsigned char>(s[i]);
    maximal = 1;
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      // no overlong forms
        else if (c == 0xED) hi = 0x9F; // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; // nothing past U+10FFFF
    } else {
        return 0;
    }
    for (size_t k = 1; k < need; ++k) {
        if (i + k >= s.size()) return 0;
        const auto cc = static_cast<unsigned char>(s[i + k]);
        const bool ok = k == 1 ? (cc >= lo && cc <= hi) : (cc >= 0x80 && cc <= 0xBF);
        if (!ok) return 0;
        maximal = k + 1;
    }
    return need;
}

} // namespace

bool is_valid_utf8(std::string_view s) {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        // Eight ASCII bytes at a time: the common case for source code.
        while (i + 8 <= n) {
            uint64_t w;
            __builtin_memcpy(&w, s.data() + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        size_t maximal;
        const size_t len = sequence_at(s, i, maximal);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

void append_utf8_lossy(std::string& out, std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        size_t maximal;
        const size_t len = sequence_at(s, i, maximal);
        if (len == 0) {
            out += "\xEF\xBF\xBD";
            i += maximal;
        } else {
            out.append(s.data() + i, len);
            i += len;
        }
    }
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = char_length(c);
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += len;
    return cp;
}

bool is_white_space(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

normalizer::normalizer(normal_form form) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = nullptr;
    switch (form) {
    case normal_form::nfc: n = icu::Normalizer2::getNFCInstance(status); break;
    case normal_form::nfd: n = icu::Normalizer2::getNFDInstance(status); break;
    case normal_form::nfkc: n = icu::Normalizer2::getNFKCInstance(status); break;
    case normal_form::nfkd: n = icu::Normalizer2::getNFKDInstance(status); break;
    }
    if (U_FAILURE(status) || n == nullptr) {
        throw error(errc::internal, std::string("ICU normalizer unavailable: ") + u_errorName(status));
    }
    icu_ = n;
}

void normalizer::normalize(std::string_view in, std::string& out) const {
    out.clear();
    size_t i = 0;
    while (i < in.size() && static_cast<unsigned char>(in[i]) < 0x80) ++i;
    if (i == in.size()) {
        out.assign(in);
        return;
    }
    const auto* n = static_cast<const icu::Normalizer2*>(icu_);
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(in.data(), static_cast<int32_t>(in.size()));
    if (n->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) {
        out.assign(in);
        return;
    }
    status = U_ZERO_ERROR;
    out.reserve(in.size() + in.size() / 4);
    icu::StringByteSink<std::string> sink(&out);
    n->normalizeUTF8(0, piece, sink, nullptr, status);
    if (U_FAILURE(status)) {
        throw error(errc::internal, std::string("ICU normalisation failed: ") + u_errorName(status));
    }
}

} // namespace colibri::unicode
