#pragma once
// A session: the KV cache and every buffer the forward pass needs, sized once at
// creation. Evaluating tokens neither allocates nor throws once its arguments are valid.

#include "model/model.h"
#include "model/moe_routing.h"
#include "ops/backend.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace colibri {

/// Receives the routing decision of each token in each MoE layer (debugging aid).
struct route_observer {
    void (*fn)(void* user, int pos, int layer, const int32_t* experts, const float* weights, int k) = nullptr;
    void* user = nullptr;
};

class session {
public:
    /// Context length when none is asked for: the model's, at most this (a long trained
    /// context would otherwise cost gigabytes of KV cache per session).
    static constexpr uint32_t default_ctx = 4096;

    /// Most tokens per eval() call when none is asked for. A prompt is evaluated in batches of
    /// this many tokens: each batch reads every expert's weights once, so larger batches read
    /// them less often, and prefill of the benchmark shapes at 128 is 10-20% faster than at 32
    /// (no faster at 256 or 512). A prompt can be cancelled between layers of a batch.
    static constexpr int default_batch = 128;

    /// The context length a session asked for n_ctx gets (0: default_ctx or the model's, if shorter).
    static int context_length(const model& m, int n_ctx);

    /// n_ctx: KV cache length (see context_length); n_batch: most tokens per eval() call;
    /// all_logits: keep logits of every token of a batch, not only the last.
    session(const model& m, backend& be, int n_ctx, int n_batch = default_batch, bool all_logits = false);
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    /// Most drafted tokens a batch can verify: logit_rows of eval() goes up to max_draft + 1.
    static constexpr int max_draft = 8;

    /// Runs tokens [0, n) at positions n_past() .. n_past()+n-1 and appends them to the cache,
    /// with the logits of its last logit_rows tokens (every token's with all_logits).
    /// Throws colibri::error before computing anything when n exceeds the batch size, the
    /// context would overflow, or a token id is outside the vocabulary. `stop`, when set, is
    /// asked between layers: when it returns true the batch is abandoned and false returned,
    /// the history and logits as before the call (a 128-token batch takes about 0.1 s and a
    /// layer of it a few milliseconds; a decode step's layer a fraction of one). A one-token
    /// step the backend runs from a recording (backend::step_replay) is not abandoned.
    bool eval(const int32_t* tokens, int n, const std::function<bool()>& stop = {}, int logit_rows = 1);

    /// Logits of the last evaluated token [n_vocab], of the last batch's last logit_rows
    /// tokens [logit_rows][n_vocab], or of every token of the last batch [n][n_vocab] with
    /// all_logits.
    const float* logits() const { return logits_host_; }

    int n_past() const { return static_cast<int>(history_.size()); }
    /// The tokens whose keys and values are in the cache, in order.
    std::span<const int32_t> history() const { return history_; }
    int n_ctx() const { return n_ctx_; }
    int n_batch() const { return n_batch_; }
    /// Forgets cached positions from n on (n <= n_past()) and gives back the memory behind them.
    void truncate(int n);
    /// Bytes of KV cache one position takes (keys and values of every layer).
    size_t token_bytes() const;
    /// Bytes of keys and values a token at position pos reads: every layer's positions up to
    /// pos, or its sliding window's.
    size_t kv_bytes_read(int pos) const;
    /// Whether layer il attends through the sliding window.
    bool windowed(int il) const;
    void set_route_observer(route_observer obs) { observer_ = obs; }

    const model& get_model() const { return model_; }
    /// Bytes of every buffer the session allocated (the KV cache included), at most.
    size_t memory_bytes() const;

private:
    // The layers and the LM head on the batch already embedded in x_; false when stop()
    // abandoned it between layers.
    bool forward(int n, const std::function<bool()>& stop, int logit_rows);
    void attention_block(int il, int n);
    // The attention of attention_block into att_: grouped-query heads, or latent attention
    void grouped_attention(int il, int n);
    void latent_attention(int il, int n);
    rope_params rope_for(int il) const;
    // Layer il's cache and the batch's positions, for either attention
    attention_args cache_args(int il, int n) const;
    routing_rule routing() const;
    void ffn_block(int il, int n);
    void moe(const layer_weights& l, int n);
    // RMSNorm, or LayerNorm when the norm has a bias, of n rows of n_embd
    void norm(const float* x, const tensor_view& w, const tensor_view* bias, int n, float* out);
    // A dense layer's feed-forward: SwiGLU, or a GELU MLP when it has no gate
    void dense_ffn(const expert_weights& w, const float* x, int n, float* out);

    const model& model_;
    backend& be_;
    int n_ctx_, n_batch_;
    bool all_logits_;
    std::vector<int32_t> history_; // [n_past], capacity n_ctx
    route_observer observer_;

    // Activations, [n_batch, ...] each.
    std::unique_ptr<device_buffer> x_, xn_, q_, k_, v_, att_, o_, ffn_out_, hg_, hu_, yo_;
    std::unique_ptr<device_buffer> router_, shared_gate_, scratch_, logits_;
    std::unique_ptr<device_buffer> lat_q_, lat_att_, lat_kv_, q_pe_, q_a_; // latent attention's only
    std::unique_ptr<device_buffer> k_cache_, v_cache_; // [n_layer, kv_heads_, n_ctx, kv_row_]; no v_cache_ with
                                                       // latent attention (its values lead its keys' rows)
    uint32_t kv_heads_ = 0, kv_row_ = 0;
    bool kv_f16_ = false; // the caches hold f16, else f32
    size_t kv_elem_bytes() const { return kv_f16_ ? 2 : 4; }
    int high_water_ = 0; // cache positions [0, high_water_) may hold memory

    // Host-side bookkeeping for routing, sized at creation.
    std::vector<int32_t> pos_;          // [n_batch]
    std::vector<int32_t> sel_;          // [n_batch, n_expert_used] chosen experts
    std::vector<float> sel_w_;          // [n_batch, n_expert_used] their weights
    std::vector<int32_t> expert_begin_; // [n_expert + 1] offsets into order_
    std::vector<int32_t> order_;        // [n_batch * n_expert_used] token*k + slot, grouped by expert
    std::vector<int32_t> rows_;         // moe: the token of each grouped pair, then each token's terms
    std::vector<float> terms_w_;        // moe: the weight of each token's terms
    std::vector<int32_t> terms_n_;      // moe: [n_batch] each token's terms so far
    std::vector<float> probs_;          // [n_expert]
    std::vector<ffn_job> ffn_jobs_;     // the feed-forwards run together, capacity n_expert+1
    // Where the host reads the logits and the router's outputs (the buffers themselves on
    // a host backend, copies on a device's)
    const float* logits_host_ = nullptr;
    std::vector<float> logits_staging_, router_staging_, gate_staging_;
};

} // namespace colibri
