#pragma once
// A backend that forwards every operation to another and times it, with the bytes of
// weights (and of keys and values) each one reads: where a decode step's time goes
// against the machine's read bandwidth (colibri-bench --ops). The times are the calling
// thread's wall time around each call, so they mean something only for a backend whose
// operations have finished when they return (the CPU's, not a GPU's queue).

#include "model/model.h"
#include "ops/backend.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <unordered_map>

namespace colibri {

class profiled_backend final : public backend {
public:
    /// What an operation is attributed to: matrix products by their weights, the rest by
    /// the operation.
    enum class op {
        embedding,        // the token's row of the embedding table
        norms,            // RMSNorms (of layers, q/k heads and the output)
        qkv,              // the q, k and v products (latent attention's: its projections and k_b)
        biases,           // their biases
        rope,             // rotary embeddings
        attention,        // scores and weighted values over the KV cache (stores and row copies included)
        attention_output, // the output product (latent attention's: v_b's too)
        router,           // the router (and a shared expert's gate, in the same operation)
        feed_forwards,    // experts, shared experts and dense feed-forwards, SwiGLU included
        expert_sum,       // the experts' outputs weighted and summed
        residuals,        // the residual additions
        lm_head,          // the output product
        other,            // anything else (a logit scale, products of other weights)
    };
    static constexpr int op_count = static_cast<int>(op::other) + 1;
    static const char* op_name(op o);

    struct op_stats {
        double seconds = 0;
        double bytes = 0; // weights, keys and values read
        uint64_t calls = 0;
    };

    /// Forwards to `inner`; the model's weights say which product is which.
    profiled_backend(backend& inner, const model& m);

    /// Operations are timed and counted only while recording (not at first).
    void set_recording(bool on) { recording_ = on; }
    const std::array<op_stats, op_count>& stats() const { return stats_; }
    /// Every count back to zero.
    void reset() { stats_ = {}; }

    std::string name() const override { return inner_.name(); }
    int n_threads() const override { return inner_.n_threads(); }
    std::unique_ptr<device_buffer> alloc(size_t n) override { return inner_.alloc(n); }
    const float* to_host(const float* p, size_t n, std::vector<float>& staging) override {
        return inner_.to_host(p, n, staging);
    }
    void from_host(const float* src, size_t n, float* dst) override { inner_.from_host(src, n, dst); }
    void embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) override;
    void matmul(const tensor_view& w, const float* x, int n, float* y) override;
    void matmul_many(const matmul_job* jobs, int n_jobs) override;
    void head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                     int64_t y_stride) override;
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                   int cols) override;
    void rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) override;
    void add_bias(float* y, const tensor_view& b, int n, int dim) override;
    void layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                   float* out) override;
    void gelu(float* x, int64_t n) override;
    void geglu(float* gate, const float* up, int64_t n) override;
    void softcap(float* x, int64_t n, float cap) override;
    void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& p) override;
    void attention(const attention_args& a) override;
    void ffn_many(const ffn_job* jobs, int n_jobs) override;
    void swiglu(float* gate, const float* up, int64_t n) override;
    void add_scaled(float* x, const float* y, int64_t n, float s) override;
    void scale(float* x, int64_t n, float s) override;
    void weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n, int k,
                           int dim) override;
    // No routing on the device and no captured steps: every operation comes through here.

private:
    using clock = std::chrono::steady_clock;
    struct timing { // adds a call's time to its op on destruction
        profiled_backend* self;
        op kind;
        double bytes;
        clock::time_point t0 = clock::now();
        ~timing() {
            if (!self->recording_) return;
            op_stats& s = self->stats_[static_cast<size_t>(kind)];
            s.seconds += std::chrono::duration<double>(clock::now() - t0).count();
            s.bytes += bytes;
            ++s.calls;
        }
    };
    op product_kind(const tensor_view* w) const;

    backend& inner_;
    std::unordered_map<const tensor_view*, op> products_; // weights -> what their product is
    std::array<op_stats, op_count> stats_{};
    bool recording_ = false;
};

} // namespace colibri
