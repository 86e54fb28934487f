// GGUF vocabularies to tokenizer sections. The pre-tokenizer of a byte-level BPE
// vocabulary is not in the file, only its name: the table below gives, for each known
// name, the steps of the Hugging Face tokenizer.json it was converted from.

#include "convert/gguf_tokenizer.h"

#include "convert/gguf_file.h"
#include "core/error.h"
#include "format/bpe_payload.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace colibri {

using namespace format::bpe;

namespace {

// Token types of tokenizer.ggml.token_type (the same numbers as sentencepiece's).
enum : int64_t { tt_normal = 1, tt_unknown = 2, tt_control = 3, tt_user_defined = 4, tt_unused = 5, tt_byte = 6 };

class bytes_writer {
public:
    void u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    void str(std::string_view s) {
        u32(static_cast<uint32_t>(s.size()));
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    std::vector<uint8_t> bytes;
};

// Protocol-buffer wire format, just what a sentencepiece ModelProto needs.
class proto_writer {
public:
    void varint(uint64_t v) {
        while (v >= 0x80) {
            out.push_back(static_cast<uint8_t>(v | 0x80));
            v >>= 7;
        }
        out.push_back(static_cast<uint8_t>(v));
    }
    void tag(uint32_t field, uint32_t wire) { varint(uint64_t(field) << 3 | wire); }
    void int_field(uint32_t field, int64_t v) {
        tag(field, 0);
        varint(static_cast<uint64_t>(v));
    }
    void float_field(uint32_t field, float v) {
        tag(field, 5);
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        out.insert(out.end(), b, b + 4);
    }
    void bytes_field(uint32_t field, std::string_view s) {
        tag(field, 2);
        varint(s.size());
        out.insert(out.end(), s.begin(), s.end());
    }
    void message_field(uint32_t field, const proto_writer& m) {
        bytes_field(field, std::string_view(reinterpret_cast<const char*>(m.out.data()), m.out.size()));
    }
    std::vector<uint8_t> out;
};

/// One pre-tokenizer step of a tokenizer.json.
struct pre_step {
    enum kind { split, digits, byte_level } k;
    const char* regex = nullptr;    // split: Oniguruma syntax, as in tokenizer.json (Isolated)
    bool individual_digits = false; // digits
};
pre_step split(const char* regex) { return {pre_step::split, regex, false}; }
pre_step digits(bool individual) { return {pre_step::digits, nullptr, individual}; }
/// ByteLevel(use_regex=true): GPT-2's own pattern at this point of the sequence.
const pre_step gpt2_byte_level{pre_step::byte_level, nullptr, false};

/// One known pre-tokenizer name (llama.cpp's tokenizer.ggml.pre): the normalizer, pre-tokenizer
/// steps and model flags of the Hugging Face tokenizer.json it stands for.
struct pre_desc {
    std::string_view names;      // space-separated names of tokenizer.ggml.pre
    bool nfc;                    // an NFC normalizer (Qwen2)
    std::vector<pre_step> steps; // then ByteLevel(use_regex=false) unless a step was ByteLevel
    bool ignore_merges;          // a word in the vocabulary is one token (Llama 3, Tekken)
};

// GPT-2's pattern as the Llama 3 and Qwen families extend it.
#define COLIBRI_PRE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
const char* const llama3_regex = COLIBRI_PRE_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const qwen2_regex =
    COLIBRI_PRE_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const qwen35_regex = COLIBRI_PRE_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const seed_coder_regex =
    COLIBRI_PRE_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
#undef COLIBRI_PRE_CONTRACTIONS
const char* const tekken_regex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const cjk_hangul = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";

const std::vector<pre_desc>& pre_table() {
    static const std::vector<pre_desc> table = {
        {"gpt2 gpt-2 olmo mpt phi-2", false, {gpt2_byte_level}, false},
        // StarCoder and StarCoder2 (both "starcoder"), SmolLM, Refact, Command-R
        {"smollm starcoder refact command-r", false, {digits(true), gpt2_byte_level}, false},
        {"qwen2 deepseek-r1-qwen", true, {split(qwen2_regex)}, false},
        {"qwen35", false, {split(qwen35_regex)}, false},
        {"llama-bpe llama3 llama-v3", false, {split(llama3_regex)}, true},
        {"deepseek-v3",
         false,
         {split(R"(\p{N}{1,3})"), split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
          split(
              R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")},
         false},
        {"deepseek-coder",
         false,
         {split(R"([\r\n])"), split(R"(\s?\p{L}+)"), split(R"(\s?\p{P}+)"), split(cjk_hangul), digits(true)},
         false},
        {"deepseek-llm",
         false,
         {split(R"([\r\n])"),
          split(
              "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-"
              "\u0373"
              "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-"
              "\u052f"
              "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
              "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
              "\u1f7d"
              "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-"
              "\u1ff4"
              "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-"
              "\u2134\u2139"
              "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-"
              "\ua66d"
              "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
              "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
              "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"),
          split("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"), split(R"(\s+$)"),
          split(cjk_hangul), digits(true)},
         false},
        // Punctuation(Contiguous) as the split of Unicode punctuation and ASCII symbols it is
        {"falcon",
         false,
         {split(R"([\p{P}$+<=>^~|`]+)"), gpt2_byte_level, digits(false), split("[0-9][0-9][0-9]")},
         false},
        {"tekken", false, {split(tekken_regex)}, true},
        {"seed-coder", false, {split(seed_coder_regex)}, false},
    };
    return table;
}

const pre_desc* find_pre(std::string_view name) {
    for (const pre_desc& d : pre_table()) {
        std::string_view rest = d.names;
        while (!rest.empty()) {
            const size_t sp = rest.find(' ');
            if (rest.substr(0, sp) == name) return &d;
            rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
        }
    }
    return nullptr;
}

int32_t special_id(const gguf_file& f, const char* key, uint32_t n_tokens) {
    const auto v = f.get_uint(key);
    if (!v) return -1;
    if (*v >= n_tokens) return -1; // some files carry ids of tokens they do not have
    return static_cast<int32_t>(*v);
}

void fill_header(const gguf_file& f, tokenizer_section& sec, bool add_bos_default) {
    format::tokenizer_header& th = sec.header;
    th.bos_id = special_id(f, "tokenizer.ggml.bos_token_id", sec.n_tokens);
    th.eos_id = special_id(f, "tokenizer.ggml.eos_token_id", sec.n_tokens);
    th.pad_id = special_id(f, "tokenizer.ggml.padding_token_id", sec.n_tokens);
    if (f.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos_default) && th.bos_id >= 0)
        th.flags |= format::tok_add_bos;
    if (f.get_bool("tokenizer.ggml.add_eos_token").value_or(false) && th.eos_id >= 0) th.flags |= format::tok_add_eos;
    th.payload_size = sec.payload.size();
}

// tokens + scores + token types -> a sentencepiece ModelProto (BPE model: the scores are
// merge priorities, as in Llama's tokenizer.model).
tokenizer_section sentencepiece_section(const gguf_file& f, const std::vector<std::string_view>& tokens) {
    const std::vector<float> scores = f.float_array("tokenizer.ggml.scores");
    const std::vector<int64_t> types = f.int_array("tokenizer.ggml.token_type");
    if (scores.size() != tokens.size())
        f.fail("tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries for " +
               std::to_string(tokens.size()) + " tokens");
    if (!types.empty() && types.size() != tokens.size())
        f.fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
               std::to_string(tokens.size()) + " tokens");
    // Sentencepiece has one unknown piece: tokenizer.ggml.unknown_token_id's (Gemma 3 types
    // it control), else the first of that type; others of the type (Phi-3's padding) become
    // unused pieces, as llama.cpp never produces them either.
    size_t unk = tokens.size();
    if (const auto id = f.get_uint("tokenizer.ggml.unknown_token_id");
        id && *id < types.size() && (types[*id] == tt_unknown || types[*id] == tt_control)) {
        unk = *id;
    }
    for (size_t i = 0; i < types.size() && unk == tokens.size(); ++i) {
        if (types[i] == tt_unknown) unk = i;
    }
    proto_writer model;
    bool has_byte = false, has_unk = false;
    for (size_t i = 0; i < tokens.size(); ++i) {
        int64_t type = types.empty() ? tt_normal : types[i];
        if (type < tt_normal || type > tt_byte)
            f.fail("token " + std::to_string(i) + " has unknown token type " + std::to_string(type));
        if (i == unk) type = tt_unknown;
        else if (type == tt_unknown) type = tt_unused;
        has_byte |= type == tt_byte;
        has_unk |= type == tt_unknown;
        proto_writer piece;
        piece.bytes_field(1, tokens[i]);
        piece.float_field(2, scores[i]);
        if (type != tt_normal) piece.int_field(3, type);
        model.message_field(1, piece);
    }
    if (!has_unk) f.fail("tokenizer.ggml.token_type marks no unknown token (a sentencepiece vocabulary needs one)");
    proto_writer trainer;
    trainer.int_field(3, 2); // model_type BPE
    trainer.int_field(4, static_cast<int64_t>(tokens.size()));
    if (has_byte) trainer.int_field(35, 1); // byte_fallback
    auto piece_of = [&](const char* key) -> std::string_view {
        const auto id = f.get_uint(key);
        return id && *id < tokens.size() ? tokens[*id] : std::string_view();
    };
    // bos_id()/eos_id() of the processor look up these pieces; -1 when absent
    const std::pair<uint32_t, const char*> specials[] = {{46, "tokenizer.ggml.bos_token_id"},
                                                         {47, "tokenizer.ggml.eos_token_id"},
                                                         {48, "tokenizer.ggml.padding_token_id"}};
    for (const auto& [field, key] : specials) {
        if (const std::string_view p = piece_of(key); !p.empty()) trainer.bytes_field(field, p);
    }
    if (piece_of("tokenizer.ggml.padding_token_id").empty()) trainer.int_field(43, -1);
    model.message_field(2, trainer);
    proto_writer norm;
    norm.bytes_field(1, "identity");
    norm.int_field(3, f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true) ? 1 : 0);
    norm.int_field(4, f.get_bool("tokenizer.ggml.remove_extra_whitespaces").value_or(false) ? 1 : 0);
    norm.int_field(5, 1); // escape_whitespaces
    model.message_field(3, norm);

