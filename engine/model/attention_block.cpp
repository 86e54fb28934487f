// The session's attention blocks: grouped-query attention over per-head keys and values,
// and DeepSeek-V2's latent attention over one cached latent row per position.

#include "model/session.h"

#include <algorithm>
#include <cmath>

namespace colibri {

using namespace format;

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
    float* c = k_->data();    // [n, L]
    float* k_pe = v_->data(); // [n, r]
    const matmul_job in[3] = {
        {m.kv_a, xn_->data(), n, c}, {m.k_pe, xn_->data(), n, k_pe}, {m.q_a, xn_->data(), n, q_a_->data()}};
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

} // namespace colibri
