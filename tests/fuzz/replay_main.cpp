// Replays fuzz inputs through a target without libFuzzer: every file named on the command
// line, or found in a directory named there. The test suite's short pass over the corpus.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
    int n = 0;
    auto run = [&](const std::filesystem::path& p) {
        std::ifstream in(p, std::ios::binary);
        const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
        ++n;
    };
    for (int i = 1; i < argc; ++i) {
        const std::filesystem::path p(argv[i]);
        if (!std::filesystem::exists(p)) continue; // an empty corpus is not in git
        if (std::filesystem::is_directory(p)) {
            for (const auto& e : std::filesystem::directory_iterator(p)) {
                if (e.is_regular_file()) run(e.path());
            }
        } else {
            run(p);
        }
    }
    std::printf("%d inputs replayed\n", n);
    return n > 0 ? 0 : 1;
}
