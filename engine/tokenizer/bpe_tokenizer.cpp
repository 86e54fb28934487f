// Byte-level BPE (tokenizer kind 2): the pipeline of a Hugging Face tokenizer.json — added
// tokens, normalizer, pre-tokenizer, BPE model, decoder — read from the compact payload
// the converter writes (docs/model-format.md). Each step follows the reference library's
// semantics, including its order of operations, so that ids are identical.

#include "tokenizer/bpe_tokenizer.h"

#include "core/error.h"
#include "format/bpe_payload.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_merges.h"
#include "tokenizer/payload_reader.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_text.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace colibri {

namespace {

using namespace format::bpe;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are moved
// to U+0100 and up, so that every byte is one visible character.
struct byte_alphabet {
    static constexpr uint32_t max_cp = 0x144;
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[max_cp];

    byte_alphabet() {
        for (auto& b : cp_to_byte) b = -1;
        uint32_t shifted = 0;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
            byte_to_cp[b] = printable ? b : 256 + shifted++;
            cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
        }
    }
};

const byte_alphabet& alphabet() {
    static const byte_alphabet a;
    return a;
}

// The split pattern of the ByteLevel pre-tokenizer with use_regex (GPT-2's).
constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void replace_all(std::string& s, std::string_view from, std::string_view to) {
    if (from.empty()) return;
    size_t at = s.find(from);
    if (at == std::string::npos) return;
    std::string out;
    size_t last = 0;
    for (; at != std::string::npos; at = s.find(from, last)) {
        out.append(s, last, at - last);
        out += to;
        last = at + from.size();
    }
    out.append(s, last);
    s = std::move(out);
}

