#include "tokenizer/regex.h"

#include "core/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace colibri {

namespace {

std::string pcre2_message(int code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof(buf));
    return reinterpret_cast<const char*>(buf);
}

} // namespace

std::string onig_to_pcre2(std::string_view p) {
    std::string out;
    out.reserve(p.size() + 16);
    int class_depth = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            ++i;
            if (e == 's') {
                out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
            } else if (e == 'S') {
                if (class_depth > 0) {
                    throw error(errc::unsupported, "split pattern: \\S inside a character class is not supported");
                }
                out += "[^\\s\\x{85}]";
            } else if (e == 'h' || e == 'H') {
                // Oniguruma's Ruby syntax reads \h as a hex digit, PCRE2 as horizontal space.
                throw error(errc::unsupported, std::string("split pattern: \\") + e + " is not supported");
            } else {
                out += '\\';
                out += e;
            }
            continue;
        }
        if (c == '[') {
            ++class_depth;
            out += c;
            // A ']' right after '[' or '[^' is a literal member, not the end of the class.
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
            continue;
        }
        if (c == ']' && class_depth > 0) --class_depth;
        out += c;
    }
    return out;
}

regex::regex(std::string_view onig_pattern) {
    const std::string pattern = onig_to_pcre2(onig_pattern);
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &offset, nullptr);
    if (code_ == nullptr) {
        throw error(errc::format, "split pattern '" + std::string(onig_pattern) + "' does not compile: " +
                                      pcre2_message(err) + " at offset " + std::to_string(offset));
    }
    // Without JIT support (some platforms) pcre2_match interprets; the result is the same.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

regex::~regex() {
    if (code_ != nullptr) pcre2_code_free(code_);
}

regex_scratch::regex_scratch() {
    match_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (match_ == nullptr || context_ == nullptr || jit_stack_ == nullptr) {
        release();
        throw error(errc::out_of_memory, "regex: cannot allocate match data");
    }
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
}

regex_scratch::~regex_scratch() { release(); }

void regex_scratch::release() {
    if (jit_stack_ != nullptr) pcre2_jit_stack_free(jit_stack_);
    if (context_ != nullptr) pcre2_match_context_free(context_);
    if (match_ != nullptr) pcre2_match_data_free(match_);
    jit_stack_ = nullptr;
    context_ = nullptr;
    match_ = nullptr;
}

bool regex::find(regex_scratch& scratch, std::string_view subject, size_t start, size_t& match_begin,
                 size_t& match_end) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                               PCRE2_NO_UTF_CHECK, scratch.match_, scratch.context_);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) throw error(errc::internal, "regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_);
    match_begin = ov[0];
    match_end = ov[1];
    return true;
}

} // namespace colibri
