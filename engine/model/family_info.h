#pragma once
// What describes a model family: how it is recognised, how its checkpoint names its MoE
// block, the blocks its layers are built from, and the settings its files may leave out.
// Each family's own file in families/ fills one in; family_registry.cpp lists them.

#include "format/format.h"

#include <cstdint>
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

/// The experts' names of most MoE checkpoints: mlp.gate, mlp.experts.{e}.{gate,up,down}_proj.
constexpr hf_moe_names per_expert_mlp(std::string_view n_expert_key, std::string_view n_ff_exp_key) {
    return {"mlp",
            "gate.weight",
            "experts.{e}.gate_proj.weight",
            "experts.{e}.up_proj.weight",
            "experts.{e}.down_proj.weight",
            n_expert_key,
            n_ff_exp_key};
}

/// Attention: grouped-query (or multi-head) over per-head cached keys and values, or
/// DeepSeek-V2's multi-head latent attention over one cached latent row per position.
enum class attention_kind { grouped, latent };

/// The norms: RMSNorm; RMSNorm whose Hugging Face weights multiply by (1 + w), stored as
/// 1 + w (Gemma); LayerNorm with a bias (StarCoder2).
enum class norm_kind { rms, rms_plus_one, layer_norm };

/// A dense layer's feed-forward: SwiGLU or GeGLU (gate, up, down), or a GELU MLP (up, down).
enum class ffn_kind { swiglu, geglu, gelu_mlp };

/// Shared experts beside the routed ones: none; one with a sigmoid gate (Qwen2-MoE,
/// mlp.shared_expert); n_shared_experts of the routed width at weight 1 (DeepSeek,
/// mlp.shared_experts).
enum class shared_experts_kind { none, gated, ungated };

/// The blocks a family's layers are built from. The converters turn them into the flat
/// hyperparameters (format::hparams) from which the forward pass composes each layer.
struct family_blocks {
    attention_kind attention = attention_kind::grouped;
    format::qk_norm qk = format::qk_norm::none; ///< q/k normalisation after projection
    norm_kind norm = norm_kind::rms;
    bool sandwich_norm = false; ///< norms after the attention and the FFN too (Gemma)
    ffn_kind ffn = ffn_kind::swiglu;
    shared_experts_kind shared_experts = shared_experts_kind::none;

    bool latent_attention() const { return attention == attention_kind::latent; }
    bool layer_norm() const { return norm == norm_kind::layer_norm; }
    bool norm_plus_one() const { return norm == norm_kind::rms_plus_one; }
};

struct family_info {
    format::arch arch;
    std::string_view hf_arch;   ///< config.json architectures[0]
    std::string_view gguf_arch; ///< general.architecture
    bool moe = false;           ///< routed experts (a GGUF arch name may cover a dense and an MoE family)
    hf_moe_names hf_moe = {};   ///< empty for dense families
    family_blocks blocks = {};
    // routing
    bool norm_topk_default = false;      ///< renormalise the top-k weights when the config does not say
    bool norm_topk_configurable = false; ///< norm_topk_prob (HF) / expert_weights_norm (GGUF) is read
    // scale factors
    bool granite_scales = false;   ///< embedding, residual, attention and logit multipliers (Granite)
    bool embed_scale_sqrt = false; ///< embeddings scaled by sqrt(n_embd) (Gemma)
    // what a GGUF file leaves out or stores differently
    bool gguf_permuted_qk = false;       ///< llama.cpp's converter reordered q/k rows for interleaved RoPE
    uint32_t sliding_window = 0;         ///< the window every checkpoint of the family has
    bool hf_window_key = false;          ///< config.json's sliding_window, when set, is a window on every layer
    uint32_t swa_pattern = 0;            ///< local/global layer pattern (llama.cpp's value)
    float rope_theta_swa = 0;            ///< the windowed layers' RoPE base
    uint32_t gguf_wide_query_layers = 0; ///< llama.cpp scales queries by 1/sqrt(n_embd / n_head) for the
                                         ///< model of this many layers (the 27B), else by 1/sqrt(head_dim)

    std::string_view name() const { return format::arch_name(arch); }
    /// The dense feed-forward's matrices under model.layers.N.mlp. (gate empty: none)
    std::string_view hf_gate() const { return blocks.ffn != ffn_kind::gelu_mlp ? "gate_proj" : ""; }
    std::string_view hf_up() const { return blocks.ffn != ffn_kind::gelu_mlp ? "up_proj" : "c_fc"; }
    std::string_view hf_down() const { return blocks.ffn != ffn_kind::gelu_mlp ? "down_proj" : "c_proj"; }
};

} // namespace colibri
