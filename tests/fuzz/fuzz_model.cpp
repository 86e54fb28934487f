// Fuzz target: a .colibri file through the loader (header, sections, tensor directory,
// hyperparameters, every tensor's shape and type) and its tokenizer. Any input must load
// or end in a colibri::error, never a crash or a sanitizer report. Before loading, the
// header's file size and the checksums are made to match the bytes, so that mutations
// reach what lies behind them (a real file's corruption is refused by those checks).

#include "core/crc32.h"
#include "core/error.h"
#include "format/format.h"
#include "fuzz_input.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <cstring>
#include <vector>

namespace {

void match_checksums(std::vector<uint8_t>& bytes) {
    using namespace colibri::format;
    if (bytes.size() < header_size) return;
    header h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    h.file_size = bytes.size();
    for (section* s : {&h.tokenizer, &h.tensors}) {
        if (s->offset <= bytes.size() && s->size <= bytes.size() - s->offset) {
            s->crc32 = colibri::crc32(bytes.data() + s->offset, s->size);
        }
    }
    h.header_crc32 = 0;
    h.header_crc32 = colibri::crc32(&h, sizeof(h));
    std::memcpy(bytes.data(), &h, sizeof(h));
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<uint8_t> bytes(data, data + size);
    match_checksums(bytes);
    colibri::fuzz::input_file in(bytes.data(), bytes.size());
    if (!in.ok()) return 0;
    try {
        const colibri::model m(in.path());
        const auto tok = colibri::make_tokenizer(m.file());
        std::vector<int32_t> ids;
        tok->encode("def f(x):\n    return x", ids);
        (void)tok->decode(ids);
        (void)m.decode_weight_bytes();
    } catch (const colibri::error&) {}
    return 0;
}
