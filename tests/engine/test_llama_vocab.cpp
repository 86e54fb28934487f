// llama.cpp's tokenizer suites: vocabulary-only GGUF files with texts (.inp) and the ids
// Hugging Face tokenizers gives for them (.out), from scripts/fetch-llama-vocab. Each is
// imported as a user's GGUF would be and must give the reference ids for every text.

#include "convert/gguf_file.h"
#include "convert/gguf_tokenizer.h"
#include "convert/tokenizer_file.h"
#include "generate/fim.h"
#include "tokenizer/tokenizer.h"

#include <cstdlib>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace colibri;

namespace {

std::string llama_vocab_dir() {
    if (const char* d = std::getenv("COLIBRI_LLAMA_VOCAB")) return d;
    if (const char* c = std::getenv("COLIBRI_CACHE")) return std::string(c) + "/llama-vocab";
    if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/colibri/llama-vocab";
    const char* home = std::getenv("HOME");
    return std::string(home != nullptr ? home : "/") + "/.cache/colibri/llama-vocab";
}

std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The suite's texts: each ends with the separator line (the last one may not).
std::vector<std::string> texts_of(const std::string& inp) {
    static constexpr std::string_view sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> out;
    size_t at = 0;
    while (at < inp.size()) {
        const size_t end = inp.find(sep, at);
        out.emplace_back(inp.substr(at, end == std::string::npos ? std::string::npos : end - at));
        if (end == std::string::npos) break;
        at = end + sep.size();
    }
    return out;
}

// One line of space-separated ids per text.
std::vector<std::vector<int32_t>> ids_of(const std::string& out) {
    std::vector<std::vector<int32_t>> all;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
        std::istringstream words(line);
        std::vector<int32_t> ids;
        for (int32_t id; words >> id;) ids.push_back(id);
        all.push_back(std::move(ids));
    }
    return all;
}

} // namespace

TEST_CASE("llama.cpp's tokenizer suites: every BPE and sentencepiece vocabulary gives the reference ids") {
    const std::filesystem::path dir = llama_vocab_dir();
    if (!std::filesystem::exists(dir / "VERSION")) {
        MESSAGE("no llama.cpp vocabularies in " << dir.string()
                                                << " (scripts/fetch-llama-vocab fetches them): skipped");
        return;
    }
    int n_vocabs = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::filesystem::path gguf = entry.path();
        if (gguf.extension() != ".gguf" || !std::filesystem::exists(gguf.string() + ".inp")) continue;
        CAPTURE(gguf.filename().string());
        const gguf_file f(gguf.string());
        if (f.get_string("tokenizer.ggml.model").value_or("") == "bert")
            continue; // WordPiece: neither BPE nor sentencepiece
        const tokenizer_section sec = import_gguf_tokenizer(f);
        const auto tok = make_tokenizer(sec.header, sec.payload, sec.n_tokens, gguf.string());
        const std::vector<std::string> texts = texts_of(read_text(gguf.string() + ".inp"));
        const std::vector<std::vector<int32_t>> want = ids_of(read_text(gguf.string() + ".out"));
        REQUIRE(texts.size() == want.size());
        REQUIRE(texts.size() >= 40);
        int mismatches = 0;
        for (size_t i = 0; i < texts.size(); ++i) {
            std::vector<int32_t> ids;
            tok->encode(texts[i], ids); // as llama.cpp's test: user text, no BOS
            if (ids != want[i]) {
                ++mismatches;
                CAPTURE(texts[i]);
                CHECK(ids == want[i]);
            }
        }
        MESSAGE(gguf.filename().string() << ": " << texts.size() - size_t(mismatches) << " of " << texts.size()
                                         << " texts");
        ++n_vocabs;
    }
    CHECK(n_vocabs >= 14); // every one with a suite in llama-cpp-python 0.3.36 but the WordPiece bert-bge
}

TEST_CASE("the code models' GGUF vocabularies give their fill-in-the-middle family") {
    const std::filesystem::path dir = llama_vocab_dir();
    if (!std::filesystem::exists(dir / "VERSION")) {
        MESSAGE("no llama.cpp vocabularies in " << dir.string()
                                                << " (scripts/fetch-llama-vocab fetches them): skipped");
        return;
    }
    const std::pair<const char*, fim_kind> cases[] = {
        {"ggml-vocab-qwen2.gguf", fim_kind::none}, // Qwen1.5's vocabulary, from before the FIM tokens
        {"ggml-vocab-starcoder.gguf", fim_kind::starcoder}, {"ggml-vocab-deepseek-coder.gguf", fim_kind::deepseek},
        {"ggml-vocab-llama-bpe.gguf", fim_kind::none},      {"ggml-vocab-llama-spm.gguf", fim_kind::none},
    };
    for (const auto& [name, kind] : cases) {
        CAPTURE(std::string(name));
        CHECK(fim_kind_name(detect_fim(*load_tokenizer_file((dir / name).string())).kind) == fim_kind_name(kind));
    }
}
