// Sentencepiece tokenizer: the payload is the serialized ModelProto, loaded as is.

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

namespace colibri {

namespace {

class sentencepiece_tokenizer final : public tokenizer {
public:
    sentencepiece_tokenizer(const format::tokenizer_header& th, std::span<const uint8_t> payload, uint32_t n_vocab,
                            const std::string& where) {
        const auto status = sp_.LoadFromSerializedProto(
            std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
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
    }

    void encode(std::string_view text, std::vector<int32_t>& out) const override {
        std::vector<int> ids;
        const auto status = sp_.Encode(text, &ids);
        if (!status.ok()) throw error(errc::invalid_argument, "tokenizer: " + status.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
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
    bool is_control(int32_t id) const override {
        return id < 0 || id >= sp_.GetPieceSize() || sp_.IsControl(id);
    }
    int32_t piece_to_id(std::string_view piece) const override {
        const int id = sp_.PieceToId(piece);
        return id == sp_.unk_id() && piece != sp_.IdToPiece(id) ? -1 : id;
    }
    int32_t n_vocab() const override { return sp_.GetPieceSize(); }

private:
    sentencepiece::SentencePieceProcessor sp_;
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