// "<0xAB>" -> 0xAB; -1 for anything else.
int byte_token_value(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int v = 0;
    for (size_t i = 3; i < 5; ++i) {
        const char c = t[i];
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

struct normalizer_step {
    normalizer_op op;
    std::unique_ptr<unicode::normalizer> form; // nfc .. nfkd
    std::string pattern, content;              // prepend: content; replace: both
};

struct split_step {
    regex re;
    split_behaviour behaviour;
    bool invert;
};

struct decoder_step {
    decoder_op op;
    std::string pattern, content; // replace: both; strip: content
    uint32_t start = 0, stop = 0; // strip
};

// Ids of words seen before: most words of a text repeat (keywords, identifiers, common
// English), and a hit skips the merge loop. Shared by all threads that encode; bounded
// (full means no more inserts, as in the reference library).
class word_cache {
public:
    static constexpr size_t max_entries = 1 << 16;
    static constexpr size_t max_word = 48; // bytes; longer words are not cached

    bool find(std::string_view word, std::vector<int32_t>& out) const {
        std::shared_lock lock(mutex_);
        auto it = map_.find(word);
        if (it == map_.end()) return false;
        out.insert(out.end(), it->second.begin(), it->second.end());
        return true;
    }
    void insert(std::string_view word, const std::vector<int32_t>& ids) {
        std::unique_lock lock(mutex_);
        if (map_.size() < max_entries) map_.emplace(word, ids);
    }

private:
    struct hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    mutable std::shared_mutex mutex_;
    std::unordered_map<std::string, std::vector<int32_t>, hash, std::equal_to<>> map_;
};

struct span_t {
    size_t begin, end;
};

// Working memory of one encode call.
struct encode_state {
    regex_scratch scratch;
    std::string normalized, tmp;
    std::vector<span_t> pieces, next_pieces, acc;
    std::vector<std::pair<span_t, bool>> matches;
    std::vector<int32_t> word;
    merge_scratch merge;
    std::string mapped;                      // the text in the byte-level alphabet
    std::vector<uint32_t> mapped_at, raw_at; // byte offsets from the text to it and back
    special_tokens specials = special_tokens::as_text;
};

class bpe_tokenizer final : public tokenizer {
public:
    bpe_tokenizer(std::span<const uint8_t> payload, const format::tokenizer_header& th, uint32_t n_vocab,
                  const std::string& where) {
        payload_reader r(payload, where + ": tokenizer section");
        read(r, n_vocab);
        bos_ = th.bos_id;
        eos_ = th.eos_id;
        add_bos_ = (th.flags & format::tok_add_bos) != 0;
        fim_suffix_first_ = (th.flags & format::tok_fim_spm) != 0;
        strips_leading_space_ = false;
        for (const auto& d : decoders_) {
            if (d.op == decoder_op::strip && d.content == " " && d.start >= 1) strips_leading_space_ = true;
            if (d.op == decoder_op::byte_level) replaces_maximal_subparts_ = true;
        }
    }

    void encode(std::string_view text, std::vector<int32_t>& out, special_tokens specials) const override {
        // The reference takes Unicode strings: ill-formed UTF-8 is read as U+FFFD, the way
        // Python's bytes.decode(errors="replace") reads it.
        std::string clean;
        if (!unicode::is_valid_utf8(text)) {
            unicode::append_utf8_lossy(clean, text);
            text = clean;
        }
        encode_state st;
        st.specials = specials;
        raw_added_[size_t(specials)].split(
            text, [&](std::string_view seg) { encode_segment(seg, st, out); }, [&](int32_t id) { out.push_back(id); });
    }

    std::string decode(std::span<const int32_t> ids) const override {
        std::vector<std::string> toks;
        toks.reserve(ids.size());
        for (const int32_t id : ids) {
            if (const std::string_view* t = decodable(id)) toks.emplace_back(*t);
        }
        if (decoders_.empty()) { // the reference joins undecoded tokens with spaces
            std::string s;
            for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
            return s;
        }
        for (const auto& d : decoders_) run_decoder(d, toks);
        std::string s;
        for (const auto& t : toks) s += t;
        return s;
    }

    void append_bytes(int32_t id, std::string& out) const override {
        if (id < 0 || id >= n_tokens_) return;
        out.append(stream_pool_, stream_offsets_[id], stream_offsets_[id + 1] - stream_offsets_[id]);
    }

    std::string piece(int32_t id) const override {
        if (id < 0 || id >= n_tokens_) return {};
        if (added_index_[id] >= 0) return added_content_[added_index_[id]];
        return std::string(token_at(id));
    }
    bool is_control(int32_t id) const override {
        return id < 0 || id >= n_tokens_ ||
               (added_index_[id] >= 0 ? added_special_[added_index_[id]] : token_at(id).empty());
    }
    int32_t piece_to_id(std::string_view p) const override {
        if (auto it = added_by_content_.find(std::string(p)); it != added_by_content_.end()) return it->second;
        auto it = vocab_.find(p);
        return it == vocab_.end() ? -1 : it->second;
    }
    int32_t n_vocab() const override { return n_tokens_; }

private:
    void read(payload_reader& r, uint32_t n_vocab);
    // Adds an added token to the matchers of the modes that match it: text never becomes a
    // special token, nor one that only its spelling shows to be a control token.
    void add_matched(added_token_matcher (&m)[2], std::string_view content, added_token_matcher::token t) const {
        const int32_t a = added_index_[size_t(t.id)];
        if (!added_special_[size_t(a)] && !looks_special(added_content_[size_t(a)])) {
            m[size_t(special_tokens::as_text)].add(content, t);
        }
        m[size_t(special_tokens::parsed)].add(content, t);
    }
    void read_steps(payload_reader& r);

    std::string_view token_at(int32_t id) const {
        return std::string_view(pool_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
    }
    // The string a decoder sees for an id; nullptr for ids that decode to nothing.
    const std::string_view* decodable(int32_t id) const {
        if (id < 0 || id >= n_tokens_) return nullptr;
        const int32_t a = added_index_[id];
        if (a >= 0) return added_special_[a] ? nullptr : &added_views_[a];
        return token_views_[id].empty() ? nullptr : &token_views_[id];
    }
    std::string byte_level_bytes(std::string_view t) const;
    std::string stream_bytes(int32_t id) const;
    void run_decoder(const decoder_step& d, std::vector<std::string>& toks) const;

    void normalize(std::string& s, std::string& tmp) const;
    void encode_segment(std::string_view seg, encode_state& st, std::vector<int32_t>& out) const;
    void encode_pieces(std::string_view text, encode_state& st, std::vector<int32_t>& out) const;
    void apply_split(const split_step& step, std::string_view text, encode_state& st) const;
    void encode_word(std::string_view word, encode_state& st, std::vector<int32_t>& out) const;
    int32_t lookup(std::string_view s) const {
        auto it = vocab_.find(s);
        return it == vocab_.end() ? -1 : it->second;
    }

    int32_t n_tokens_ = 0;
    uint32_t model_flags_ = 0;
    int32_t unk_id_ = -1;
    std::string pool_;              // every model token's bytes, id after id
    std::vector<uint32_t> offsets_; // [n_tokens + 1] into pool_
    std::vector<std::string_view> token_views_;
    std::unordered_map<std::string_view, int32_t> vocab_; // model vocabulary only
    merge_table merges_;
    mutable word_cache cache_;

    std::vector<int32_t> added_index_; // [n_tokens] index into added_*, or -1
    std::vector<std::string> added_content_;
    std::vector<std::string_view> added_views_;
    std::vector<bool> added_special_;
    std::unordered_map<std::string, int32_t> added_by_content_;
    // Added tokens matched whole in the text, [special_tokens]: as_text, the non-special
    // ones only (text never becomes a control token); parsed, all of them.
    added_token_matcher raw_added_[2], normalized_added_[2];

    std::vector<normalizer_step> normalizers_;
    std::vector<split_step> splits_;
    // Steps from this one on see the text in the byte-level alphabet, as the reference runs
    // the steps after a ByteLevel pre-tokenizer (Falcon's Digits after it)
    size_t mapped_from_ = SIZE_MAX;
    bool byte_level_ = false;
    std::vector<decoder_step> decoders_;

    // What append_bytes gives for each id, computed at load so that streaming a token is
    // one copy with no allocation.
    std::string stream_pool_;
    std::vector<uint32_t> stream_offsets_; // [n_tokens + 1] into stream_pool_

    int32_t byte_char_ids_[256];     // byte-level: id of each byte's character, or -1
    int32_t byte_fallback_ids_[256]; // id of "<0xXX>", or -1
    int32_t ascii_ids_[128];         // id of each one-byte character, or -1
};

void bpe_tokenizer::read(payload_reader& r, uint32_t n_vocab) {
    if (r.u32("magic") != magic) r.fail("not a BPE payload (wrong magic)");
    if (const uint32_t v = r.u32("version"); v != version) {
        r.fail("unsupported BPE payload version " + std::to_string(v));
    }
    model_flags_ = r.u32("model flags");
    if ((model_flags_ & ~model_flags_known) != 0) r.fail("unknown model flags " + std::to_string(model_flags_));
    unk_id_ = r.i32("unk_id");
    const uint32_t n = r.count("n_tokens", 4);
    if (n == 0 || n > n_vocab) {
        r.fail("n_tokens " + std::to_string(n) + " is not in 1..n_vocab (" + std::to_string(n_vocab) + ")");
    }
    n_tokens_ = static_cast<int32_t>(n);
    if (unk_id_ < -1 || unk_id_ >= n_tokens_)
        r.fail("unk_id " + std::to_string(unk_id_) + " is outside the vocabulary");

    offsets_.reserve(n + 1);
    pool_.reserve(r.left());
    for (uint32_t i = 0; i < n; ++i) {
        const std::string_view t = r.str("token");
        if (!unicode::is_valid_utf8(t)) r.fail("token " + std::to_string(i) + " is not UTF-8");
        offsets_.push_back(static_cast<uint32_t>(pool_.size()));
        pool_ += t;
    }
    offsets_.push_back(static_cast<uint32_t>(pool_.size()));
    token_views_.resize(n);
    vocab_.reserve(n);
    for (int32_t i = 0; i < n_tokens_; ++i) {
        token_views_[i] = token_at(i);
        if (token_views_[i].empty()) continue; // no model token with this id
        if (!vocab_.emplace(token_views_[i], i).second) {
            r.fail("token " + std::to_string(i) + " repeats an earlier token");
        }
    }

    const uint32_t n_merges = r.count("n_merges", 12);
    merges_ = merge_table(n_merges);
    auto model_id = [&](uint32_t id, const char* what) {
        if (id >= n || token_views_[id].empty()) {
            r.fail(std::string("merge ") + what + " id " + std::to_string(id) + " is not a model token");
        }
        return static_cast<int32_t>(id);
    };
    for (uint32_t k = 0; k < n_merges; ++k) {
        const int32_t left = model_id(r.u32("merge"), "left");
        const int32_t right = model_id(r.u32("merge"), "right");
        const int32_t merged = model_id(r.u32("merge"), "result");
        merges_.insert(left, right, k, merged);
    }

    const uint32_t n_added = r.count("n_added", 12);
    added_index_.assign(n, -1);
    std::vector<std::pair<std::string, added_token_matcher::token>> normalized_pending;
    for (uint32_t k = 0; k < n_added; ++k) {
        const uint32_t id = r.u32("added token id");
        const uint32_t flags = r.u32("added token flags");
        const std::string_view content = r.str("added token content");
        if (id >= n) r.fail("added token id " + std::to_string(id) + " is outside the vocabulary");
        if ((flags & ~added_flags_known) != 0) r.fail("unknown added token flags " + std::to_string(flags));
        if (content.empty() || !unicode::is_valid_utf8(content))
            r.fail("added token " + std::to_string(id) + " has no valid text");
        if (added_index_[id] >= 0) r.fail("added token id " + std::to_string(id) + " appears twice");
        added_index_[id] = static_cast<int32_t>(added_content_.size());
        added_content_.emplace_back(content);
        added_special_.push_back((flags & added_special) != 0);
        added_by_content_.emplace(content, static_cast<int32_t>(id));
        const added_token_matcher::token t{static_cast<int32_t>(id), (flags & added_lstrip) != 0,
                                           (flags & added_rstrip) != 0};
        if (flags & added_normalized) normalized_pending.emplace_back(content, t);
        else add_matched(raw_added_, content, t);
    }
    for (const auto& c : added_content_) added_views_.emplace_back(c);

    read_steps(r);
    // Tokens matched in normalised text are themselves normalised first, as the reference
    // does (a Prepend normalizer, for one, changes them).
    for (auto& [content, t] : normalized_pending) {
        std::string tmp;
        normalize(content, tmp);
        add_matched(normalized_added_, content, t);
    }
    if (!r.at_end()) r.fail(std::to_string(r.left()) + " unexpected bytes after the last field");

    const auto& ab = alphabet();
    for (int b = 0; b < 256; ++b) {
        std::string ch;
        unicode::append_utf8(ch, ab.byte_to_cp[b]);
        byte_char_ids_[b] = lookup(ch);
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        byte_fallback_ids_[b] = lookup(name);
    }
    for (int c = 0; c < 128; ++c) ascii_ids_[c] = lookup(std::string(1, static_cast<char>(c)));

    stream_offsets_.reserve(n + 1);
    for (int32_t id = 0; id < n_tokens_; ++id) {
        stream_offsets_.push_back(static_cast<uint32_t>(stream_pool_.size()));
        stream_pool_ += stream_bytes(id);
    }
    stream_offsets_.push_back(static_cast<uint32_t>(stream_pool_.size()));
}

// The bytes one id stands for inside a text: the decoder's per-token steps (Replace,
// ByteFallback, ByteLevel) on its own; Fuse changes nothing for one token and Strip
// acts only at the start of a text, which text_stream handles.
std::string bpe_tokenizer::stream_bytes(int32_t id) const {
    const std::string_view* t = decodable(id);
    if (t == nullptr) return {};
    std::string s(*t);
    for (const auto& d : decoders_) {
        switch (d.op) {
        case decoder_op::replace: replace_all(s, d.pattern, d.content); break;
        case decoder_op::byte_fallback:
            if (const int b = byte_token_value(s); b >= 0) s.assign(1, static_cast<char>(b));
            break;
        case decoder_op::byte_level: s = byte_level_bytes(s); break;
        case decoder_op::fuse:
        case decoder_op::strip: break;
        }
    }
    return s;
}

void bpe_tokenizer::read_steps(payload_reader& r) {
    auto flag = [&](const char* field) {
        const uint32_t v = r.u32(field);
        if (v > 1) r.fail(std::string(field) + " is " + std::to_string(v) + ", expected 0 or 1");
        return v == 1;
    };
    auto compile = [&](std::string_view pattern) {
        try {
            return regex(pattern);
        } catch (const error& e) {
            r.fail(e.what());
        }
    };

    const uint32_t n_norm = r.count("n_normalizers", 4);
    for (uint32_t k = 0; k < n_norm; ++k) {
        normalizer_step s;
        s.op = static_cast<normalizer_op>(r.u32("normalizer"));
        switch (s.op) {
        case normalizer_op::nfc: s.form = std::make_unique<unicode::normalizer>(unicode::normal_form::nfc); break;
        case normalizer_op::nfd: s.form = std::make_unique<unicode::normalizer>(unicode::normal_form::nfd); break;
        case normalizer_op::nfkc: s.form = std::make_unique<unicode::normalizer>(unicode::normal_form::nfkc); break;
        case normalizer_op::nfkd: s.form = std::make_unique<unicode::normalizer>(unicode::normal_form::nfkd); break;
        case normalizer_op::prepend: s.content = r.str("prepend"); break;
        case normalizer_op::replace:
            s.pattern = r.str("replace pattern");
            s.content = r.str("replace content");
            if (s.pattern.empty()) r.fail("normalizer replace with an empty pattern");
            break;
        default: r.fail("unknown normalizer " + std::to_string(static_cast<uint32_t>(s.op)));
        }
        normalizers_.push_back(std::move(s));
    }

    const uint32_t n_pre = r.count("n_pre_tokenizers", 4);
    for (uint32_t k = 0; k < n_pre; ++k) {
        const auto op = static_cast<pre_tokenizer_op>(r.u32("pre-tokenizer"));
        switch (op) {
        case pre_tokenizer_op::split: {
            const std::string_view pattern = r.str("split pattern");
            const uint32_t behaviour = r.u32("split behaviour");
            if (behaviour > static_cast<uint32_t>(split_behaviour::contiguous)) {
                r.fail("unknown split behaviour " + std::to_string(behaviour));
            }
            const bool invert = flag("split invert");
            splits_.push_back({compile(pattern), static_cast<split_behaviour>(behaviour), invert});
            break;
        }
        case pre_tokenizer_op::byte_level: {
            if (flag("byte_level add_prefix_space")) {
                throw error(errc::unsupported,
                            "tokenizer: ByteLevel pre-tokenizer with add_prefix_space is not supported");
            }
            if (flag("byte_level use_regex"))
                splits_.push_back({compile(gpt2_pattern), split_behaviour::isolated, false});
            if (!byte_level_) mapped_from_ = splits_.size();
            byte_level_ = true;
            break;
        }
        case pre_tokenizer_op::digits:
            splits_.push_back(
                {compile(flag("digits individual") ? R"(\p{N})" : R"(\p{N}+)"), split_behaviour::isolated, false});
            break;
        default: r.fail("unknown pre-tokenizer " + std::to_string(static_cast<uint32_t>(op)));
        }
    }

    const uint32_t n_dec = r.count("n_decoders", 4);
    for (uint32_t k = 0; k < n_dec; ++k) {
        decoder_step d;
        d.op = static_cast<decoder_op>(r.u32("decoder"));
        switch (d.op) {
        case decoder_op::byte_level:
        case decoder_op::byte_fallback:
        case decoder_op::fuse: break;
        case decoder_op::replace:
            d.pattern = r.str("decoder replace pattern");
            d.content = r.str("decoder replace content");
            if (d.pattern.empty()) r.fail("decoder replace with an empty pattern");
            break;
        case decoder_op::strip:
            d.content = r.str("strip content");
            d.start = r.u32("strip start");
            d.stop = r.u32("strip stop");
            if (d.content.empty() ||
                unicode::char_length(static_cast<unsigned char>(d.content[0])) != d.content.size() ||
                !unicode::is_valid_utf8(d.content)) {
                r.fail("strip content is not one character");
            }
            break;
        default: r.fail("unknown decoder " + std::to_string(static_cast<uint32_t>(d.op)));
        }
        decoders_.push_back(std::move(d));
    }
}

// ---- encoding -------------------------------------------------------------------------

void bpe_tokenizer::normalize(std::string& s, std::string& tmp) const {
    for (const auto& n : normalizers_) {
        switch (n.op) {
        case normalizer_op::prepend:
            if (!s.empty()) s.insert(0, n.content);
            break;
        case normalizer_op::replace: replace_all(s, n.pattern, n.content); break;
        default:
            n.form->normalize(s, tmp);
            s.swap(tmp);
            break;
        }
    }
}

void bpe_tokenizer::encode_segment(std::string_view seg, encode_state& st, std::vector<int32_t>& out) const {
    if (!normalizers_.empty()) {
        st.normalized.assign(seg);
        normalize(st.normalized, st.tmp);
        seg = st.normalized;
    }
    normalized_added_[size_t(st.specials)].split(
        seg, [&](std::string_view text) { encode_pieces(text, st, out); }, [&](int32_t id) { out.push_back(id); });
}

void bpe_tokenizer::encode_pieces(std::string_view text, encode_state& st, std::vector<int32_t>& out) const {
    st.pieces.assign(1, {0, text.size()});
    size_t k = 0;
    for (; k < splits_.size() && k < mapped_from_; ++k) apply_split(splits_[k], text, st);
    if (k < splits_.size()) {
        // the rest on the byte-level text; a piece may then end inside a character's bytes
        const auto& ab = alphabet();
        st.mapped.clear();
        st.mapped_at.resize(text.size() + 1);
        for (size_t i = 0; i < text.size(); ++i) {
            st.mapped_at[i] = static_cast<uint32_t>(st.mapped.size());
            unicode::append_utf8(st.mapped, ab.byte_to_cp[static_cast<unsigned char>(text[i])]);
        }
        st.mapped_at[text.size()] = static_cast<uint32_t>(st.mapped.size());
        st.raw_at.assign(st.mapped.size() + 1, 0);
        for (size_t i = 0; i <= text.size(); ++i) st.raw_at[st.mapped_at[i]] = static_cast<uint32_t>(i);
        for (span_t& p : st.pieces) p = {st.mapped_at[p.begin], st.mapped_at[p.end]};
        for (; k < splits_.size(); ++k) apply_split(splits_[k], st.mapped, st);
        for (span_t& p : st.pieces) p = {st.raw_at[p.begin], st.raw_at[p.end]};
    }
    for (const span_t& p : st.pieces) encode_word(text.substr(p.begin, p.end - p.begin), st, out);
}

// One split step over every current piece, with the reference's delimiter behaviours.
void bpe_tokenizer::apply_split(const split_step& step, std::string_view text, encode_state& st) const {
    st.next_pieces.clear();
    for (const span_t& p : st.pieces) {
        const std::string_view sub = text.substr(p.begin, p.end - p.begin);
        auto& m = st.matches;
        m.clear();
        size_t prev = 0, pos = 0, b = 0, e = 0;
        while (pos <= sub.size() && step.re.find(st.scratch, sub, pos, b, e)) {
            if (prev != b) m.push_back({{prev, b}, false});
            m.push_back({{b, e}, true});
            prev = e;
            if (e > b) pos = e;
            else if (e < sub.size()) pos = e + unicode::char_length(static_cast<unsigned char>(sub[e]));
            else break;
        }
        if (prev != sub.size()) m.push_back({{prev, sub.size()}, false});
        if (step.invert) {
            for (auto& x : m) x.second = !x.second;
        }
        auto& acc = st.acc;
        acc.clear();
        bool previous_match = false;
        switch (step.behaviour) {
        case split_behaviour::removed:
            for (const auto& [r, is_match] : m) {
                if (!is_match) acc.push_back(r);
            }
            break;
        case split_behaviour::isolated:
            for (const auto& x : m) acc.push_back(x.first);
            break;
        case split_behaviour::merged_with_previous:
            for (const auto& [r, is_match] : m) {
                if (is_match && !previous_match && !acc.empty()) acc.back().end = r.end;
                else acc.push_back(r);
                previous_match = is_match;
            }
            break;
        case split_behaviour::merged_with_next:
            for (size_t i = m.size(); i-- > 0;) {
                const auto& [r, is_match] = m[i];
                if (is_match && !previous_match && !acc.empty()) acc.back().begin = r.begin;
                else acc.push_back(r);
                previous_match = is_match;
            }
            std::reverse(acc.begin(), acc.end());
            break;
        case split_behaviour::contiguous:
            for (const auto& [r, is_match] : m) {
                if (is_match == previous_match && !acc.empty()) acc.back().end = r.end;
                else acc.push_back(r);
                previous_match = is_match;
            }
            break;
        }
        for (const span_t& r : acc) {
            if (r.end > r.begin) st.next_pieces.push_back({p.begin + r.begin, p.begin + r.end});
        }
    }
    st.pieces.swap(st.next_pieces);
}

void bpe_tokenizer::encode_word(std::string_view w, encode_state& st, std::vector<int32_t>& out) const {
    if (w.empty()) return;
    const auto& ab = alphabet();
    if (model_flags_ & model_ignore_merges) { // a word in the vocabulary is taken whole
        std::string mapped;
        if (byte_level_) {
            for (const char c : w) unicode::append_utf8(mapped, ab.byte_to_cp[static_cast<unsigned char>(c)]);
        }
        if (const int32_t id = lookup(byte_level_ ? std::string_view(mapped) : w); id >= 0) {
            out.push_back(id);
            return;
        }
    }
    const bool cacheable = w.size() <= word_cache::max_word;
    if (cacheable && cache_.find(w, out)) return;
    auto& ids = st.word;
    ids.clear();
    bool pending_unk = false;
    std::string ch;
    // A character missing from the vocabulary: its bytes as <0xXX> tokens, else unk.
    auto unknown = [&](std::string_view c) {
        if (model_flags_ & model_byte_fallback) {
            bool all = true;
            for (const char b : c) all = all && byte_fallback_ids_[static_cast<unsigned char>(b)] >= 0;
            if (all) { // the reference does not flush a pending unk first; neither do we
                for (const char b : c) ids.push_back(byte_fallback_ids_[static_cast<unsigned char>(b)]);
                return;
            }
        }
        if (unk_id_ < 0) return; // dropped, as the reference does without an unk token
        if (pending_unk && !(model_flags_ & model_fuse_unk)) ids.push_back(unk_id_);
        pending_unk = true;
    };
    auto known = [&](int32_t id) {
        if (pending_unk) {
            ids.push_back(unk_id_);
            pending_unk = false;
        }
        ids.push_back(id);
    };
    if (byte_level_) {
        for (const char c : w) {
            const auto b = static_cast<unsigned char>(c);
            if (byte_char_ids_[b] >= 0) {
                known(byte_char_ids_[b]);
            } else {
                ch.clear();
                unicode::append_utf8(ch, ab.byte_to_cp[b]);
                unknown(ch);
            }
        }
    } else {
        for (size_t i = 0; i < w.size();) {
            const auto c = static_cast<unsigned char>(w[i]);
            const size_t len = unicode::char_length(c);
            const int32_t id = c < 0x80 ? ascii_ids_[c] : lookup(w.substr(i, len));
            if (id >= 0) known(id);
            else unknown(w.substr(i, len));
            i += len;
        }
    }
    if (pending_unk) ids.push_back(unk_id_);
    apply_merges(merges_, ids, st.merge);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) cache_.insert(w, ids);
}

// ---- decoding -------------------------------------------------------------------------

// A token's byte-level characters as bytes; a token with any other character is kept as
// its UTF-8 bytes (added tokens such as "<｜fim▁begin｜>").
std::string bpe_tokenizer::byte_level_bytes(std::string_view t) const {
    const auto& ab = alphabet();
    std::string bytes;
    bytes.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
        const uint32_t cp = unicode::next_code_point(t, i);
        if (cp >= byte_alphabet::max_cp || ab.cp_to_byte[cp] < 0) return std::string(t);
        bytes += static_cast<char>(ab.cp_to_byte[cp]);
    }
    return bytes;
}

void bpe_tokenizer::run_decoder(const decoder_step& d, std::vector<std::string>& toks) const {
    switch (d.op) {
    case decoder_op::byte_level: {
        std::string bytes;
        for (const auto& t : toks) bytes += byte_level_bytes(t);
        std::string text;
        unicode::append_utf8_lossy(text, bytes);
        toks.assign(1, std::move(text));
        break;
    }
    case decoder_op::replace:
        for (auto& t : toks) replace_all(t, d.pattern, d.content);
        break;
    case decoder_op::byte_fallback: {
        // Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one
        // U+FFFD per byte.
        std::vector<std::string> res;
        std::string run;
        size_t run_len = 0;
        auto flush = [&] {
            if (run_len == 0) return;
            if (unicode::is_valid_utf8(run)) res.push_back(run);
            else
                for (size_t k = 0; k < run_len; ++k) res.emplace_back("\xEF\xBF\xBD");
            run.clear();
            run_len = 0;
        };
        for (auto& t : toks) {
            if (const int b = byte_token_value(t); b >= 0) {
                run += static_cast<char>(b);
                ++run_len;
            } else {
                flush();
                res.push_back(std::move(t));
            }
        }
        flush();
        toks.swap(res);
        break;
    }
    case decoder_op::fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
    }
    case decoder_op::strip:
        for (auto& t : toks) {
            size_t b = 0, e = t.size();
            for (uint32_t k = 0; k < d.start && t.compare(b, d.content.size(), d.content) == 0 && b < e; ++k)
                b += d.content.size();
            for (uint32_t k = 0; k < d.stop && e >= b + d.content.size() &&
                                 t.compare(e - d.content.size(), d.content.size(), d.content) == 0;
                 ++k) {
                e -= d.content.size();
            }
            t = t.substr(b, e - b);
        }
        break;
    }
}

} // namespace

std::unique_ptr<tokenizer> make_bpe_tokenizer(std::span<const uint8_t> payload, const format::tokenizer_header& th,
                                              uint32_t n_vocab, const std::string& where) {
    return std::make_unique<bpe_tokenizer>(payload, th, n_vocab, where);
}

} // namespace colibri
