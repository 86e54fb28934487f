#pragma once
// A loaded model: the validated file plus typed views of every weight, per layer.

#include "format/model_file.h"
#include "ops/backend.h"

#include <array>
#include <memory>
#include <string>
#include <vector>

namespace colibri {

/// A latent-attention layer's projections (DeepSeek-V2; tensor_names.h).
struct mla_weights {
    const tensor_view* q_a = nullptr; // null: queries straight from the input (no q_lora_rank)
    const tensor_view* q_a_norm = nullptr;
    const tensor_view* q_nope = nullptr;
    const tensor_view* q_pe = nullptr;
    const tensor_view* kv_a = nullptr;
    const tensor_view* kv_a_norm = nullptr;
    const tensor_view* k_pe = nullptr;
    const tensor_view* k_b = nullptr;
    const tensor_view* v_b = nullptr;
};

struct layer_weights {
    const tensor_view* attn_norm = nullptr;
    const tensor_view* attn_norm_bias = nullptr; // LayerNorm only
    const tensor_view* wq = nullptr;             // null with latent attention
    const tensor_view* wk = nullptr;
    const tensor_view* wv = nullptr;
    const tensor_view* wo = nullptr;
    const tensor_view* bo = nullptr; // optional biases
    const tensor_view* bq = nullptr;
    const tensor_view* bk = nullptr;
    const tensor_view* bv = nullptr;
    const tensor_view* q_norm = nullptr; // optional
    const tensor_view* k_norm = nullptr;
    const tensor_view* ffn_norm = nullptr;
    const tensor_view* ffn_norm_bias = nullptr;  // LayerNorm only
    const tensor_view* attn_post_norm = nullptr; // sandwich norms only
    const tensor_view* ffn_post_norm = nullptr;
    const tensor_view* router = nullptr;      // null: dense layer
    std::vector<expert_weights> experts;      // [n_expert]
    expert_weights shared;                    // shared expert, when n_ff_shexp > 0
    const tensor_view* shared_gate = nullptr; // [1, n_embd], with flag_shared_expert_gate
    expert_weights dense;                     // dense FFN of a dense layer
    mla_weights mla;                          // latent attention's projections
    bool is_moe() const { return router != nullptr; }
    /// Every tensor but the routed experts' (null entries for those the layer lacks).
    std::array<const tensor_view*, 35> shared_tensors() const {
        return {attn_norm,
                attn_norm_bias,
                wq,
                wk,
                wv,
                wo,
                bo,
                bq,
                bk,
                bv,
                q_norm,
                k_norm,
                ffn_norm,
                ffn_norm_bias,
                attn_post_norm,
                ffn_post_norm,
                router,
                shared.gate,
                shared.up,
                shared.down,
                shared_gate,
                dense.gate,
                dense.up,
                dense.down,
                dense.up_bias,
                dense.down_bias,
                mla.q_a,
                mla.q_a_norm,
                mla.q_nope,
                mla.q_pe,
                mla.kv_a,
                mla.kv_a_norm,
                mla.k_pe,
                mla.k_b,
                mla.v_b};
    }
};

class model {
public:
    /// Loads and fully validates; throws colibri::error naming the file and what is wrong.
    explicit model(const std::string& path);

    const model_file& file() const { return file_; }
    const format::hparams& hp() const { return file_.hp(); }
    const tensor_view& token_embd() const { return *token_embd_; }
    const tensor_view& output_norm() const { return *output_norm_; }
    const tensor_view* output_norm_bias() const { return output_norm_bias_; } ///< LayerNorm only
    const tensor_view& output() const { return *output_; }
    /// RoPE frequency divisors [rope_dim / 2] (rope_dim: head_dim without latent attention);
    /// null without RoPE scaling.
    const tensor_view* rope_freqs() const { return rope_freqs_; }
    const std::vector<layer_weights>& layers() const { return layers_; }

    uint64_t n_params() const { return n_params_; }
    uint64_t n_params_active() const { return n_params_active_; }
    /// Bytes of weights one decoded token reads: every layer's attention, norms and router,
    /// as many experts as it selects (of their average size), shared and dense
    /// feed-forwards, its embedding row, the output norm and the LM head.
    double decode_weight_bytes() const;

private:
    /// What dtypes a tensor may have.
    enum class kind { matrix, vector, router, small }; // small: f32 or f16 (latent attention's per-head matrices)
    const tensor_view* require(const std::string& name, std::initializer_list<uint64_t> shape, kind k) const;
    const tensor_view* optional(const std::string& name, std::initializer_list<uint64_t> shape, kind k) const;
    void load_mla(int il, mla_weights& m) const;
    void count_params();

    model_file file_;
    const tensor_view* token_embd_ = nullptr;
    const tensor_view* output_norm_ = nullptr;
    const tensor_view* output_norm_bias_ = nullptr;
    const tensor_view* output_ = nullptr;
    const tensor_view* rope_freqs_ = nullptr;
    std::vector<layer_weights> layers_;
    uint64_t n_params_ = 0;
    uint64_t n_params_active_ = 0;
};

} // namespace colibri
