// Fuzz target: a user's GGUF file through the reader, the vocabulary import and the
// conversion plan. Any input must end in a converted model or a colibri::error, never a
// crash, a hang or a sanitizer report.

#include "convert/convert.h"
#include "convert/gguf_file.h"
#include "convert/gguf_tokenizer.h"
#include "core/error.h"
#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    colibri::fuzz::input_file in(data, size);
    if (!in.ok()) return 0;
    try {
        const colibri::gguf_file f(in.path());
        const colibri::tokenizer_section sec = colibri::import_gguf_tokenizer(f);
        const auto tok = colibri::make_tokenizer(sec.header, sec.payload, sec.n_tokens, in.path());
        std::vector<int32_t> ids;
        tok->encode("def f(x):\n    return x <|endoftext|>", ids);
        (void)tok->decode(ids);
    } catch (const colibri::error&) {}
    // the whole conversion, into a file of this process's own (written, then renamed into place)
    static const std::string out = colibri::fuzz::scratch_path("fuzz-gguf.colibri");
    try {
        colibri::convert_gguf(in.path(), out, std::nullopt, {});
    } catch (const colibri::error&) {}
    return 0;
}
