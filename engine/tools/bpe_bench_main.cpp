// colibri-bpe-bench: single-threaded encode throughput of the BPE tokenizer on a text file.
//   colibri-bpe-bench <tokenizer.json> <text file> [repeats]
//   colibri-bpe-bench <tokenizer.json> --ids <text file>...
// The second form prints, for each file encoded whole, "<tokens> <checksum> <file>" (what
// tests/reference/compare_bpe.py compares with the reference library).
// Two modes: the whole file in one encode() call, and the file cut at line ends into
// chunks of at least 4096 bytes, one call each (prompt-sized inputs). Prints MB/s (best
// of the repeats), the token count and a checksum of the ids, to compare with
// tests/reference/bench_bpe.py on the same file.

#include "convert/bpe_import.h"
#include "convert/convert.h"
#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: colibri-bpe-bench <tokenizer.json> <text file> [repeats]\n");
        return 2;
    }
    try {
        if (std::string(argv[2]) == "--ids") {
            const colibri::tokenizer_section sec = colibri::import_tokenizer_json(argv[1]);
            const auto tok = colibri::make_bpe_tokenizer(sec.payload, sec.header, sec.n_tokens, argv[1]);
            for (int i = 3; i < argc; ++i) {
                const std::vector<uint8_t> bytes = colibri::read_file_bytes(argv[i]);
                std::vector<int32_t> ids;
                tok->encode(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), ids);
                uint64_t checksum = 0;
                for (size_t k = 0; k < ids.size(); ++k) checksum += uint64_t(uint32_t(ids[k])) * (k + 1);
                std::printf("%zu %llu %s\n", ids.size(), static_cast<unsigned long long>(checksum), argv[i]);
            }
            return 0;
        }
        const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
        const auto t_load = std::chrono::steady_clock::now();
        const colibri::tokenizer_section sec = colibri::import_tokenizer_json(argv[1]);
        const auto t_import = std::chrono::steady_clock::now();
        const auto tok = colibri::make_bpe_tokenizer(sec.payload, sec.header, sec.n_tokens, argv[1]);
        const auto t_ready = std::chrono::steady_clock::now();
        const std::vector<uint8_t> bytes = colibri::read_file_bytes(argv[2]);
        const std::string text(bytes.begin(), bytes.end());

        std::vector<std::string_view> chunks;
        for (size_t begin = 0, i = 0; i < text.size(); ++i) {
            if ((text[i] == '\n' && i + 1 - begin >= 4096) || i + 1 == text.size()) {
                chunks.push_back(std::string_view(text).substr(begin, i + 1 - begin));
                begin = i + 1;
            }
        }
        auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
        std::printf("tokenizer   %s (json import %.0f ms, payload %zu bytes, load %.0f ms)\n", argv[1],
                    ms(t_load, t_import), sec.payload.size(), ms(t_import, t_ready));
        std::printf("text        %s, %zu bytes, %zu chunks\n", argv[2], text.size(), chunks.size());
        for (const bool whole : {true, false}) {
            double best = 1e30;
            std::vector<int32_t> ids;
            for (int r = 0; r < repeats; ++r) {
                ids.clear();
                const auto t0 = std::chrono::steady_clock::now();
                if (whole) {
                    tok->encode(text, ids);
                } else {
                    for (const auto c : chunks) tok->encode(c, ids);
                }
                best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            uint64_t checksum = 0;
            for (size_t i = 0; i < ids.size(); ++i) checksum += uint64_t(uint32_t(ids[i])) * (i + 1);
            std::printf("%-11s %zu tokens, checksum %llu, %.1f ms best of %d, %.2f MB/s (1 thread)\n",
                        whole ? "whole" : "chunks", ids.size(), static_cast<unsigned long long>(checksum), best * 1e3,
                        repeats, double(text.size()) / best / 1e6);
        }
        return 0;
    } catch (const colibri::error& e) {
        std::fprintf(stderr, "colibri-bpe-bench: %s\n", e.what());
        return 1;
    }
}
