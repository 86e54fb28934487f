// GGUF vocabularies to tokenizer sections. The pre-tokenizer of a byte-level BPE
// vocabulary is not in the file, only its name: the table below gives, for each known
// name, the steps of the Hugging Face tokenizer.json it was converted from.

#include "convert/gguf_tokenizer.h"

#include "convert/gguf_file.h"
#include "core/error.h"
#include "format/bpe_payload.h"

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

struct pre_split {
    const char* regex; // Oniguruma syntax, as in tokenizer.json
};

/// One known pre-tokenizer name: its normalizer and pre-tokenizer steps.
struct pre_desc {
    std::string_view names; // space-separated names of tokenizer.ggml.pre
    bool nfc;               // an NFC normalizer (Qwen2/Qwen3)
    bool individual_digits; // a Digits(individual_digits) step first
    std::vector<const char*> splits; // Split(regex, Isolated) steps, then ByteLevel(use_regex=false)
    bool gpt2_regex;        // no splits: ByteLevel(use_regex=true), GPT-2's own pattern
};

const std::vector<pre_desc>& pre_table() {
    static const std::vector<pre_desc> table = {
        {"gpt2 olmo", false, false, {}, true},
        {"smollm starcoder refact", false, true, {}, true},
        {"qwen2", true, false,
         {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
         false},
        {"llama-bpe llama3", false, false,
         {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
         false},
        {"deepseek-v3", false, false,
         {R"(\p{N}{1,3})", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
          R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
         false},
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
    if (f.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos_default) && th.bos_id >= 0) th.flags |= format::tok_add_bos;
    if (f.get_bool("tokenizer.ggml.add_eos_token").value_or(false) && th.eos_id >= 0) th.flags |= format::tok_add_eos;
    th.payload_size = sec.payload.size();
}

// tokens + scores + token types -> a sentencepiece ModelProto (BPE model: the scores are
// merge priorities, as in Llama's tokenizer.model).
tokenizer_section sentencepiece_section(const gguf_file& f, const std::vector<std::string_view>& tokens) {
    const std::vector<float> scores = f.float_array("tokenizer.ggml.scores");
    const std::vector<int64_t> types = f.int_array("tokenizer.ggml.token_type");
    if (scores.size() != tokens.size()) f.fail("tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries for " + std::to_string(tokens.size()) + " tokens");
    if (!types.empty() && types.size() != tokens.size()) f.fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " + std::to_string(tokens.size()) + " tokens");
    proto_writer model;
    bool has_byte = false, has_unk = false;
    for (size_t i = 0; i < tokens.size(); ++i) {
        int64_t type = types.empty() ? tt_normal : types[i];
        if (type < tt_normal || type > tt_byte) f.fail("token " + std::to_string(i) + " has unknown token type " + std::to_string(type));
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
    const std::pair<uint32_t, const char*> specials[] = {{46, "tokenizer.ggml.bos_token_id"}, {47, "tokenizer.ggml.eos_token_id"}, {48, "tokenizer.ggml.padding_token_id"}};
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

tokenizer_section bpe_section(const gguf_file& f, const std::vector<std::string_view>& tokens) {
    const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
    const pre_desc* pd = find_pre(pre);
    if (pd == nullptr) {
        throw error(errc::unsupported, f.path() + ": pre-tokenizer '" + pre + "' (tokenizer.ggml.pre) is not supported (supported: " +
                                           std::string(gguf_known_pre_tokenizers()) + ")");
    }
    const std::vector<int64_t> types = f.int_array("tokenizer.ggml.token_type");
    if (!types.empty() && types.size() != tokens.size()) f.fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " + std::to_string(tokens.size()) + " tokens");
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
    w.u32(0); // model flags: plain byte-level BPE
    w.u32(static_cast<uint32_t>(-1)); // no unknown token: every byte has one
    w.u32(static_cast<uint32_t>(tokens.size()));
    for (std::string_view t : tokens) w.str(t);
    w.u32(static_cast<uint32_t>(merges.size()));
    for (size_t k = 0; k < merges.size(); ++k) {
        const std::string_view m = merges[k];
        const size_t sp = m.find(' ');
        if (sp == std::string_view::npos) f.fail("merge " + std::to_string(k) + " is not \"a b\"");
        const std::string a(m.substr(0, sp)), b(m.substr(sp + 1)), ab = a + b;
        for (const std::string* s : {&a, &b, &ab}) {
            auto it = ids.find(*s);
            if (it == ids.end()) f.fail("merge " + std::to_string(k) + " (" + std::string(m) + "): '" + *s + "' is not a token");
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
    w.u32(pd->nfc ? 1 : 0);
    if (pd->nfc) w.u32(static_cast<uint32_t>(normalizer_op::nfc));
    w.u32(static_cast<uint32_t>(pd->splits.size()) + (pd->individual_digits ? 1 : 0) + 1);
    if (pd->individual_digits) {
        w.u32(static_cast<uint32_t>(pre_tokenizer_op::digits));
        w.u32(1);
    }
    for (const char* re : pd->splits) {
        w.u32(static_cast<uint32_t>(pre_tokenizer_op::split));
        w.str(re);
        w.u32(static_cast<uint32_t>(split_behaviour::isolated));
        w.u32(0);
    }
    w.u32(static_cast<uint32_t>(pre_tokenizer_op::byte_level));
    w.u32(0);
    w.u32(pd->gpt2_regex ? 1 : 0);
    w.u32(1); // decoders: byte_level
    w.u32(static_cast<uint32_t>(decoder_op::byte_level));

    tokenizer_section sec;
    sec.header.kind = static_cast<uint32_t>(format::tokenizer_kind::bpe);
    sec.payload = std::move(w.bytes);
    sec.n_tokens = static_cast<uint32_t>(tokens.size());
    fill_header(f, sec, false);
    return sec;
}

} // namespace

std::string_view gguf_known_pre_tokenizers() {
    return "gpt2, olmo, smollm, starcoder, refact, qwen2, llama-bpe, llama3, deepseek-v3";
}

tokenizer_section import_gguf_tokenizer(const gguf_file& f) {
    const auto model = f.get_string("tokenizer.ggml.model");
    if (!model) f.fail("no tokenizer (tokenizer.ggml.model is missing)");
    const std::vector<std::string_view> tokens = f.string_array("tokenizer.ggml.tokens");
    if (*model != "llama" && *model != "gpt2") {
        throw error(errc::unsupported, f.path() + ": tokenizer model '" + *model +
                                           "' (tokenizer.ggml.model) is not supported (supported: llama, gpt2)");
    }
    if (tokens.empty()) f.fail("tokenizer.ggml.tokens is missing or empty");
    if (tokens.size() >= (1u << 24)) f.fail("tokenizer.ggml.tokens has too many tokens");
    return *model == "llama" ? sentencepiece_section(f, tokens) : bpe_section(f, tokens);
}

} // namespace colibri
