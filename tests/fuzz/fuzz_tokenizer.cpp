// Fuzz target: the tokenizers on arbitrary bytes, as `colibri tokenize` and every prompt
// take them: sentencepiece (the default model's) and byte-level BPE (Qwen3's) encode the
// input with special tokens as text and parsed, decode the ids back, stream them, and
// decode the input read as ids. Any input must give ids within the vocabulary and text:
// never a crash, a hang or a sanitizer report.

#include "convert/bpe_import.h"
#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

using namespace colibri;

namespace {

std::vector<std::unique_ptr<tokenizer>> load() {
    std::vector<std::unique_ptr<tokenizer>> t;
    const model_file m(COLIBRI_SOURCE_DIR "/models/default.colibri");
    t.push_back(make_tokenizer(m));
    const std::string json = COLIBRI_FIXTURES_DIR "/tokenizers/qwen3/tokenizer.json";
    const tokenizer_section sec = import_tokenizer_json(json);
    t.push_back(make_tokenizer(sec.header, sec.payload, sec.n_tokens, json));
    return t;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::vector<std::unique_ptr<tokenizer>> tokenizers = load();
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    for (const auto& tok : tokenizers) {
        for (special_tokens sp : {special_tokens::as_text, special_tokens::parsed}) {
            std::vector<int32_t> ids;
            tok->encode(text, ids, sp);
            for (int32_t id : ids) {
                if (id < 0 || id >= tok->n_vocab()) std::abort();
            }
            text_stream stream(*tok, true);
            std::string streamed;
            for (int32_t id : ids) streamed += stream.push(id);
            streamed += stream.flush();
            if (streamed != tok->decode(ids)) std::abort(); // the pieces concatenate to the text
        }
        // the input as ids (any value, in range or not, is refused or decoded)
        std::vector<int32_t> ids(size / 4);
        if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
        for (int32_t& id : ids) id = int32_t(uint32_t(id) % uint32_t(tok->n_vocab()));
        (void)tok->decode(ids);
        std::string bytes;
        for (int32_t id : ids) tok->append_bytes(id, bytes);
    }
    return 0;
}
