#include "convert/bpe_import.h"

#include "core/error.h"
#include "format/bpe_payload.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace colibri {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace format::bpe;

namespace {

class payload_writer {
public:
    void u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    void str(const std::string& s) {
        u32(static_cast<uint32_t>(s.size()));
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    std::vector<uint8_t> bytes;
};

json read_json(const fs::path& p) {
    std::ifstream in(p);
    if (!in) throw error(errc::io, p.string() + ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw error(errc::format, p.string() + ": invalid JSON: " + e.what());
    }
}

// Translates one tokenizer.json component; `where` names it in errors.
class importer {
public:
    explicit importer(std::string path) : path_(std::move(path)) {}

    [[noreturn]] void unsupported(const std::string& what) const {
        throw error(errc::unsupported, path_ + ": " + what + " is not supported");
    }
    [[noreturn]] void bad(const std::string& what) const { throw error(errc::format, path_ + ": " + what); }

    const json& field(const json& obj, const char* key, const char* where) const {
        if (!obj.is_object() || !obj.contains(key)) bad(std::string(where) + " has no \"" + key + "\"");
        return obj.at(key);
    }
    std::string string_field(const json& obj, const char* key, const char* where) const {
        const json& v = field(obj, key, where);
        if (!v.is_string()) bad(std::string(where) + "." + key + " is not a string");
        return v.get<std::string>();
    }
    bool bool_field(const json& obj, const char* key, bool fallback) const {
        if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
        if (!obj.at(key).is_boolean()) bad(std::string("\"") + key + "\" is not a boolean");
        return obj.at(key).get<bool>();
    }
    std::string type_of(const json& obj, const char* where) const { return string_field(obj, "type", where); }

    // A pattern object {"String": s} or {"Regex": r} as a regex in Oniguruma syntax.
    std::string pattern_regex(const json& p, const char* where) const {
        if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string()) return p.at("Regex").get<std::string>();
        if (p.is_object() && p.contains("String") && p.at("String").is_string()) {
            std::string out;
            for (const char c : p.at("String").get<std::string>()) {
                const auto u = static_cast<unsigned char>(c);
                if (u < 0x80 && !std::isalnum(u)) out += '\\';
                out += c;
            }
            return out;
        }
        bad(std::string(where) + " has no String or Regex pattern");
    }
    std::string pattern_string(const json& p, const char* where) const {
        if (p.is_object() && p.contains("String") && p.at("String").is_string())
            return p.at("String").get<std::string>();
        if (p.is_object() && p.contains("Regex")) unsupported(std::string(where) + " with a Regex pattern");
        bad(std::string(where) + " has no String pattern");
    }

    void normalizer(const json& n, payload_writer& w, uint32_t& count) const {
        if (n.is_null()) return;
        const std::string type = type_of(n, "normalizer");
        if (type == "Sequence") {
            for (const json& x : field(n, "normalizers", "Sequence normalizer")) normalizer(x, w, count);
            return;
        }
        static const std::map<std::string, normalizer_op> forms = {{"NFC", normalizer_op::nfc},
                                                                   {"NFD", normalizer_op::nfd},
                                                                   {"NFKC", normalizer_op::nfkc},
                                                                   {"NFKD", normalizer_op::nfkd}};
        if (auto it = forms.find(type); it != forms.end()) {
            w.u32(static_cast<uint32_t>(it->second));
        } else if (type == "Prepend") {
            w.u32(static_cast<uint32_t>(normalizer_op::prepend));
            w.str(string_field(n, "prepend", "Prepend normalizer"));
        } else if (type == "Replace") {
            w.u32(static_cast<uint32_t>(normalizer_op::replace));
            w.str(pattern_string(field(n, "pattern", "Replace normalizer"), "Replace normalizer"));
            w.str(string_field(n, "content", "Replace normalizer"));
        } else {
            unsupported("normalizer " + type);
        }
        ++count;
    }

