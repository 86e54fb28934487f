#pragma once
// Helpers shared by the engine tests.

#include "convert/convert.h"
#include "model/family_registry.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace colibri::test {

/// Where the committed reference fixtures live: the source tree's, or COLIBRI_FIXTURES_DIR
/// when set (test binaries carried to another machine).
inline std::string fixtures_dir() {
    const char* dir = std::getenv("COLIBRI_FIXTURES_DIR");
    return dir != nullptr ? dir : COLIBRI_FIXTURES_DIR;
}
inline std::string fixture(const std::string& rel) { return fixtures_dir() + "/" + rel; }

/// Every registered family's name (each has a fixture of that name), or only the MoE ones.
inline std::vector<std::string> family_names(bool moe_only = false) {
    std::vector<std::string> out;
    for (const family_info& f : families()) {
        if (!moe_only || f.moe) out.emplace_back(f.name());
    }
    return out;
}

/// Fixtures of settings beyond a family's own fixture: scaled RoPE (llama3, YaRN).
inline const std::vector<std::string> rope_fixtures = {"llama3", "qwen2_yarn"};

/// Every family's fixture, then the settings'.
inline std::vector<std::string> conformance_fixtures() {
    std::vector<std::string> out = family_names();
    out.insert(out.end(), rope_fixtures.begin(), rope_fixtures.end());
    return out;
}

/// A fresh directory removed with its contents at scope exit.
class temp_dir {
public:
    temp_dir() {
        std::random_device rd;
        path_ =
            std::filesystem::temp_directory_path() / ("colibri-test-" + std::to_string(rd()) + std::to_string(rd()));
        std::filesystem::create_directories(path_);
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    std::filesystem::path path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// A small random-weight MoE shape with the fixture tokenizer: 2 layers, n_embd 64,
/// 4 heads (2 KV), 4 experts top-2, vocabulary 512.
inline random_model_options small_random_model() {
    random_model_options o;
    o.n_layer = 2;
    o.n_embd = 64;
    o.n_head = 4;
    o.n_head_kv = 2;
    o.head_dim = 16;
    o.n_expert = 4;
    o.n_expert_used = 2;
    o.n_ff_exp = 32;
    o.n_vocab = 512;
    o.n_ctx = 128;
    o.tokenizer_model = fixture("tokenizer/tokenizer.model");
    return o;
}

template <class T>
std::vector<T> read_array(const std::string& path) {
    const auto bytes = read_bytes(path);
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
}

} // namespace colibri::test
