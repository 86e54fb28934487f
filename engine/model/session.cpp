// The decoder forward pass, written once for every family on top of the backend ops:
// the session's buffers and cache, and each layer's attention (attention_block.cpp) and
// feed-forward (ffn_block.cpp). Families differ only by hyperparameters and flags (format.h).

#include "model/session.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace colibri {

using namespace format;

int session::context_length(const model& m, int n_ctx) {
    return n_ctx > 0 ? n_ctx : static_cast<int>(std::min<uint32_t>(m.hp().n_ctx, default_ctx));
}

session::session(const model& m, backend& be, int n_ctx, int n_batch, bool all_logits)
    : model_(m), be_(be), n_ctx_(context_length(m, n_ctx)), n_batch_(n_batch), all_logits_(all_logits) {
    const hparams& hp = m.hp();
    if (n_ctx_ <= 0 || n_ctx_ > (1 << 24)) throw error(errc::invalid_argument, "context length out of range");
    if (n_batch_ <= 0 || n_batch_ > 4096) throw error(errc::invalid_argument, "batch size out of range");
    const size_t B = static_cast<size_t>(n_batch_);
    const bool latent = hp.kv_lora_rank > 0;
    // the cache: each KV head's row of keys (and values) per position; latent attention's one
    // row holds the latent, whose leading kv_lora_rank floats also serve as the value
    kv_heads_ = latent ? 1 : hp.n_head_kv;
    kv_row_ = latent ? hp.kv_lora_rank + hp.rope_dim : hp.head_dim;
    const size_t q_dim = size_t(hp.n_head) * hp.head_dim, kv_dim = size_t(hp.n_head_kv) * hp.head_dim;
    const size_t n_ff = std::max({hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp});
    x_ = be.alloc(B * hp.n_embd);
    xn_ = be.alloc(B * hp.n_embd);
    q_ = be.alloc(B * q_dim);
    k_ = be.alloc(B * std::max<size_t>(kv_dim, hp.kv_lora_rank));
    v_ = be.alloc(B * kv_dim);
    att_ = be.alloc(B * std::max<size_t>(q_dim, size_t(hp.n_head) * hp.v_head_dim));
    if (latent) {
        const size_t rows = B * hp.n_head * kv_row_;
        lat_q_ = be.alloc(rows);
        lat_att_ = be.alloc(rows);
        lat_kv_ = be.alloc(B * kv_row_);
        q_pe_ = be.alloc(B * hp.n_head * hp.rope_dim);
        q_a_ = be.alloc(B * std::max<uint32_t>(hp.q_lora_rank, 1));
    }
    o_ = be.alloc(B * hp.n_embd);
    ffn_out_ = be.alloc(B * hp.n_embd);
    const size_t k_used = std::max<size_t>(hp.n_expert_used, 1);
    // routed experts see n_batch * k (token, slot) pairs; the shared expert and dense FFN
    // their own n_batch rows after them
    const size_t pairs = B * k_used + B;
    hg_ = be.alloc(pairs * n_ff);
    hu_ = be.alloc(pairs * n_ff);
    yo_ = be.alloc(pairs * hp.n_embd);
    ffn_jobs_.reserve(size_t(hp.n_expert) + 1);
    router_ = be.alloc(B * std::max<size_t>(hp.n_expert, 1));
    shared_gate_ = be.alloc(B);
    const int group = static_cast<int>(hp.n_head / std::max<uint32_t>(hp.n_head_kv, 1));
    scratch_ = be.alloc(size_t(be.n_threads()) * size_t(attention_scratch_rows(group)) * size_t(n_ctx_));
    logits_ = be.alloc((all_logits ? B : std::min<size_t>(B, max_draft + 1)) * size_t(hp.n_vocab));
    logits_host_ = be.to_host(logits_->data(), size_t(hp.n_vocab), logits_staging_);
    // f16 keys and values for models with quantised weights (half the memory and the reads
    // of f32, whose rounding is far below the weights'); f32 otherwise
    kv_f16_ = !m.layers().empty() && format::is_quantized(m.layers()[0].wo->type);
    const size_t kv_floats = (size_t(hp.n_layer) * size_t(n_ctx_) * kv_heads_ * kv_row_ * kv_elem_bytes() + 3) / 4;
    k_cache_ = be.alloc(kv_floats);
    if (!latent) v_cache_ = be.alloc(kv_floats);

    history_.reserve(size_t(n_ctx_));
    pos_.resize(B);
    sel_.resize(B * k_used);
    sel_w_.resize(B * k_used);
    expert_begin_.resize(size_t(hp.n_expert) + 1);
    order_.resize(B * k_used);
    rows_.resize(B * (k_used + 1));
    terms_n_.resize(B);
    terms_w_.resize(B * (k_used + 1));
    probs_.resize(hp.n_expert);
}

size_t session::memory_bytes() const {
    size_t floats = 0;
    for (const auto* b : {&x_,       &xn_,    &q_,       &k_,      &v_,           &att_,     &o_,      &ffn_out_,
                          &hg_,      &hu_,    &yo_,      &router_, &shared_gate_, &scratch_, &logits_, &k_cache_,
                          &v_cache_, &lat_q_, &lat_att_, &lat_kv_, &q_pe_,        &q_a_}) {
        if (*b) floats += (*b)->size();
    }
    return floats * sizeof(float) + history_.capacity() * sizeof(int32_t);
}

