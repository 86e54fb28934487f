#include "model/profiled_backend.h"

#include <algorithm>

namespace colibri {

const char* profiled_backend::op_name(op o) {
    switch (o) {
    case op::embedding: return "embedding";
    case op::norms: return "RMSNorms";
    case op::qkv: return "q/k/v";
    case op::biases: return "q/k/v biases";
    case op::rope: return "RoPE";
    case op::attention: return "attention";
    case op::attention_output: return "attention output";
    case op::router: return "router";
    case op::feed_forwards: return "feed-forwards";
    case op::expert_sum: return "experts' sum";
    case op::residuals: return "residual adds";
    case op::lm_head: return "LM head";
    case op::other: break;
    }
    return "other";
}

profiled_backend::profiled_backend(backend& inner, const model& m) : inner_(inner) {
    const auto add = [&](const tensor_view* w, op kind) {
        if (w != nullptr) products_[w] = kind;
    };
    // the feed-forwards' weights come through ffn_many, a shared expert's gate after the
    // router in one matmul_many
    for (const layer_weights& l : m.layers()) {
        for (const tensor_view* w : {l.wq, l.wk, l.wv, l.mla.q_a, l.mla.q_nope, l.mla.kv_a, l.mla.k_b}) add(w, op::qkv);
        add(l.wo, op::attention_output);
        add(l.mla.v_b, op::attention_output);
        add(l.router, op::router);
        if (l.dense.gate == nullptr) { // a GELU MLP's products come one by one
            add(l.dense.up, op::feed_forwards);
            add(l.dense.down, op::feed_forwards);
        }
    }
    add(&m.output(), op::lm_head);
}

profiled_backend::op profiled_backend::product_kind(const tensor_view* w) const {
    const auto it = products_.find(w);
    return it != products_.end() ? it->second : op::other;
}

void profiled_backend::embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) {
    const double row = double(table.size) / double(std::max<uint64_t>(table.rows(), 1));
    const timing t{this, op::embedding, row * n};
    inner_.embed(table, ids, n, scale, out);
}

void profiled_backend::matmul(const tensor_view& w, const float* x, int n, float* y) {
    const timing t{this, product_kind(&w), double(w.size)};
    inner_.matmul(w, x, n, y);
}

void profiled_backend::matmul_many(const matmul_job* jobs, int n_jobs) {
    double bytes = 0;
    for (int j = 0; j < n_jobs; ++j) bytes += double(jobs[j].w->size);
    const timing t{this, n_jobs > 0 ? product_kind(jobs[0].w) : op::other, bytes};
    inner_.matmul_many(jobs, n_jobs);
}

void profiled_backend::head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                                   int64_t y_stride) {
    const timing t{this, product_kind(&w), double(w.size)};
    inner_.head_matmul(w, n_head, x, x_stride, n, y, y_stride);
}

void profiled_backend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                                 int cols) {
    const timing t{this, op::attention, 0};
    inner_.copy_rows(dst, dst_stride, src, src_stride, rows, cols);
}

void profiled_backend::rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) {
    const timing t{this, op::norms, double(w.size)};
    inner_.rmsnorm(x, w, n, dim, eps, out);
}

void profiled_backend::add_bias(float* y, const tensor_view& b, int n, int dim) {
    const timing t{this, op::biases, double(b.size)};
    inner_.add_bias(y, b, n, dim);
}

void profiled_backend::rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& p) {
    const timing t{this, op::rope, 0};
    inner_.rope(x, n, n_heads, head_dim, pos, p);
}

void profiled_backend::attention(const attention_args& a) {
    // each token reads the keys and values of positions 0..pos (its window's) of every KV head
    double positions = 0;
    for (int t = 0; t < a.n; ++t) positions += a.window > 0 ? std::min(a.pos[t] + 1, a.window) : a.pos[t] + 1;
    const double caches = a.v_cache == a.k_cache ? 1.0 : 2.0; // latent attention's values lead its keys
    const double bytes = positions * a.n_head_kv * a.head_dim * caches * (a.kv_f16 ? 2 : 4);
    const timing t{this, op::attention, bytes};
    inner_.attention(a);
}

void profiled_backend::ffn_many(const ffn_job* jobs, int n_jobs) {
    double bytes = 0;
    for (int j = 0; j < n_jobs; ++j) bytes += double(jobs[j].gate->size + jobs[j].up->size + jobs[j].down->size);
    const timing t{this, op::feed_forwards, bytes};
    inner_.ffn_many(jobs, n_jobs);
}

void profiled_backend::layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                                 float* out) {
    const timing t{this, op::norms, double(w.size + b.size)};
    inner_.layernorm(x, w, b, n, dim, eps, out);
}

void profiled_backend::gelu(float* x, int64_t n) {
    const timing t{this, op::feed_forwards, 0};
    inner_.gelu(x, n);
}

void profiled_backend::geglu(float* gate, const float* up, int64_t n) {
    const timing t{this, op::feed_forwards, 0};
    inner_.geglu(gate, up, n);
}

void profiled_backend::softcap(float* x, int64_t n, float cap) {
    const timing t{this, op::other, 0};
    inner_.softcap(x, n, cap);
}

void profiled_backend::swiglu(float* gate, const float* up, int64_t n) {
    const timing t{this, op::feed_forwards, 0};
    inner_.swiglu(gate, up, n);
}

void profiled_backend::add_scaled(float* x, const float* y, int64_t n, float s) {
    const timing t{this, op::residuals, 0};
    inner_.add_scaled(x, y, n, s);
}

void profiled_backend::scale(float* x, int64_t n, float s) {
    const timing t{this, op::other, 0};
    inner_.scale(x, n, s);
}

void profiled_backend::weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight,
                                         int n, int k, int dim) {
    const timing t{this, op::expert_sum, 0};
    inner_.weighted_sum_rows(out, rows, index, weight, n, k, dim);
}

} // namespace colibri