    tokenizer_section sec;
    sec.header.kind = static_cast<uint32_t>(format::tokenizer_kind::sentencepiece);
    sec.payload = std::move(model.out);
    sec.n_tokens = static_cast<uint32_t>(tokens.size());
    fill_header(f, sec, true);
    return sec;
}

// Gemma 4's vocabulary ("gemma4"): BPE in sentencepiece's manner, not byte-level. Spaces
// are U+2581 in the text, characters missing from the vocabulary become <0xXX> byte tokens,
// and only line breaks split the text (a run of them is one piece).
const pre_desc gemma4_pre{"gemma4", false, {split(R"([^\n]+|[\n]+)")}, false};

tokenizer_section bpe_section(const gguf_file& f, const std::vector<std::string_view>& tokens, bool spm_style) {
    const std::string pre = spm_style ? "gemma4" : f.get_string("tokenizer.ggml.pre").value_or("default");
    const pre_desc* pd = spm_style ? &gemma4_pre : find_pre(pre);
    if (pd == nullptr) {
        throw error(errc::unsupported, f.path() + ": pre-tokenizer '" + pre +
                                           "' (tokenizer.ggml.pre) is not supported (supported: " +
                                           std::string(gguf_known_pre_tokenizers()) + ")");
    }
    const std::vector<int64_t> types = f.int_array("tokenizer.ggml.token_type");
    if (!types.empty() && types.size() != tokens.size())
        f.fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
               std::to_string(tokens.size()) + " tokens");
    const std::vector<std::string_view> merges = f.string_array("tokenizer.ggml.merges");
    if (merges.empty()) f.fail("tokenizer.ggml.merges is missing (a gpt2 vocabulary needs its merges)");

