// `colibri tokenize`: text -> token ids and back, with the tokenizer of a .colibri file, a
// GGUF file or a Hugging Face tokenizer.json, for comparing with other implementations.

#include "tools/tokenize_cmd.h"

#include "command_line.hpp"
#include "convert/tokenizer_file.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace po = boost::program_options;

namespace colibri {

namespace {

std::vector<int32_t> parse_id_list(const std::string& s) {
    std::vector<int32_t> ids;
    std::string item;
    std::stringstream in(s);
    while (in >> std::ws && std::getline(in, item, ',')) {
        size_t used = 0;
        long v = -1;
        try {
            v = std::stol(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
        if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
            throw error(errc::invalid_argument, "--decode: '" + item + "' is not a token id");
        }
        ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
}

} // namespace

int tokenize_main(int argc, char** argv) {
    std::string path, text, text_file, decode;
    po::options_description opts("colibri tokenize: text to token ids and back\n\n"
                                 "  colibri tokenize --model M --text T         ids of T, comma-separated\n"
                                 "  colibri tokenize --model M < file           ids of standard input\n"
                                 "  colibri tokenize --model M --decode 1,2,3   the text of ids\n\n"
                                 "M is a .colibri file, a GGUF file or a Hugging Face tokenizer.json.\n\nOptions");
    // clang-format off
    opts.add_options()
        ("help,h", "show this help")
        ("model,m", po::value(&path), "tokenizer source: .colibri, .gguf or tokenizer.json")
        ("text,t", po::value(&text), "the text to encode (default: standard input)")
        ("file,f", po::value(&text_file), "encode the contents of FILE")
        ("decode,d", po::value(&decode), "comma-separated ids to decode instead")
        ("bos", "start with the BOS token when the tokenizer adds one to prompts")
        ("pieces", "print one 'id<TAB>piece' line per token instead of the id list")
        ("parse-special", "text that spells a special token (<|endoftext|>) becomes that token, as Hugging Face "
                          "tokenizers and llama.cpp's tokenizer tests read it; by default it is encoded as text");
    // clang-format on
    po::variables_map vm;
    if (const int status = cli::parse(argc, argv, "colibri tokenize", opts, vm); status >= 0) return status;
    if (path.empty()) return cli::usage_error("colibri tokenize", "--model is required");
    try {
        const auto tok = load_tokenizer_file(path);
        if (vm.count("decode")) {
            const std::string out = tok->decode(parse_id_list(decode));
            std::fwrite(out.data(), 1, out.size(), stdout);
            std::fputc('\n', stdout);
            return 0;
        }
        if (!text_file.empty()) {
            std::ifstream in(text_file, std::ios::binary);
            if (!in) throw error(errc::io, text_file + ": cannot open");
            text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        } else if (!vm.count("text")) {
            std::stringstream ss;
            ss << std::cin.rdbuf();
            text = ss.str();
        }
        std::vector<int32_t> ids;
        if (vm.count("bos") && tok->add_bos() && tok->bos_id() >= 0) ids.push_back(tok->bos_id());
        tok->encode(text, ids, vm.count("parse-special") ? special_tokens::parsed : special_tokens::as_text);
        if (vm.count("pieces")) {
            for (int32_t id : ids) std::printf("%d\t%s\n", id, tok->piece(id).c_str());
        } else {
            for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? ",%d" : "%d", ids[i]);
            std::printf("\n");
        }
        std::fprintf(stderr, "%zu tokens\n", ids.size());
    } catch (const std::exception& e) {
        std::cerr << "colibri tokenize: " << e.what() << "\n";
        return 1;
    }
    return 0;
}

} // namespace colibri
