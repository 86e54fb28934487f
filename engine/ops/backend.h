#pragma once
// The operations the forward pass is written in. A backend implements them for one kind
// of device; model code never sees SIMD intrinsics or device calls. Activation pointers
// are buffers the backend allocated (host memory for the CPU backend, device memory for a
// GPU's), which the caller reads only through to_host. Index, position and weight arrays
// (ids, pos, x_rows, index, weight) are host memory; weights are tensor_views of the
// mapped model file.

#include "format/model_file.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace colibri {

/// Memory a backend hands out; freed with the object.
class device_buffer {
public:
    virtual ~device_buffer() = default;
    virtual float* data() = 0;
    virtual size_t size() const = 0; ///< in floats
    /// Gives back the memory behind floats [first, first + count), whose contents are no
    /// longer needed (they read as zero or stale afterwards). A hint: it may do nothing.
    virtual void discard(size_t first, size_t count) {
        (void)first;
        (void)count;
    }
};

/// Rotary embedding settings: pair i of a head (elements i and i + head_dim/2) turns by
/// pos * theta^(-2i/head_dim) / freq_factors[i], and its cos and sin are multiplied by
/// attn_factor (scaled RoPE: linear, llama3, YaRN).
struct rope_params {
    float theta;
    const tensor_view* freq_factors = nullptr; ///< [head_dim / 2] f32; null: all 1
    float attn_factor = 1.0f;
};

/// The query rows a CPU attention call takes at most: a block of tokens by a part of a KV
/// head's query heads.
constexpr int attention_rows = 6;
/// The scratch rows of attention_args per thread for `group` query heads per KV head.
constexpr int attention_scratch_rows(int group) { return group > attention_rows ? group : attention_rows; }

struct attention_args {
    const float* q;     // [n, n_head*head_dim]
    const float* k_new; // [n, n_head_kv*head_dim]: this batch's keys, stored at pos[t] first
    const float* v_new; // [n, n_head_kv*head_dim]
    void* k_cache;      // [n_head_kv, n_ctx, head_dim] of this layer: each head's keys in a row
    void* v_cache;      // [n_head_kv, n_ctx, head_dim]
    bool kv_f16;        // the caches hold f16 (otherwise f32)
    const int32_t* pos; // [n]: token t attends to cache rows 0..pos[t] (the last `window` of them)
    float* out;         // [n, n_head*head_dim]
    float* scratch;     // [n_threads, attention_scratch_rows(n_head / n_head_kv), n_ctx]
    int n, n_ctx, n_head, n_head_kv, head_dim;
    float scale;
    int window = 0;    // > 0: token t attends to rows pos[t] - window + 1 .. pos[t] only (sliding window)
    float softcap = 0; // > 0: scores become softcap * tanh(score / softcap) before the softmax (Gemma 2)
};

/// One matrix product of matmul_many: y[n, w.rows] = x[n, w.cols] . w^T
struct matmul_job {
    const tensor_view* w;
    const float* x;
    int n;
    float* y;
    /// Token t's activations are row x_rows[t] of x (rows of w->cols() floats); null: row t.
    /// A prefill batch's experts read their tokens where they are, so each row is prepared
    /// (quantised) once for all the experts that take it.
    const int32_t* x_rows = nullptr;
};

/// One gated feed-forward of ffn_many (an expert, the shared expert, a dense layer's):
/// y[n, down.rows] = down . (act(gate . x) * (up . x)), act silu (SwiGLU) or gelu_tanh
/// (GeGLU), x taken as matmul_job takes it.
struct ffn_job {
    const tensor_view* gate;
    const tensor_view* up;
    const tensor_view* down;
    const float* x;
    int n;
    const int32_t* x_rows; ///< as matmul_job::x_rows
    float* g;              ///< [n, n_ff]: the gate products, then act(gate) * up (down's input)
    float* u;              ///< [n, n_ff]: the up products
    float* y;              ///< [n, down.rows]
    bool gelu = false;     ///< the gate's activation: gelu_tanh (GeGLU), else silu (SwiGLU)
};

