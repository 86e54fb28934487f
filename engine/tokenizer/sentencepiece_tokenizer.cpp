// Sentencepiece tokenizer: the payload is the serialized ModelProto, loaded as is.

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <sentencepiece_processor.h>

namespace colibri {

namespace {

class sentencepiece_tokenizer final : public tokenizer {
public:
    sentencepiece_tokenizer(const format::tokenizer_header& th, std::span<const uint8_t> payload, uint32_t n_vocab,
                            const std::string& where) {
        sentencepiece::util::Status status;
        try { // the library reports some malformed models (an empty piece) by throwing
            status = sp_.LoadFromSerializedProto(
                std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
        } catch (const std::exception& e) {
            throw error(errc::format, where + ": tokenizer section: " + e.what());
        }
        if (!status.ok()) {
            throw error(errc::format, where + ": tokenizer section: " + status.ToString());
        }
        if (sp_.GetPieceSize() > static_cast<int>(n_vocab)) {
            throw error(errc::format, where + ": tokenizer has " + std::to_string(sp_.GetPieceSize()) +
                                          " pieces, more than the model's vocabulary of " + std::to_string(n_vocab));
        }
        bos_ = th.bos_id;
        eos_ = th.eos_id;
        add_bos_ = (th.flags & format::tok_add_bos) != 0;
        fim_suffix_first_ = (th.flags & format::tok_fim_spm) != 0;
        // decode drops the leading space only of a model that adds one (add_dummy_prefix):
        // its encoding of "a" starts with U+2581
        std::vector<std::string> probe;
        strips_leading_space_ = sp_.Encode("a", &probe).ok() && !probe.empty() && probe[0].starts_with("\xE2\x96\x81");
        for (int id = 0; id < sp_.GetPieceSize(); ++id) {
            if (sp_.IsControl(id)) controls_.add(sp_.IdToPiece(id), {id, false, false});
            if (!sp_.IsControl(id) && !sp_.IsUnknown(id) && looks_special(sp_.IdToPiece(id)))
                spelled_out_.push_back(id);
        }
    }

    // Sentencepiece itself never matches a control piece in text. Parsed, the text is cut
    // at control pieces and each stretch encoded on its own, as the reference's slow
    // tokenizer does.
    void encode(std::string_view text, std::vector<int32_t>& out, special_tokens specials) const override {
        if (specials == special_tokens::as_text) {
            const size_t first = out.size();
            encode_text(text, out);
            if (!spelled_out_.empty()) spell_out_control_like(out, first);
            return;
        }
        controls_.split(
            text, [&](std::string_view seg) { encode_text(seg, out); }, [&](int32_t id) { out.push_back(id); });
    }

    std::string decode(std::span<const int32_t> ids) const override {
        std::vector<int> v;
        v.reserve(ids.size());
        for (int32_t id : ids) {
            if (id >= 0 && id < sp_.GetPieceSize()) v.push_back(id); // ids past the pieces: padding
        }
        std::string text;
        const auto status = sp_.Decode(v, &text);
        if (!status.ok()) throw error(errc::invalid_argument, "tokenizer: " + status.ToString());
        return text;
    }

    void append_bytes(int32_t id, std::string& out) const override {
        if (id < 0 || id >= sp_.GetPieceSize() || sp_.IsControl(id)) return;
        if (sp_.IsUnknown(id)) {
            out += " \xE2\x81\x87 "; // " ⁇ ", as sentencepiece decodes <unk>
            return;
        }
        const std::string& p = sp_.IdToPiece(id);
        if (sp_.IsByte(id)) { // "<0xAB>"
            out += static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16));
            return;
        }
        static constexpr std::string_view space = "\xE2\x96\x81"; // U+2581
        for (size_t i = 0; i < p.size();) {
            if (p.compare(i, space.size(), space) == 0) {
                out += ' ';
                i += space.size();
            } else {
                out += p[i++];
            }
        }
    }

    std::string piece(int32_t id) const override {
        return id >= 0 && id < sp_.GetPieceSize() ? sp_.IdToPiece(id) : std::string();
    }
    bool is_control(int32_t id) const override { return id < 0 || id >= sp_.GetPieceSize() || sp_.IsControl(id); }
    int32_t piece_to_id(std::string_view piece) const override {
        const int id = sp_.PieceToId(piece);
        return id == sp_.unk_id() && piece != sp_.IdToPiece(id) ? -1 : id;
    }
    int32_t n_vocab() const override { return sp_.GetPieceSize(); }

private:
    // Sentencepiece matches user-defined pieces in text, FIM tokens among them
    // (`<fim_prefix>`): from `first` on, each piece that looks special is replaced by its
    // text, one character piece (or byte piece) at a time.
    void spell_out_control_like(std::vector<int32_t>& ids, size_t first) const {
        std::vector<int32_t> rest(ids.begin() + std::ptrdiff_t(first), ids.end());
        ids.resize(first);
        for (const int32_t id : rest) {
            if (!std::binary_search(spelled_out_.begin(), spelled_out_.end(), id)) {
                ids.push_back(id);
                continue;
            }
            const std::string p = sp_.IdToPiece(id);
            for (size_t i = 0; i < p.size();) {
                const size_t len = std::min(p.size() - i, unicode::char_length(static_cast<unsigned char>(p[i])));
                const int ch = sp_.PieceToId(p.substr(i, len));
                if (ch != sp_.unk_id() && !sp_.IsControl(ch)) {
                    ids.push_back(ch);
                } else {
                    for (size_t b = i; b < i + len; ++b) {
                        char name[8];
                        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(p[b]));
                        const int byte = sp_.PieceToId(name);
                        ids.push_back(sp_.IsByte(byte) ? byte : sp_.unk_id());
                    }
                }
                i += len;
            }
        }
    }

    void encode_text(std::string_view text, std::vector<int32_t>& out) const {
        std::vector<int> ids;
        const auto status = sp_.Encode(text, &ids);
        if (!status.ok()) throw error(errc::invalid_argument, "tokenizer: " + status.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
    }

    sentencepiece::SentencePieceProcessor sp_;
    added_token_matcher controls_;     // every control piece, for special_tokens::parsed
    std::vector<int32_t> spelled_out_; // pieces that look special (not control ones), ascending
};

} // namespace

std::unique_ptr<tokenizer> make_tokenizer(const format::tokenizer_header& th, std::span<const uint8_t> payload,
                                          uint32_t n_vocab, const std::string& where) {
    switch (static_cast<format::tokenizer_kind>(th.kind)) {
    case format::tokenizer_kind::sentencepiece:
        return std::make_unique<sentencepiece_tokenizer>(th, payload, n_vocab, where);
    case format::tokenizer_kind::bpe: return make_bpe_tokenizer(payload, th, n_vocab, where);
    }
    throw error(errc::format, where + ": unknown tokenizer kind");
}

std::unique_ptr<tokenizer> make_tokenizer(const model_file& file) {
    return make_tokenizer(file.tokenizer(), file.tokenizer_payload(), file.hp().n_vocab, file.path());
}

} // namespace colibri
