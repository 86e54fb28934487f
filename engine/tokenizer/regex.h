#pragma once
// Unicode regular expressions for pre-tokenizer split patterns, on PCRE2 (UTF + UCP, JIT).

#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace colibri {

/// Per-call matching state (PCRE2 match data and JIT stack); one per thread of encoding.
class regex_scratch {
public:
    regex_scratch();
    ~regex_scratch();
    regex_scratch(const regex_scratch&) = delete;
    regex_scratch& operator=(const regex_scratch&) = delete;

private:
    friend class regex;
    void release();
    pcre2_real_match_data_8* match_ = nullptr;
    pcre2_real_match_context_8* context_ = nullptr;
    pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

/// A compiled pattern, immutable and shareable between threads.
class regex {
public:
    /// Compiles a pattern written for Oniguruma (the engine of Hugging Face tokenizers).
    /// Throws colibri::error (format) naming the pattern when it does not compile, or
    /// (unsupported) for a construct whose meaning differs between the two engines.
    explicit regex(std::string_view onig_pattern);
    ~regex();
    regex(regex&& other) noexcept : code_(other.code_) { other.code_ = nullptr; }
    regex& operator=(regex&&) = delete;
    regex(const regex&) = delete;

    /// First match in subject at or after byte `start` (subject is well-formed UTF-8, and
    /// lookarounds see nothing outside it). Returns false when there is none.
    bool find(regex_scratch& scratch, std::string_view subject, size_t start, size_t& match_begin,
              size_t& match_end) const;

private:
    pcre2_real_code_8* code_ = nullptr;
};

/// The PCRE2 form of an Oniguruma pattern. Oniguruma's \s is the Unicode White_Space
/// property, which also has U+0085; PCRE2's \s with UCP does not, so it is added.
std::string onig_to_pcre2(std::string_view pattern);

} // namespace colibri