/// One feed-forward's weights: a routed expert, a shared expert or a dense layer's FFN.
struct expert_weights {
    const tensor_view* gate = nullptr;      // [n_ff, n_embd]; null in a GELU MLP
    const tensor_view* up = nullptr;        // [n_ff, n_embd]
    const tensor_view* down = nullptr;      // [n_embd, n_ff]
    const tensor_view* up_bias = nullptr;   // [n_ff], optional (dense FFN only)
    const tensor_view* down_bias = nullptr; // [n_embd]
};

/// A MoE layer's feed-forward for one token, routing included (moe_one): what the session
/// otherwise does with matmul_many, its own routing, ffn_many and weighted_sum_rows.
struct moe_step {
    const tensor_view* router;     ///< [n_expert, n_embd]
    const expert_weights* experts; ///< [n_expert]
    int n_expert, k;
    bool renorm;                    ///< the k weights renormalised to sum 1
    int n_group, n_group_used;      ///< n_group > 1: the k best of the n_group_used groups of best expert
    float scale;                    ///< the k weights multiplied by this (after renorm)
    const expert_weights* shared;   ///< null: no shared expert
    const tensor_view* shared_gate; ///< null: the shared expert's weight is 1
    const float* x;                 ///< [n_embd], normalised
    float* out;                     ///< [n_embd]
};

/// What a backend's expert cache did (under a device weight budget, routed experts are
/// copied into per-layer slots when a token needs them): experts found on the device,
/// experts copied in, their bytes.
struct expert_cache_stats {
    int slots_per_layer = 0; ///< 0: no budget, every expert stays once used
    uint64_t hits = 0, misses = 0, bytes_copied = 0;
};

class backend {
public:
    virtual ~backend() = default;
    virtual std::string name() const = 0;
    virtual int n_threads() const = 0;
    /// The expert cache's counters so far; all zero for a backend without one.
    virtual expert_cache_stats expert_cache_usage() const { return {}; }

    /// Zero-initialised buffer of n floats.
    virtual std::unique_ptr<device_buffer> alloc(size_t n) = 0;
    /// The n floats at p (in one of this backend's buffers) where the host can read them,
    /// once every operation before has finished: p itself when buffers are host memory,
    /// else a copy in `staging` (resized as needed).
    virtual const float* to_host(const float* p, size_t n, std::vector<float>& staging) {
        (void)n;
        (void)staging;
        return p;
    }
    /// Copies n floats of host memory into dst, one of this backend's buffers.
    virtual void from_host(const float* src, size_t n, float* dst) { std::memcpy(dst, src, n * sizeof(float)); }