    std::unordered_map<std::string_view, uint32_t> ids;
    ids.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i].empty()) f.fail("token " + std::to_string(i) + " is empty");
        ids.emplace(tokens[i], static_cast<uint32_t>(i)); // a repeated text keeps its first id
    }
    bytes_writer w;
    w.u32(magic);
    w.u32(version);
    w.u32((pd->ignore_merges ? model_ignore_merges : 0u) | (spm_style ? model_byte_fallback : 0u));
    const auto unk = f.get_uint("tokenizer.ggml.unknown_token_id");
    w.u32(spm_style && unk && *unk < tokens.size() ? static_cast<uint32_t>(*unk)
                                                   : static_cast<uint32_t>(-1)); // byte-level: every byte has a token
    w.u32(static_cast<uint32_t>(tokens.size()));
    for (std::string_view t : tokens) w.str(t);
    w.u32(static_cast<uint32_t>(merges.size()));
    for (size_t k = 0; k < merges.size(); ++k) {
        const std::string_view m = merges[k];
        const size_t sp = m.find(' ', 1); // a pair's first part is never empty
        if (sp == std::string_view::npos) f.fail("merge " + std::to_string(k) + " is not \"a b\"");
        const std::string a(m.substr(0, sp)), b(m.substr(sp + 1)), ab = a + b;
        for (const std::string* s : {&a, &b, &ab}) {
            auto it = ids.find(*s);
            if (it == ids.end())
                f.fail("merge " + std::to_string(k) + " (" + std::string(m) + "): '" + *s + "' is not a token");
            w.u32(it->second);
        }
    }
    // control and user-defined tokens are matched whole in the text, as the added tokens
    // of tokenizer.json they came from
    bytes_writer added;
    uint32_t n_added = 0;
    for (size_t i = 0; i < types.size(); ++i) {
        if (types[i] != tt_control && types[i] != tt_user_defined) continue;
        added.u32(static_cast<uint32_t>(i));
        added.u32(types[i] == tt_control ? uint32_t(added_special) : 0u); // matched in the raw text
        added.str(tokens[i]);
        ++n_added;
    }
    w.u32(n_added);
    w.bytes.insert(w.bytes.end(), added.bytes.begin(), added.bytes.end());
    w.u32(pd->nfc || spm_style ? 1 : 0);
    if (pd->nfc) w.u32(static_cast<uint32_t>(normalizer_op::nfc));
    if (spm_style) {
        w.u32(static_cast<uint32_t>(normalizer_op::replace));
        w.str(" ");
        w.str("\u2581");
    }
    const bool byte_level_step = spm_style || std::any_of(pd->steps.begin(), pd->steps.end(), [](const pre_step& s) {
                                     return s.k == pre_step::byte_level;
                                 });
    w.u32(static_cast<uint32_t>(pd->steps.size()) + (byte_level_step ? 0 : 1));
    for (const pre_step& step : pd->steps) {
        switch (step.k) {
        case pre_step::split:
            w.u32(static_cast<uint32_t>(pre_tokenizer_op::split));
            w.str(step.regex);
            w.u32(static_cast<uint32_t>(split_behaviour::isolated));
            w.u32(0);
            break;
        case pre_step::digits:
            w.u32(static_cast<uint32_t>(pre_tokenizer_op::digits));
            w.u32(step.individual_digits ? 1 : 0);
            break;
        case pre_step::byte_level:
            w.u32(static_cast<uint32_t>(pre_tokenizer_op::byte_level));
            w.u32(0); // add_prefix_space
            w.u32(1); // use_regex
            break;
        }
    }
    if (!byte_level_step) {
        w.u32(static_cast<uint32_t>(pre_tokenizer_op::byte_level));
        w.u32(0);
        w.u32(0);
    }
    if (spm_style) { // U+2581 back to spaces, byte tokens back to bytes
        w.u32(3);
        w.u32(static_cast<uint32_t>(decoder_op::replace));
        w.str("\u2581");
        w.str(" ");
        w.u32(static_cast<uint32_t>(decoder_op::byte_fallback));
        w.u32(static_cast<uint32_t>(decoder_op::fuse));
    } else {
        w.u32(1);
        w.u32(static_cast<uint32_t>(decoder_op::byte_level));
    }

    tokenizer_section sec;
    sec.header.kind = static_cast<uint32_t>(format::tokenizer_kind::bpe);
    sec.payload = std::move(w.bytes);
    sec.n_tokens = static_cast<uint32_t>(tokens.size());
    fill_header(f, sec, false);
    return sec;
}

} // namespace

std::string gguf_known_pre_tokenizers() {
    std::string s;
    for (const pre_desc& d : pre_table()) {
        for (const char c : d.names) s += c == ' ' ? std::string(", ") : std::string(1, c);
        if (&d != &pre_table().back()) s += ", ";
    }
    return s;
}

tokenizer_section import_gguf_tokenizer(const gguf_file& f) {
    const auto model = f.get_string("tokenizer.ggml.model");
    if (!model) f.fail("no tokenizer (tokenizer.ggml.model is missing)");
    const std::vector<std::string_view> tokens = f.string_array("tokenizer.ggml.tokens");
    if (*model != "llama" && *model != "gpt2" && *model != "gemma4") {
        throw error(errc::unsupported,
                    f.path() + ": tokenizer model '" + *model +
                        "' (tokenizer.ggml.model) is not supported (supported: llama, gpt2, gemma4)");
    }
    if (tokens.empty()) f.fail("tokenizer.ggml.tokens is missing or empty");
    if (tokens.size() >= (1u << 24)) f.fail("tokenizer.ggml.tokens has too many tokens");
    return *model == "llama" ? sentencepiece_section(f, tokens) : bpe_section(f, tokens, *model == "gemma4");
}

} // namespace colibri
