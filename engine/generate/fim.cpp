#include "generate/fim.h"

#include "colibri/enum_names.hpp"
#include "core/error.h"

#include <array>

namespace colibri {

namespace {

struct family_tokens {
    fim_kind kind;
    std::string_view name;
    std::string_view prefix, suffix, middle;
    std::array<std::string_view, 5> stop;           // empty entries unused
    std::array<std::string_view, 2> repo_name = {}; // the first the vocabulary has
    std::string_view file_sep = {};
};

constexpr family_tokens families[] = {
    // StarCoder, StarCoder2, Granite (whose end of text is <|end_of_text|>), the default model
    {fim_kind::starcoder,
     "starcoder",
     "<fim_prefix>",
     "<fim_suffix>",
     "<fim_middle>",
     {"<|endoftext|>", "<fim_pad>", "<file_sep>", "</s>", "<|end_of_text|>"},
     {"<repo_name>", "<reponame>"},
     "<file_sep>"},
    {fim_kind::qwen,
     "qwen",
     "<|fim_prefix|>",
     "<|fim_suffix|>",
     "<|fim_middle|>",
     {"<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|im_end|>"},
     {"<|repo_name|>"},
     "<|file_sep|>"},
    {fim_kind::deepseek,
     "deepseek",
     "<\xEF\xBD\x9C"
     "fim\xE2\x96\x81"
     "begin\xEF\xBD\x9C>",
     "<\xEF\xBD\x9C"
     "fim\xE2\x96\x81"
     "hole\xEF\xBD\x9C>",
     "<\xEF\xBD\x9C"
     "fim\xE2\x96\x81"
     "end\xEF\xBD\x9C>",
     {"<\xEF\xBD\x9C"
      "end\xE2\x96\x81"
      "of\xE2\x96\x81"
      "sentence\xEF\xBD\x9C>",
      "<|EOT|>", "", "", ""}},
    {fim_kind::codellama,
     "codellama",
     "\xE2\x96\x81<PRE>",
     "\xE2\x96\x81<SUF>",
     "\xE2\x96\x81<MID>",
     {"\xE2\x96\x81<EOT>", "", "", "", ""}},
    // Codestral, Devstral (Mistral's tekken vocabulary): no middle token
    {fim_kind::codestral, "codestral", "[PREFIX]", "[SUFFIX]", "", {"</s>", "", "", "", ""}},
};

fim_template make(const tokenizer& tok, const family_tokens& f, bool strict) {
    fim_template t;
    t.prefix = tok.piece_to_id(f.prefix);
    t.suffix = tok.piece_to_id(f.suffix);
    t.middle = f.middle.empty() ? -1 : tok.piece_to_id(f.middle);
    if (t.prefix < 0 || t.suffix < 0 || (t.middle < 0 && !f.middle.empty())) {
        if (strict) {
            const std::string_view missing = t.prefix < 0 ? f.prefix : t.suffix < 0 ? f.suffix : f.middle;
            throw error(errc::invalid_argument, "fill-in-the-middle template '" + std::string(f.name) +
                                                    "': the vocabulary has no token '" + std::string(missing) + "'");
        }
        return {};
    }
    t.kind = f.kind;
    for (std::string_view s : f.stop) {
        if (s.empty()) continue;
        const int32_t id = tok.piece_to_id(s);
        if (id >= 0) t.stop.push_back(id);
    }
    if (!f.file_sep.empty()) {
        for (std::string_view name : f.repo_name)
            if (t.repo_name < 0 && !name.empty()) t.repo_name = tok.piece_to_id(name);
        t.file_sep = tok.piece_to_id(f.file_sep);
        if (t.repo_name < 0 || t.file_sep < 0) t.repo_name = t.file_sep = -1;
    }
    return t;
}

} // namespace

std::string_view fim_kind_name(fim_kind k) {
    if (k == fim_kind::none) return "none";
    for (const auto& f : families) {
        if (f.kind == k) return f.name;
    }
    return "none";
}

bool parse_fim_kind(std::string_view name, fim_kind& out) {
    if (name == "none") {
        out = fim_kind::none;
        return true;
    }
    for (const auto& f : families) {
        if (f.name == name) {
            out = f.kind;
            return true;
        }
    }
    return false;
}

bool fim_spellings_of(fim_kind kind, fim_spellings& out) {
    for (const auto& f : families) {
        if (f.kind != kind) continue;
        out = {f.prefix, f.suffix, f.middle, f.file_sep.empty() ? std::string_view() : f.repo_name[0], f.file_sep};
        return true;
    }
    return false;
}

bool parse_fim_order(std::string_view name, fim_order& out) {
    constexpr std::array<enum_name_pair<fim_order>, 2> names{{{fim_order::psm, "psm"}, {fim_order::spm, "spm"}}};
    const auto o = enum_value(names, name);
    if (o) out = *o;
    return o.has_value();
}

fim_template detect_fim(const tokenizer& tok) {
    for (const auto& f : families) {
        fim_template t = make(tok, f, false);
        if (t.kind != fim_kind::none) return t;
    }
    return {};
}

fim_template fim_for(const tokenizer& tok, fim_kind kind) {
    for (const auto& f : families) {
        if (f.kind == kind) return make(tok, f, true);
    }
    return {};
}

void fit_fim_parts(std::vector<int32_t>& prefix, std::vector<int32_t>& suffix, std::int64_t room) {
    const auto n_prefix = static_cast<std::int64_t>(prefix.size()), n_suffix = static_cast<std::int64_t>(suffix.size());
    if (room <= 0 || n_prefix + n_suffix <= room) return;
    const std::int64_t keep_suffix = std::min(n_suffix, std::max(room / 4, room - n_prefix));
    suffix.resize(static_cast<size_t>(keep_suffix));
    const std::int64_t excess = n_prefix - (room - keep_suffix);
    if (excess <= 0) return;
    const std::int64_t cut = std::min(n_prefix, (excess + fim_prefix_step - 1) / fim_prefix_step * fim_prefix_step);
    prefix.erase(prefix.begin(), prefix.begin() + static_cast<std::ptrdiff_t>(cut));
}

void build_fim_prompt(const tokenizer& tok, const fim_template& t, std::string_view prefix, std::string_view suffix,
                      fim_order order, std::vector<int32_t>& out, special_tokens specials, std::int64_t room) {
    COLIBRI_ASSERT(t.kind != fim_kind::none);
    std::vector<int32_t> pre, suf;
    tok.encode(prefix, pre, specials);
    tok.encode(suffix, suf, specials);
    const bool codestral = t.kind == fim_kind::codestral; // the cursor is the prompt's end in either order
    fit_fim_parts(pre, suf, room < 0 ? -1 : room - (codestral ? 2 : 3)); // less the framing tokens
    const auto put = [&](const std::vector<int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); };
    if (codestral) {
        out.push_back(t.suffix);
        put(suf);
        out.push_back(t.prefix);
        put(pre);
        return;
    }
    out.push_back(t.prefix);
    if (order == fim_order::psm) put(pre);
    out.push_back(t.suffix);
    put(suf);
    out.push_back(t.middle);
    if (order == fim_order::spm) put(pre);
}

void build_context_prompt(const tokenizer& tok, const fim_template& t, std::span<const context_file> files,
                          std::vector<int32_t>& out, special_tokens specials) {
    if (files.empty()) return;
    const bool repo = t.repo_name >= 0 && t.file_sep >= 0;
    if (repo) {
        out.push_back(t.repo_name);
        tok.encode("myproject\n", out, special_tokens::as_text);
    }
    for (const context_file& f : files) {
        if (repo) {
            out.push_back(t.file_sep);
            tok.encode(std::string(f.name.empty() ? "tmp" : f.name) + "\n", out, specials);
        } else {
            tok.encode("\n\n--- snippet ---\n\n", out, special_tokens::as_text);
        }
        tok.encode(f.text, out, specials);
    }
    if (repo) {
        out.push_back(t.file_sep);
        tok.encode("filename\n", out, special_tokens::as_text);
    }
}

} // namespace colibri