    /// out[t] = table[ids[t]] * scale; out [n, cols]
    virtual void embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) = 0;
    /// y[n, w.rows] = x[n, w.cols] . w^T
    virtual void matmul(const tensor_view& w, const float* x, int n, float* y) = 0;
    /// Several independent products at once (one synchronisation for all of them).
    virtual void matmul_many(const matmul_job* jobs, int n_jobs) = 0;
    /// Per-head products (latent attention): w holds n_head matrices of w.rows / n_head rows;
    /// for t < n and h < n_head, y[(t * n_head + h) * y_stride + i] = w[h * w.rows / n_head + i]
    /// . x[(t * n_head + h) * x_stride + 0 .. w.cols). w is f32 or f16.
    virtual void head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                             int64_t y_stride) = 0;
    /// dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols.
    virtual void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                           int cols) = 0;
    /// RMSNorm of n rows of dim elements with weight w [dim]; out may alias x.
    virtual void rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) = 0;
    /// LayerNorm of n rows of dim elements with weight w and bias b [dim]; out may alias x.
    virtual void layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                           float* out) = 0;
    /// y[t] += b for n rows of dim
    virtual void add_bias(float* y, const tensor_view& b, int n, int dim) = 0;
    /// Rotary embedding on x [n, n_heads*head_dim] at positions pos[n].
    virtual void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& p) = 0;
    /// Stores the batch's keys and values in the cache, then causal attention over it,
    /// grouped-query heads.
    virtual void attention(const attention_args& a) = 0;
    /// Several feed-forwards at once: the results of matmul_many on every gate and up,
    /// swiglu, then matmul_many on every down, bit for bit (a backend may run each job from
    /// start to end on one thread, with no synchronisation between the products).
    virtual void ffn_many(const ffn_job* jobs, int n_jobs) = 0;
    /// gate = silu(gate) * up, n elements
    virtual void swiglu(float* gate, const float* up, int64_t n) = 0;
    /// x = gelu(x) (tanh approximation), n elements
    virtual void gelu(float* x, int64_t n) = 0;
    /// gate = gelu(gate) * up (tanh approximation), n elements
    virtual void geglu(float* gate, const float* up, int64_t n) = 0;
    /// x = cap * tanh(x / cap), n elements
    virtual void softcap(float* x, int64_t n, float cap) = 0;
    /// x += s * y, n elements
    virtual void add_scaled(float* x, const float* y, int64_t n, float s) = 0;
    /// x *= s, n elements
    virtual void scale(float* x, int64_t n, float s) = 0;
    /// One token's MoE feed-forward with its routing, for a backend that routes on its
    /// device without the host waiting for it: softmax over the router's outputs, the k
    /// best (ties to the lower index; within the best groups when grouped), their weights
    /// (renormalised when asked, then scaled), the experts
    /// and the shared expert, summed as weighted_sum_rows sums (experts in index order,
    /// then the shared one). Returns false, doing nothing, to leave it to the caller.
    virtual bool moe_one(const moe_step& step) {
        (void)step;
        return false;
    }

    /// A one-token step recorded once and replayed, for a device that launches a recording
    /// (a CUDA graph) faster than its operations one by one. For a step of `key` (a
    /// session) at position `pos`: step_replay runs the step from its recording when there is
    /// one (true); otherwise step_begin says whether this step's operations are to be
    /// recorded instead of run, and step_end then ends the recording and runs it, or returns
    /// false when the step could not be recorded (the caller runs its operations again).
    /// step_abandon ends a recording whose step threw, keeping nothing of it; step_forget
    /// drops a key's recording. A recorded step reads its position from the backend, so
    /// every later step of the key replays it.
    virtual bool step_replay(const void* key, int32_t pos) {
        (void)key;
        (void)pos;
        return false;
    }
    virtual bool step_begin(const void* key, int32_t pos) {
        (void)key;
        (void)pos;
        return false;
    }
    virtual bool step_end(const void* key) {
        (void)key;
        return true;
    }
    virtual void step_abandon(const void* key) { (void)key; }
    virtual void step_forget(const void* key) { (void)key; }
    /// out[t] = sum over i < k of weight[t * k + i] * rows[index[t * k + i]], for n rows of
    /// dim floats: each term added onto the sum before it (from zero) in the order of i,
    /// element by element as add_scaled adds.
    virtual void weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n,
                                   int k, int dim) = 0;
};

struct kernel_table;

struct cpu_options {
    int n_threads = 1;
    /// Row kernels; nullptr: the fastest this CPU supports.
    const kernel_table* kernels = nullptr;
    /// Quantise activations to int8 for q8_0/q4_0 weights (integer dot products: 1.4-3x
    /// faster; the activations add about as much rounding error as q8_0 weights do);
    /// otherwise they stay f32.
    bool int8_activations = true;
};

/// CPU backend; max_cols is the widest row any matmul reads. Runs one operation at a time.
std::unique_ptr<backend> make_cpu_backend(const cpu_options& options, int64_t max_cols);

} // namespace colibri
