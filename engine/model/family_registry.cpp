#include "model/family_registry.h"

#include "model/families/deepseek2.h"
#include "model/families/gemma2.h"
#include "model/families/gemma3.h"
#include "model/families/granite.h"
#include "model/families/granite_moe.h"
#include "model/families/llama.h"
#include "model/families/mixtral.h"
#include "model/families/olmoe.h"
#include "model/families/qwen2.h"
#include "model/families/qwen2_moe.h"
#include "model/families/qwen3.h"
#include "model/families/qwen3_moe.h"
#include "model/families/starcoder2.h"

#include <array>

namespace colibri {

namespace {

// in the order of format::arch
constexpr std::array<family_info, format::arch_max> table = {
    family::llama,       family::mixtral, family::qwen2_moe, family::qwen3_moe, family::olmoe,
    family::granite_moe, family::qwen2,   family::qwen3,     family::granite,   family::starcoder2,
    family::gemma3,      family::gemma2,  family::deepseek2,
};

template <class Name>
std::string joined(Name name) {
    std::string s;
    for (size_t i = 0; i < table.size(); ++i) {
        const std::string_view n = name(table[i]);
        bool seen = false; // a GGUF name two families share is listed once
        for (size_t j = 0; j < i; ++j) seen = seen || name(table[j]) == n;
        if (!seen) s += (s.empty() ? "" : ", ") + std::string(n);
    }
    return s;
}

} // namespace

std::span<const family_info> families() {
    static_assert(
        [] {
            for (uint32_t i = 0; i < table.size(); ++i) {
                if (static_cast<uint32_t>(table[i].arch) != i + 1) return false;
            }
            return true;
        }(),
        "the table follows format::arch");
    return table;
}

const family_info* find_hf_family(std::string_view hf_arch) {
    for (const family_info& f : table) {
        if (f.hf_arch == hf_arch) return &f;
    }
    return nullptr;
}

const family_info* find_gguf_family(std::string_view gguf_arch, bool has_experts) {
    const family_info* any = nullptr;
    for (const family_info& f : table) {
        if (f.gguf_arch != gguf_arch) continue;
        if (f.moe == has_experts) return &f;
        if (any == nullptr) any = &f;
    }
    return any;
}

std::string known_hf_architectures() {
    return joined([](const family_info& f) { return f.hf_arch; });
}

std::string known_gguf_architectures() {
    return joined([](const family_info& f) { return f.gguf_arch; });
}

} // namespace colibri