    void pre_tokenizer(const json& p, payload_writer& w, uint32_t& count) const {
        if (p.is_null()) return;
        const std::string type = type_of(p, "pre_tokenizer");
        if (type == "Sequence") {
            for (const json& x : field(p, "pretokenizers", "Sequence pre-tokenizer")) pre_tokenizer(x, w, count);
            return;
        }
        if (type == "Split") {
            static const std::map<std::string, split_behaviour> behaviours = {
                {"Removed", split_behaviour::removed},
                {"Isolated", split_behaviour::isolated},
                {"MergedWithPrevious", split_behaviour::merged_with_previous},
                {"MergedWithNext", split_behaviour::merged_with_next},
                {"Contiguous", split_behaviour::contiguous}};
            const std::string b = string_field(p, "behavior", "Split pre-tokenizer");
            auto it = behaviours.find(b);
            if (it == behaviours.end()) unsupported("Split behavior " + b);
            w.u32(static_cast<uint32_t>(pre_tokenizer_op::split));
            w.str(pattern_regex(field(p, "pattern", "Split pre-tokenizer"), "Split pre-tokenizer"));
            w.u32(static_cast<uint32_t>(it->second));
            w.u32(bool_field(p, "invert", false) ? 1 : 0);
        } else if (type == "ByteLevel") {
            if (bool_field(p, "add_prefix_space", false)) unsupported("ByteLevel pre-tokenizer with add_prefix_space");
            w.u32(static_cast<uint32_t>(pre_tokenizer_op::byte_level));
            w.u32(0);
            w.u32(bool_field(p, "use_regex", true) ? 1 : 0);
        } else if (type == "Digits") {
            w.u32(static_cast<uint32_t>(pre_tokenizer_op::digits));
            w.u32(bool_field(p, "individual_digits", false) ? 1 : 0);
        } else {
            unsupported("pre-tokenizer " + type);
        }
        ++count;
    }

    void decoder(const json& d, payload_writer& w, uint32_t& count) const {
        if (d.is_null()) return;
        const std::string type = type_of(d, "decoder");
        if (type == "Sequence") {
            for (const json& x : field(d, "decoders", "Sequence decoder")) decoder(x, w, count);
            return;
        }
        if (type == "ByteLevel") {
            w.u32(static_cast<uint32_t>(decoder_op::byte_level));
        } else if (type == "ByteFallback") {
            w.u32(static_cast<uint32_t>(decoder_op::byte_fallback));
        } else if (type == "Fuse") {
            w.u32(static_cast<uint32_t>(decoder_op::fuse));
        } else if (type == "Replace") {
            w.u32(static_cast<uint32_t>(decoder_op::replace));
            w.str(pattern_string(field(d, "pattern", "Replace decoder"), "Replace decoder"));
            w.str(string_field(d, "content", "Replace decoder"));
        } else if (type == "Strip") {
            const json& start = field(d, "start", "Strip decoder");
            const json& stop = field(d, "stop", "Strip decoder");
            if (!start.is_number_unsigned() || !stop.is_number_unsigned())
                bad("Strip decoder start/stop are not counts");
            w.u32(static_cast<uint32_t>(decoder_op::strip));
            w.str(string_field(d, "content", "Strip decoder"));
            w.u32(start.get<uint32_t>());
            w.u32(stop.get<uint32_t>());
        } else {
            unsupported("decoder " + type);
        }
        ++count;
    }

private:
    std::string path_;
};

// An id from config.json (an integer or a list of them, the first taken) or, failing
// that, from tokenizer_config.json's token text (a string or an AddedToken object).
int32_t special_id(const json* config, const char* id_key, const json* tok_config, const char* token_key,
                   const std::unordered_map<std::string, int32_t>& by_text) {
    if (config != nullptr && config->contains(id_key)) {
        const json& v = config->at(id_key);
        if (v.is_number_integer()) return v.get<int32_t>();
        if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int32_t>();
    }
    if (tok_config != nullptr && tok_config->contains(token_key)) {
        const json& v = tok_config->at(token_key);
        std::string text;
        if (v.is_string()) text = v.get<std::string>();
        else if (v.is_object() && v.contains("content") && v.at("content").is_string())
            text = v.at("content").get<std::string>();
        if (auto it = by_text.find(text); !text.empty() && it != by_text.end()) return it->second;
    }
    return -1;
}

} // namespace

