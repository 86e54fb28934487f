// The session's feed-forward blocks: a dense layer's (SwiGLU, GeGLU, GELU MLP), and an MoE
// layer's routing, experts grouped by the tokens they take, shared experts and weighted sum.

#include "model/session.h"

#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>

namespace colibri {

using namespace format;

void session::dense_ffn(const expert_weights& w, const float* x, int n, float* out) {
    if (w.gate != nullptr) { // SwiGLU, or GeGLU
        const ffn_job job{w.gate,  w.up,        w.down,      x,   n,
                          nullptr, hg_->data(), hu_->data(), out, (model_.hp().flags & flag_geglu) != 0};
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
        const moe_step one{l.router,
                           l.experts.data(),
                           rule.n_expert,
                           rule.k,
                           rule.renorm,
                           rule.n_group,
                           rule.n_group_used,
                           rule.scale,
                           l.shared.gate != nullptr ? &l.shared : nullptr,
                           l.shared_gate,
                           xn_->data(),
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
    if (l.ffn_post_norm != nullptr)
        be_.rmsnorm(ffn_out_->data(), *l.ffn_post_norm, n, n_embd, hp.norm_eps, ffn_out_->data());
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
    const matmul_job route[2] = {{l.router, xn_->data(), n, router_->data()},            // [n, n_expert]
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
        ffn_jobs_.push_back(
            {l.shared.gate, l.shared.up, l.shared.down, xn, n, nullptr, hg + h, hu + h, yo + n_pairs * n_embd});
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
        const float* gate =
            l.shared_gate != nullptr ? be_.to_host(shared_gate_->data(), size_t(n), gate_staging_) : nullptr;
        for (int t = 0; t < n; ++t) {
            rows_[size_t(t * terms + k)] = static_cast<int32_t>(n_pairs) + t;
            terms_w_[size_t(t * terms + k)] = gate != nullptr ? 1.0f / (1.0f + std::exp(-gate[t])) : 1.0f;
        }
    }
    be_.weighted_sum_rows(ffn_out_->data(), yo, rows_.data(), terms_w_.data(), n, terms, n_embd);
}

} // namespace colibri
