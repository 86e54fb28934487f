#include "model/family_registry.h"

#include <array>

namespace colibri {

using format::arch;
using format::qk_norm;

namespace {

constexpr hf_moe_names dense{};
constexpr hf_moe_names per_expert_mlp(std::string_view n_expert_key, std::string_view n_ff_exp_key) {
    return {"mlp", "gate.weight", "experts.{e}.gate_proj.weight", "experts.{e}.up_proj.weight",
            "experts.{e}.down_proj.weight", n_expert_key, n_ff_exp_key};
}

// arch, HF architecture, GGUF architecture, moe, HF MoE names, q/k norm, norm_topk default,
// norm_topk configurable, shared expert, Granite scales, GGUF q/k permuted
constexpr std::array<family_info, format::arch_max> table = {{
    {arch::llama, "LlamaForCausalLM", "llama", false, dense, qk_norm::none, false, false, false, false, true},
    {arch::mixtral, "MixtralForCausalLM", "llama", true,
     {"block_sparse_moe", "gate.weight", "experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight",
      "num_local_experts", "intermediate_size"},
     qk_norm::none, true, false, false, false, true},
    {arch::qwen2_moe, "Qwen2MoeForCausalLM", "qwen2moe", true, per_expert_mlp("num_experts", "moe_intermediate_size"),
     qk_norm::none, false, true, true, false, false},
    {arch::qwen3_moe, "Qwen3MoeForCausalLM", "qwen3moe", true, per_expert_mlp("num_experts", "moe_intermediate_size"),
     qk_norm::per_head, true, true, false, false, false},
    {arch::olmoe, "OlmoeForCausalLM", "olmoe", true, per_expert_mlp("num_experts", "intermediate_size"), qk_norm::full,
     false, true, false, false, false},
    {arch::granite_moe, "GraniteMoeForCausalLM", "granitemoe", true,
     {"block_sparse_moe", "router.layer.weight", "", "", "", "num_local_experts", "intermediate_size"}, qk_norm::none,
     true, false, false, true, true},
    {arch::qwen2, "Qwen2ForCausalLM", "qwen2", false, dense, qk_norm::none, false, false, false, false, false},
    {arch::qwen3, "Qwen3ForCausalLM", "qwen3", false, dense, qk_norm::per_head, false, false, false, false, false},
    {arch::granite, "GraniteForCausalLM", "granite", false, dense, qk_norm::none, false, false, false, true, true},
    {arch::starcoder2, "Starcoder2ForCausalLM", "starcoder2", false, dense, qk_norm::none, false, false, false, false, false,
     true, ffn_kind::gelu_mlp, 4096},
    {arch::gemma3, "Gemma3ForCausalLM", "gemma3", false, dense, qk_norm::per_head, false, false, false, false, false,
     false, ffn_kind::geglu, 0, true, true, true, 6, 10000.0f, 62},
    {arch::gemma2, "Gemma2ForCausalLM", "gemma2", false, dense, qk_norm::none, false, false, false, false, false,
     false, ffn_kind::geglu, 0, true, true, true, 2, 0.0f, 46},
    {.arch = arch::deepseek2, .hf_arch = "DeepseekV2ForCausalLM", .gguf_arch = "deepseek2", .moe = true,
     .hf_moe = per_expert_mlp("n_routed_experts", "moe_intermediate_size"), .qk = qk_norm::none,
     .norm_topk_default = false, .norm_topk_configurable = true, .shared_expert = false, .granite_scales = false,
     .gguf_permuted_qk = false, .mla = true, .ungated_shared_experts = true},
}};

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
    static_assert([] {
        for (uint32_t i = 0; i < table.size(); ++i) {
            if (static_cast<uint32_t>(table[i].arch) != i + 1) return false;
        }
        return true;
    }(), "the table follows format::arch");
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
