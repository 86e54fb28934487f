#pragma once
// The one list of model families: how each is recognised (Hugging Face architecture, GGUF
// general.architecture), how its checkpoint names its MoE block, and which blocks and
// settings it uses. The converters, the loader's messages and the tests iterate it; the
// runtime itself reads only the flat hyperparameters the converters derive from it.

#include "format/format.h"

#include <span>
#include <string>
#include <string_view>

namespace colibri {

/// How a Hugging Face checkpoint names its MoE block; "{e}" stands for the expert index.
struct hf_moe_names {
    std::string_view prefix;      ///< under model.layers.N.
    std::string_view router;      ///< under prefix
    std::string_view expert_gate; ///< per-expert names under prefix; empty: fused (Granite)
    std::string_view expert_up;
    std::string_view expert_down;
    std::string_view n_expert_key; ///< config key of the expert count
    std::string_view n_ff_exp_key; ///< config key of one expert's width
};

/// A dense layer's feed-forward: SwiGLU or GeGLU (gate, up, down), or a GELU MLP (up, down).
enum class ffn_kind { swiglu, geglu, gelu_mlp };

struct family_info {
    format::arch arch;
    std::string_view hf_arch;   ///< config.json architectures[0]
    std::string_view gguf_arch; ///< general.architecture
    bool moe;                   ///< routed experts (a GGUF arch name may cover a dense and an MoE family)
    hf_moe_names hf_moe;        ///< empty for dense families
    format::qk_norm qk;         ///< q/k normalisation after projection
    bool norm_topk_default;      ///< renormalise the top-k weights when the config does not say
    bool norm_topk_configurable; ///< norm_topk_prob (HF) / expert_weights_norm (GGUF) is read
    bool shared_expert;          ///< a shared expert with a sigmoid gate (Qwen2-MoE)
    bool granite_scales;         ///< embedding, residual, attention and logit multipliers
    bool gguf_permuted_qk;       ///< llama.cpp's converter reordered q/k rows for interleaved RoPE
    // Dense blocks beyond Llama's (StarCoder2)
    bool layer_norm = false;           ///< LayerNorm with bias (HF: norm_epsilon), not RMSNorm
    ffn_kind ffn = ffn_kind::swiglu;   ///< the dense feed-forward
    uint32_t sliding_window = 0;       ///< the window every checkpoint of the family has, where a GGUF omits it
    // Gemma's blocks
    bool sandwich_norm = false;   ///< norms after the attention and the FFN too (HF: pre_/post_feedforward_layernorm)
    bool norm_plus_one = false;   ///< HF's RMSNorm multiplies by (1 + w): the converter stores 1 + w
    bool embed_scale_sqrt = false; ///< embeddings scaled by sqrt(n_embd)
    uint32_t swa_pattern = 0;     ///< local/global layer pattern where a GGUF omits it (llama.cpp's value)
    float rope_theta_swa = 0;     ///< the windowed layers' RoPE base where a GGUF omits it
    uint32_t gguf_wide_query_layers = 0; ///< llama.cpp scales queries by 1/sqrt(n_embd / n_head) for the
                                         ///< model of this many layers (the 27B), else by 1/sqrt(head_dim)
    // DeepSeek-V2's blocks
    bool mla = false;                    ///< multi-head latent attention (q/kv low-rank projections, latent cache)
    bool ungated_shared_experts = false; ///< n_shared_experts experts of the routed width, weight 1 (mlp.shared_experts)

    std::string_view name() const { return format::arch_name(arch); }
    /// The dense feed-forward's matrices under model.layers.N.mlp. (gate empty: none)
    std::string_view hf_gate() const { return ffn != ffn_kind::gelu_mlp ? "gate_proj" : ""; }
    std::string_view hf_up() const { return ffn != ffn_kind::gelu_mlp ? "up_proj" : "c_fc"; }
    std::string_view hf_down() const { return ffn != ffn_kind::gelu_mlp ? "down_proj" : "c_proj"; }
};

/// Every family, in the order of format::arch.
std::span<const family_info> families();
/// The family of a Hugging Face architecture; nullptr when none.
const family_info* find_hf_family(std::string_view hf_arch);
/// The family of a GGUF architecture with or without experts (the dense or the MoE family
/// of that name, else whichever there is); nullptr when none.
const family_info* find_gguf_family(std::string_view gguf_arch, bool has_experts);
/// "A, B, C": the Hugging Face or GGUF names, for messages.
std::string known_hf_architectures();
std::string known_gguf_architectures();

} // namespace colibri
