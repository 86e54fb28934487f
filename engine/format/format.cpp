#include "format/format.h"

#include <array>

namespace colibri::format {

namespace {
constexpr std::array<std::string_view, dtype_count> dtype_names = {"f32", "f16", "bf16", "q8_0",
                                                                   "q4_0"};
constexpr std::array<std::string_view, arch_max + 1> arch_names = {
    "unknown", "llama", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granite_moe"};
} // namespace

std::string_view dtype_name(dtype t) {
    auto i = static_cast<uint32_t>(t);
    return i < dtype_count ? dtype_names[i] : "unknown";
}

bool parse_dtype(std::string_view name, dtype& out) {
    for (uint32_t i = 0; i < dtype_count; ++i) {
        if (dtype_names[i] == name) {
            out = static_cast<dtype>(i);
            return true;
        }
    }
    return false;
}

uint64_t row_bytes(dtype t, uint64_t n) {
    switch (t) {
    case dtype::f32: return 4 * n;
    case dtype::f16:
    case dtype::bf16: return 2 * n;
    case dtype::q8_0: return n % qk ? 0 : n / qk * sizeof(block_q8_0);
    case dtype::q4_0: return n % qk ? 0 : n / qk * sizeof(block_q4_0);
    }
    return 0;
}

bool is_quantized(dtype t) { return t == dtype::q8_0 || t == dtype::q4_0; }

std::string_view arch_name(arch a) {
    auto i = static_cast<uint32_t>(a);
    return i <= arch_max ? arch_names[i] : "unknown";
}

} // namespace colibri::format
