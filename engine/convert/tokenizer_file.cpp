#include "convert/tokenizer_file.h"

#include "convert/bpe_import.h"
#include "convert/gguf_file.h"
#include "convert/gguf_tokenizer.h"
#include "core/error.h"
#include "format/model_file.h"

#include <cstring>
#include <fstream>
#include <sys/stat.h>

namespace colibri {

std::unique_ptr<tokenizer> load_tokenizer_file(const std::string& path) {
    // a directory opens as a stream that reads nothing: name it (a missing file is named below)
    if (struct stat st{}; ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        throw error(errc::io, path + ": not a regular file" + (S_ISDIR(st.st_mode) ? " (it is a directory)" : ""));
    if (is_gguf_file(path)) {
        const gguf_file f(path);
        const tokenizer_section sec = import_gguf_tokenizer(f);
        return make_tokenizer(sec.header, sec.payload, sec.n_tokens, path);
    }
    if (path.ends_with(".json")) {
        const tokenizer_section sec = import_tokenizer_json(path);
        return make_tokenizer(sec.header, sec.payload, sec.n_tokens, path);
    }
    if (std::ifstream in(path, std::ios::binary); in) {
        char m[sizeof format::magic] = {};
        if (!in.read(m, sizeof m) || std::memcmp(m, format::magic, sizeof m) != 0)
            throw error(errc::format,
                        path + ": neither a GGUF file, a Hugging Face tokenizer.json nor a .colibri model");
    }
    const model_file mf(path); // reports a file it cannot open
    return make_tokenizer(mf);
}

} // namespace colibri
