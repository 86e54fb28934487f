// The decoder forward pass, written once for every family on top of the backend ops.
// Families differ only by hyperparameters and flags (see format.h).

#include "model/session.h"

#include "core/error.h"
#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>

namespace colibri {

using namespace format;

session::session(const model& m, backend& be, int n_ctx, int n_batch, bool all_logits)
    : model_(m), be_(be), n_ctx_(n_ctx > 0 ? n_ctx : static_cast<int>(std::min<uint32_t>(m.hp().n_ctx, default_ctx))),
      n_batch_(n_batch), all_logits_(all_logits) {
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
    scratch_ = be.alloc(size_t(be.n_threads()) * (hp.n_head / std::max<uint32_t>(hp.n_head_kv, 1)) * size_t(n_ctx_));
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
    for (const auto* b : {&x_, &xn_, &q_, &k_, &v_, &att_, &o_, &ffn_out_, &hg_, &hu_, &yo_, &router_, &shared_gate_,
                          &scratch_, &logits_, &k_cache_, &v_cache_, &lat_q_, &lat_att_, &lat_kv_, &q_pe_, &q_a_}) {
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
        throw error(errc::invalid_argument, "batch of " + std::to_string(n) + " tokens, expected 1.." + std::to_string(n_batch_));
    }
    if (logit_rows < 1 || logit_rows > n || (!all_logits_ && logit_rows > max_draft + 1)) {
        throw error(errc::invalid_argument, "logits of " + std::to_string(logit_rows) + " rows of a batch of " + std::to_string(n));
    }
    const int n_past = this->n_past();
    if (n_past + n > n_ctx_) {
        throw error(errc::context_full, "context full: " + std::to_string(n_past + n) + " tokens, the context holds " + std::to_string(n_ctx_));
    }
    for (int t = 0; t < n; ++t) {
        if (tokens[t] < 0 || tokens[t] >= static_cast<int32_t>(hp.n_vocab)) {
            throw error(errc::invalid_argument, "token id " + std::to_string(tokens[t]) + " is outside the vocabulary of " + std::to_string(hp.n_vocab));
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
        if (!forward(n, recording ? std::function<bool()>() : stop, logit_rows)) return false;
        if (recording && !be_.step_end(this)) forward(n, {}, logit_rows);
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

void session::attention_block(int il, int n) {
    const hparams& hp = model_.hp();
    const layer_weights& l = model_.layers()[il];
    const int n_embd = static_cast<int>(hp.n_embd);
    norm(x_->data(), *l.attn_norm, l.attn_norm_bias, n, xn_->data());
    if (l.mla.kv_a != nullptr) latent_attention(il, n);
    else grouped_attention(il, n);

    be_.matmul(*l.wo, att_->data(), n, o_->data()); // [n, n_embd]
    if (l.bo != nullptr) be_.add_bias(o_->data(), *l.bo, n, n_embd);
    if (l.attn_post_norm != nullptr) be_.rmsnorm(o_->data(), *l.attn_post_norm, n, n_embd, hp.norm_eps, o_->data());
    be_.add_scaled(x_->data(), o_->data(), int64_t(n) * n_embd, hp.residual_scale);
}

rope_params session::rope_for(int il) const {
    // a windowed layer of a family with local and global layers (Gemma 3) turns at its own base, unscaled
    const hparams& hp = model_.hp();
    if (windowed(il) && hp.rope_theta_swa > 0) return rope_params{hp.rope_theta_swa};
    return rope_params{hp.rope_theta, model_.rope_freqs(), hp.rope_attn_factor > 0 ? hp.rope_attn_factor : 1.0f};
}

attention_args session::cache_args(int il, int n) const {
    const hparams& hp = model_.hp();
    const size_t layer_bytes = size_t(n_ctx_) * kv_heads_ * kv_row_ * kv_elem_bytes();
    attention_args a{};
    a.k_cache = reinterpret_cast<uint8_t*>(k_cache_->data()) + size_t(il) * layer_bytes;
    a.v_cache = v_cache_ ? reinterpret_cast<uint8_t*>(v_cache_->data()) + size_t(il) * layer_bytes : a.k_cache;
    a.kv_f16 = kv_f16_;
    a.pos = pos_.data();
    a.scratch = scratch_->data();
    a.n = n;
    a.n_ctx = n_ctx_;
    a.n_head = static_cast<int>(hp.n_head);
    a.n_head_kv = static_cast<int>(kv_heads_);
    a.head_dim = static_cast<int>(kv_row_);
    a.scale = hp.attention_scale > 0 ? hp.attention_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
    return a;
}

void session::latent_attention(int il, int n) {
    // DeepSeek-V2's attention with the key and value projections absorbed into the query and
    // the output: every head attends to one cached row per position, the normalised latent
    // (kv_lora_rank) then the roped shared key (rope_dim); a head's scores are
    // (k_b . q_nope) . latent + q_pe . k_pe, its output v_b . (weighted latents)
    const hparams& hp = model_.hp();
    const mla_weights& m = model_.layers()[il].mla;
    const int H = static_cast<int>(hp.n_head), L = static_cast<int>(hp.kv_lora_rank), r = static_cast<int>(hp.rope_dim);
    const int nope = static_cast<int>(hp.head_dim) - r, row = L + r;
    float* c = k_->data();   // [n, L]
    float* k_pe = v_->data(); // [n, r]
    const matmul_job in[3] = {{m.kv_a, xn_->data(), n, c}, {m.k_pe, xn_->data(), n, k_pe}, {m.q_a, xn_->data(), n, q_a_->data()}};
    be_.matmul_many(in, m.q_a != nullptr ? 3 : 2);
    const float* q_in = xn_->data();
    if (m.q_a != nullptr) {
        be_.rmsnorm(q_a_->data(), *m.q_a_norm, n, static_cast<int>(hp.q_lora_rank), hp.norm_eps, q_a_->data());
        q_in = q_a_->data();
    }
    const matmul_job q[2] = {{m.q_nope, q_in, n, q_->data()}, {m.q_pe, q_in, n, q_pe_->data()}};
    be_.matmul_many(q, 2);
    be_.rmsnorm(c, *m.kv_a_norm, n, L, hp.norm_eps, c);
    const rope_params rope = rope_for(il);
    be_.rope(q_pe_->data(), n, H, r, pos_.data(), rope);
    be_.rope(k_pe, n, 1, r, pos_.data(), rope);
    // the queries in the latent's space, then their roped part; the cached row
    be_.head_matmul(*m.k_b, H, q_->data(), nope, n, lat_q_->data(), row);
    be_.copy_rows(lat_q_->data() + L, row, q_pe_->data(), r, int64_t(n) * H, r);
    be_.copy_rows(lat_kv_->data(), row, c, L, n, L);
    be_.copy_rows(lat_kv_->data() + L, row, k_pe, r, n, r);

    attention_args a = cache_args(il, n);
    a.q = lat_q_->data();
    a.k_new = a.v_new = lat_kv_->data();
    a.out = lat_att_->data(); // [n, H, row]: the weighted latents, and rotary keys nothing reads
    be_.attention(a);
    be_.head_matmul(*m.v_b, H, lat_att_->data(), row, n, att_->data(), hp.v_head_dim);
}

void session::grouped_attention(int il, int n) {
    const hparams& hp = model_.hp();
    const layer_weights& l = model_.layers()[il];
    const int hd = static_cast<int>(hp.head_dim);
    const int q_dim = static_cast<int>(hp.n_head) * hd, kv_dim = static_cast<int>(hp.n_head_kv) * hd;
    const matmul_job qkv[3] = {{l.wq, xn_->data(), n, q_->data()},  // [n, q_dim]
                               {l.wk, xn_->data(), n, k_->data()},  // [n, kv_dim]
                               {l.wv, xn_->data(), n, v_->data()}}; // [n, kv_dim]
    be_.matmul_many(qkv, 3);
    if (l.bq != nullptr) {
        be_.add_bias(q_->data(), *l.bq, n, q_dim);
        be_.add_bias(k_->data(), *l.bk, n, kv_dim);
        be_.add_bias(v_->data(), *l.bv, n, kv_dim);
    }
    switch (static_cast<qk_norm>(hp.qk_norm)) {
    case qk_norm::none: break;
    case qk_norm::per_head: // one weight over head_dim, every head normalised on its own
        be_.rmsnorm(q_->data(), *l.q_norm, n * static_cast<int>(hp.n_head), hd, hp.norm_eps, q_->data());
        be_.rmsnorm(k_->data(), *l.k_norm, n * static_cast<int>(hp.n_head_kv), hd, hp.norm_eps, k_->data());
        break;
    case qk_norm::full: // the whole projection normalised at once
        be_.rmsnorm(q_->data(), *l.q_norm, n, q_dim, hp.norm_eps, q_->data());
        be_.rmsnorm(k_->data(), *l.k_norm, n, kv_dim, hp.norm_eps, k_->data());
        break;
    }
    const rope_params rope = rope_for(il);
    be_.rope(q_->data(), n, static_cast<int>(hp.n_head), hd, pos_.data(), rope);
    be_.rope(k_->data(), n, static_cast<int>(hp.n_head_kv), hd, pos_.data(), rope);

    // this layer's cache; the backend stores the new keys and values at pos_ first
    attention_args a = cache_args(il, n);
    a.q = q_->data();
    a.k_new = k_->data();
    a.v_new = v_->data();
    a.out = att_->data();
    a.window = windowed(il) ? static_cast<int>(hp.sliding_window) : 0;
    a.softcap = hp.attn_softcap;
    be_.attention(a);
}

void session::norm(const float* x, const tensor_view& w, const tensor_view* bias, int n, float* out) {
    const hparams& hp = model_.hp();
    if (bias != nullptr) be_.layernorm(x, w, *bias, n, static_cast<int>(hp.n_embd), hp.norm_eps, out);
    else be_.rmsnorm(x, w, n, static_cast<int>(hp.n_embd), hp.norm_eps, out);
}

void session::dense_ffn(const expert_weights& w, const float* x, int n, float* out) {
    if (w.gate != nullptr) { // SwiGLU, or GeGLU
        const ffn_job job{w.gate, w.up, w.down, x, n, nullptr, hg_->data(), hu_->data(), out,
                          (model_.hp().flags & flag_geglu) != 0};
        be_.ffn_many(&job, 1);
        return;
    }
    // GELU MLP: down . gelu(up . x + b_up) + b_down
    const int n_ff = static_cast<int>(w.up->rows());
    float* h = hu_->data(); // [n, n_ff]
    be_.matmul(*w.up, x, n, h);
    if (w.up_bias != nullptr) be_.add_bias(h, *w.up_bias, n, n_ff);
    be_.gelu(h, int64_t(n) * n_ff);
    be_.matmul(*w.down, h, n, out);
    if (w.down_bias != nullptr) be_.add_bias(out, *w.down_bias, n, static_cast<int>(w.down->rows()));
}

void session::ffn_block(int il, int n) {
    const hparams& hp = model_.hp();
    const layer_weights& l = model_.layers()[il];
    const int n_embd = static_cast<int>(hp.n_embd);
    norm(x_->data(), *l.ffn_norm, l.ffn_norm_bias, n, xn_->data());
    if (l.is_moe()) {
        // one token without an observer (which needs the routing on the host): the backend
        // may route on its device
        const routing_rule rule = routing();
        const moe_step one{l.router, l.experts.data(), rule.n_expert, rule.k, rule.renorm, rule.n_group, rule.n_group_used,
                           rule.scale, l.shared.gate != nullptr ? &l.shared : nullptr, l.shared_gate, xn_->data(),
                           ffn_out_->data()};
        if (n > 1 || observer_.fn != nullptr || !be_.moe_one(one)) moe(l, n);
        if (observer_.fn != nullptr) {
            const int k = static_cast<int>(hp.n_expert_used);
            for (int t = 0; t < n; ++t) {
                observer_.fn(observer_.user, pos_[t], il, &sel_[size_t(t) * k], &sel_w_[size_t(t) * k], k);
            }
        }
    } else {
        dense_ffn(l.dense, xn_->data(), n, ffn_out_->data());
    }
    if (l.ffn_post_norm != nullptr) be_.rmsnorm(ffn_out_->data(), *l.ffn_post_norm, n, n_embd, hp.norm_eps, ffn_out_->data());
    be_.add_scaled(x_->data(), ffn_out_->data(), int64_t(n) * n_embd, hp.residual_scale);
}

routing_rule session::routing() const {
    const hparams& hp = model_.hp();
    routing_rule r{static_cast<int>(hp.n_expert), static_cast<int>(hp.n_expert_used)};
    r.renorm = (hp.flags & flag_norm_topk_prob) != 0;
    if (hp.n_expert_group > 1) {
        r.n_group = static_cast<int>(hp.n_expert_group);
        r.n_group_used = static_cast<int>(hp.n_group_used);
    }
    if (hp.expert_weights_scale > 0) r.scale = hp.expert_weights_scale;
    return r;
}

void session::moe(const layer_weights& l, int n) {
    const hparams& hp = model_.hp();
    const int n_embd = static_cast<int>(hp.n_embd);
    const int n_expert = static_cast<int>(hp.n_expert);
    const int k = static_cast<int>(hp.n_expert_used);
    const routing_rule rule = routing();

    // 1. route: softmax over all experts, keep the top k, optionally renormalise (the shared
    //    expert's gate, when it has one, in the same dispatch)
    const matmul_job route[2] = {{l.router, xn_->data(), n, router_->data()},             // [n, n_expert]
                                 {l.shared_gate, xn_->data(), n, shared_gate_->data()}}; // [n, 1]
    be_.matmul_many(route, l.shared_gate != nullptr ? 2 : 1);
    const float* router = be_.to_host(router_->data(), size_t(n) * n_expert, router_staging_);
    for (int t = 0; t < n; ++t) {
        route_top_k(router + size_t(t) * n_expert, rule, probs_.data(), &sel_[size_t(t) * k], &sel_w_[size_t(t) * k]);
    }

    // 2. group (token, slot) pairs by expert, so each expert runs once on all its tokens
    std::fill(expert_begin_.begin(), expert_begin_.end(), 0);
    for (int i = 0; i < n * k; ++i) ++expert_begin_[sel_[i] + 1];
    for (int e = 0; e < n_expert; ++e) expert_begin_[e + 1] += expert_begin_[e];
    // fill by walking the pairs; expert_begin_[e] advances, then is restored by the shift below
    for (int i = 0; i < n * k; ++i) order_[expert_begin_[sel_[i]]++] = i;
    for (int e = n_expert; e > 0; --e) expert_begin_[e] = expert_begin_[e - 1];
    expert_begin_[0] = 0;

    // 3. every selected expert on its tokens, and the shared expert on all tokens, in one
    //    operation
    const int n_ff = static_cast<int>(hp.n_ff_exp);
    const bool shared = l.shared.gate != nullptr;
    const size_t n_pairs = size_t(n) * k;
    const float* xn = xn_->data();
    // an expert's tokens are rows of xn by index (the token of each of its pairs), so the
    // backend prepares each token's activations once for all the experts that take it; one
    // token: every expert reads it where it is
    for (size_t i = 0; i < n_pairs; ++i) rows_[i] = order_[i] / k;
    float* hg = hg_->data();
    float* hu = hu_->data();
    float* yo = yo_->data();
    ffn_jobs_.clear();
    for (int e = 0; e < n_expert; ++e) {
        const int begin = expert_begin_[e], count = expert_begin_[e + 1] - begin;
        if (count == 0) continue;
        const size_t h = size_t(begin) * n_ff;
        ffn_jobs_.push_back({l.experts[e].gate, l.experts[e].up, l.experts[e].down, xn, count,
                             n > 1 ? rows_.data() + begin : nullptr, hg + h, hu + h, yo + size_t(begin) * n_embd});
    }
    if (shared) { // its rows follow the routed ones
        const size_t h = n_pairs * n_ff;
        ffn_jobs_.push_back({l.shared.gate, l.shared.up, l.shared.down, xn, n, nullptr, hg + h, hu + h, yo + n_pairs * n_embd});
    }
    be_.ffn_many(ffn_jobs_.data(), static_cast<int>(ffn_jobs_.size()));

    // 4. weighted sum per token: routed experts in expert order, then the shared expert
    //    (its rows follow the routed ones in yo) scaled by sigmoid(x . w_gate) when it has a gate
    const int terms = k + (shared ? 1 : 0);
    std::fill_n(terms_n_.begin(), n, 0);
    for (size_t i = 0; i < n_pairs; ++i) { // the grouped order is expert order within a token
        const int pair = order_[i], t = pair / k, at = t * terms + terms_n_[size_t(t)]++;
        rows_[size_t(at)] = static_cast<int32_t>(i);
        terms_w_[size_t(at)] = sel_w_[size_t(pair)];
    }
    if (shared) {
        const float* gate = l.shared_gate != nullptr ? be_.to_host(shared_gate_->data(), size_t(n), gate_staging_) : nullptr;
        for (int t = 0; t < n; ++t) {
            rows_[size_t(t * terms + k)] = static_cast<int32_t>(n_pairs) + t;
            terms_w_[size_t(t * terms + k)] = gate != nullptr ? 1.0f / (1.0f + std::exp(-gate[t])) : 1.0f;
        }
    }
    be_.weighted_sum_rows(ffn_out_->data(), yo, rows_.data(), terms_w_.data(), n, terms, n_embd);
}

} // namespace colibri