namespace {

tokenizer_section import_checked(const std::string& tokenizer_json) {
    const fs::path path(tokenizer_json);
    const json tj = read_json(path);
    importer im(tokenizer_json);

    const json& model = im.field(tj, "model", "tokenizer.json");
    if (const std::string type = im.type_of(model, "model"); type != "BPE") im.unsupported("model type " + type);
    if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() > 0) {
        im.unsupported("BPE dropout");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty()) {
            im.unsupported(std::string("BPE ") + key);
        }
    }

    // Vocabulary and added tokens share one id space.
    const json& vocab = im.field(model, "vocab", "model");
    if (!vocab.is_object()) im.bad("model.vocab is not an object");
    std::vector<std::string> tokens;
    std::unordered_map<std::string, int32_t> by_text;
    for (const auto& [text, idv] : vocab.items()) {
        if (!idv.is_number_unsigned() || idv.get<uint64_t>() >= (1u << 24))
            im.bad("vocab id of '" + text + "' is not a valid id");
        const auto id = idv.get<uint32_t>();
        if (text.empty()) im.bad("vocab has an empty token");
        if (tokens.size() <= id) tokens.resize(id + 1);
        if (!tokens[id].empty()) im.bad("vocab id " + std::to_string(id) + " is used twice");
        tokens[id] = text;
        by_text.emplace(text, static_cast<int32_t>(id));
    }
    const std::unordered_map<std::string, int32_t> vocab_ids = by_text;

    struct added {
        uint32_t id, flags;
        std::string content;
    };
    std::vector<added> added_tokens;
    uint32_t n_tokens = static_cast<uint32_t>(tokens.size());
    // The reference library ignores the ids written for added tokens and assigns its own:
    // the vocabulary's id when the text is a model token, else the next id after the
    // model's tokens and the added tokens before. A file whose ids differ is refused
    // rather than tokenized differently from the reference.
    const auto model_size = static_cast<uint32_t>(vocab.size());
    int64_t max_assigned = -1;
    if (tj.contains("added_tokens") && tj.at("added_tokens").is_array()) {
        for (const json& a : tj.at("added_tokens")) {
            const json& idv = im.field(a, "id", "added token");
            if (!idv.is_number_unsigned() || idv.get<uint64_t>() >= (1u << 24))
                im.bad("added token id is not a valid id");
            added t{idv.get<uint32_t>(), 0, im.string_field(a, "content", "added token")};
            if (t.content.empty()) im.bad("added token " + std::to_string(t.id) + " is empty");
            if (im.bool_field(a, "single_word", false))
                im.unsupported("added token with single_word (" + t.content + ")");
            if (im.bool_field(a, "special", false)) t.flags |= added_special;
            if (im.bool_field(a, "lstrip", false)) t.flags |= added_lstrip;
            if (im.bool_field(a, "rstrip", false)) t.flags |= added_rstrip;
            if (im.bool_field(a, "normalized", !im.bool_field(a, "special", false))) t.flags |= added_normalized;
            uint32_t expected = model_size;
            if (auto it = by_text.find(t.content); it != by_text.end()) {
                expected = static_cast<uint32_t>(it->second);
            } else if (max_assigned >= int64_t(model_size)) {
                expected = static_cast<uint32_t>(max_assigned + 1);
            }
            if (expected != t.id) {
                im.bad("added token '" + t.content + "' has id " + std::to_string(t.id) +
                       " but the reference library would give it id " + std::to_string(expected));
            }
            max_assigned = std::max<int64_t>(max_assigned, expected);
            n_tokens = std::max(n_tokens, t.id + 1);
            by_text[t.content] = static_cast<int32_t>(t.id);
            added_tokens.push_back(std::move(t));
        }
    }
    tokens.resize(n_tokens);

    payload_writer w;
    w.u32(magic);
    w.u32(version);
    uint32_t flags = 0;
    if (im.bool_field(model, "byte_fallback", false)) flags |= model_byte_fallback;
    if (im.bool_field(model, "fuse_unk", false)) flags |= model_fuse_unk;
    if (im.bool_field(model, "ignore_merges", false)) flags |= model_ignore_merges;
    w.u32(flags);
    int32_t unk = -1;
    if (model.contains("unk_token") && model.at("unk_token").is_string()) {
        auto it = vocab_ids.find(model.at("unk_token").get<std::string>());
        if (it == vocab_ids.end()) im.bad("unk_token is not in the vocabulary");
        unk = it->second;
    }
    w.u32(static_cast<uint32_t>(unk));
    w.u32(n_tokens);
    for (const auto& t : tokens) w.str(t);

    const json& merges = im.field(model, "merges", "model");
    if (!merges.is_array()) im.bad("model.merges is not an array");
    w.u32(static_cast<uint32_t>(merges.size()));
    auto id_of = [&](const std::string& t, size_t k) {
        auto it = vocab_ids.find(t);
        if (it == vocab_ids.end()) im.bad("merge " + std::to_string(k) + ": '" + t + "' is not in the vocabulary");
        return static_cast<uint32_t>(it->second);
    };
    for (size_t k = 0; k < merges.size(); ++k) {
        const json& m = merges[k];
        std::string a, b;
        if (m.is_string()) { // "a b"
            const std::string s = m.get<std::string>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos) im.bad("merge " + std::to_string(k) + " is not \"a b\"");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) { // ["a", "b"]
            a = m[0].get<std::string>();
            b = m[1].get<std::string>();
        } else {
            im.bad("merge " + std::to_string(k) + " is neither \"a b\" nor [a, b]");
        }
        w.u32(id_of(a, k));
        w.u32(id_of(b, k));
        w.u32(id_of(a + b, k));
    }

    w.u32(static_cast<uint32_t>(added_tokens.size()));
    for (const auto& a : added_tokens) {
        w.u32(a.id);
        w.u32(a.flags);
        w.str(a.content);
    }

    for (const auto& [key, fn] : {std::pair<const char*, int>{"normalizer", 0}, {"pre_tokenizer", 1}, {"decoder", 2}}) {
        payload_writer part;
        uint32_t count = 0;
        const json none;
        const json& j = tj.contains(key) ? tj.at(key) : none;
        if (fn == 0) im.normalizer(j, part, count);
        else if (fn == 1) im.pre_tokenizer(j, part, count);
        else im.decoder(j, part, count);
        w.u32(count);
        w.bytes.insert(w.bytes.end(), part.bytes.begin(), part.bytes.end());
    }

    tokenizer_section sec;
    sec.payload = std::move(w.bytes);
    sec.n_tokens = n_tokens;
    format::tokenizer_header& th = sec.header;
    th.kind = static_cast<uint32_t>(format::tokenizer_kind::bpe);
    json config, tok_config;
    const fs::path dir = path.parent_path();
    if (fs::exists(dir / "config.json")) config = read_json(dir / "config.json");
    if (fs::exists(dir / "tokenizer_config.json")) tok_config = read_json(dir / "tokenizer_config.json");
    const json* cfg = config.is_object() ? &config : nullptr;
    const json* tcfg = tok_config.is_object() ? &tok_config : nullptr;
    th.bos_id = special_id(cfg, "bos_token_id", tcfg, "bos_token", by_text);
    th.eos_id = special_id(cfg, "eos_token_id", tcfg, "eos_token", by_text);
    th.pad_id = special_id(cfg, "pad_token_id", tcfg, "pad_token", by_text);
    for (int32_t* id : {&th.bos_id, &th.eos_id, &th.pad_id}) {
        if (*id < -1 || *id >= static_cast<int32_t>(n_tokens)) *id = -1;
    }
    bool add_bos = false;
    if (tcfg != nullptr && tcfg->contains("add_bos_token") && tcfg->at("add_bos_token").is_boolean()) {
        add_bos = tcfg->at("add_bos_token").get<bool>();
    } else if (tj.contains("post_processor") && tj.at("post_processor").is_object()) {
        const json& pp = tj.at("post_processor");
        add_bos = pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && pp.at("single").is_array() &&
                  !pp.at("single").empty() && pp.at("single")[0].contains("SpecialToken");
    }
    if (add_bos && th.bos_id >= 0) th.flags |= format::tok_add_bos;
    th.payload_size = sec.payload.size();
    return sec;
}

} // namespace

tokenizer_section import_tokenizer_json(const std::string& tokenizer_json) {
    try {
        return import_checked(tokenizer_json);
    } catch (const json::exception& e) { // a value of an unexpected JSON type
        throw error(errc::format, tokenizer_json + ": " + e.what());
    }
}

} // namespace colibri