void session::truncate(int n) {
    COLIBRI_ASSERT(n >= 0 && n <= n_past());
    history_.resize(static_cast<size_t>(n));
    if (n >= high_water_) return;
    const hparams& hp = model_.hp();
    const size_t hd = kv_row_, elem = kv_elem_bytes();
    for (size_t head = 0; head < size_t(hp.n_layer) * kv_heads_; ++head) { // every layer's heads
        // in floats, rounded inwards (discard gives back whole pages inside the range only)
        const size_t first = ((head * size_t(n_ctx_) + size_t(n)) * hd * elem + 3) / 4;
        const size_t count = size_t(high_water_ - n) * hd * elem / 4;
        k_cache_->discard(first, count);
        if (v_cache_) v_cache_->discard(first, count);
    }
    high_water_ = n;
}

size_t session::token_bytes() const {
    const hparams& hp = model_.hp();
    return (v_cache_ ? 2 : 1) * size_t(hp.n_layer) * kv_heads_ * kv_row_ * kv_elem_bytes();
}

bool session::windowed(int il) const {
    const hparams& hp = model_.hp();
    return hp.sliding_window > 0 && (hp.swa_pattern == 0 || (il + 1) % int(hp.swa_pattern) != 0);
}

size_t session::kv_bytes_read(int pos) const {
    const hparams& hp = model_.hp();
    const size_t per_layer = token_bytes() / hp.n_layer;
    size_t bytes = 0;
    for (int il = 0; il < int(hp.n_layer); ++il) {
        const int keys = windowed(il) ? std::min(pos + 1, int(hp.sliding_window)) : pos + 1;
        bytes += per_layer * size_t(keys);
    }
    return bytes;
}

bool session::eval(const int32_t* tokens, int n, const std::function<bool()>& stop, int logit_rows) {
    const hparams& hp = model_.hp();
    if (n <= 0 || n > n_batch_) {
        throw error(errc::invalid_argument,
                    "batch of " + std::to_string(n) + " tokens, expected 1.." + std::to_string(n_batch_));
    }
    if (logit_rows < 1 || logit_rows > n || (!all_logits_ && logit_rows > max_draft + 1)) {
        throw error(errc::invalid_argument,
                    "logits of " + std::to_string(logit_rows) + " rows of a batch of " + std::to_string(n));
    }
    const int n_past = this->n_past();
    if (n_past + n > n_ctx_) {
        throw error(errc::context_full, "context full: " + std::to_string(n_past + n) + " tokens, the context holds " +
                                            std::to_string(n_ctx_));
    }
    for (int t = 0; t < n; ++t) {
        if (tokens[t] < 0 || tokens[t] >= static_cast<int32_t>(hp.n_vocab)) {
            throw error(errc::invalid_argument, "token id " + std::to_string(tokens[t]) +
                                                    " is outside the vocabulary of " + std::to_string(hp.n_vocab));
        }
        pos_[t] = n_past + t;
    }

    // the batch's cache rows hold memory from its first layer on, finished or not
    high_water_ = std::max(high_water_, n_past + n);
    be_.embed(model_.token_embd(), tokens, n, hp.embedding_scale, x_->data()); // [n, n_embd]
    // One token: the backend may run the step from a recording of an earlier one, or record
    // this one (a recorded step is not abandoned between its layers, and has no routing
    // observer: that needs the routing on the host).
    const bool replayable = n == 1 && observer_.fn == nullptr;
    if (!replayable || !be_.step_replay(this, pos_[0])) {
        const bool recording = replayable && be_.step_begin(this, pos_[0]);
        if (recording) {
            try {
                forward(n, {}, logit_rows);
            } catch (...) {
                be_.step_abandon(this);
                throw;
            }
            if (!be_.step_end(this)) forward(n, {}, logit_rows);
        } else if (!forward(n, stop, logit_rows)) {
            return false;
        }
    }
    history_.insert(history_.end(), tokens, tokens + n); // within the reserved capacity
    const int rows = all_logits_ ? n : logit_rows;
    logits_host_ = be_.to_host(logits_->data(), size_t(rows) * hp.n_vocab, logits_staging_);
    return true;
}

session::~session() { be_.step_forget(this); }

bool session::forward(int n, const std::function<bool()>& stop, int logit_rows) {
    const hparams& hp = model_.hp();
    const int n_embd = static_cast<int>(hp.n_embd);
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
        // abandoned between layers: nothing is appended, and the next batch at these
        // positions overwrites what this one stored
        if (il > 0 && stop && stop()) return false;
        attention_block(il, n);
        ffn_block(il, n);
    }
    // LM head on the rows the caller wants
    const int first = all_logits_ ? 0 : n - logit_rows;
    const int rows = n - first;
    float* x_last = x_->data() + static_cast<int64_t>(first) * n_embd;
    norm(x_last, model_.output_norm(), model_.output_norm_bias(), rows, xn_->data());
    be_.matmul(model_.output(), xn_->data(), rows, logits_->data());
    if (hp.logit_scale != 1.0f) be_.scale(logits_->data(), int64_t(rows) * hp.n_vocab, hp.logit_scale);
    if (hp.final_softcap > 0) be_.softcap(logits_->data(), int64_t(rows) * hp.n_vocab, hp.final_softcap);
    return true;
}

void session::norm(const float* x, const tensor_view& w, const tensor_view* bias, int n, float* out) {
    const hparams& hp = model_.hp();
    if (bias != nullptr) be_.layernorm(x, w, *bias, n, static_cast<int>(hp.n_embd), hp.norm_eps, out);
    else be_.rmsnorm(x, w, n, static_cast<int>(hp.n_embd), hp.norm_eps, out);
}

} // namespace colibri
