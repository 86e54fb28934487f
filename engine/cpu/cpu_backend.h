#pragma once
// The CPU backend: ops/backend.h's operations on the kernel table (kernel_table.h) and the
// scalar kernels (kernels.h), split across a thread pool. Its operations live by kind:
// cpu_matmul.cpp (products), cpu_matmul_streams.cpp (one-token products as memory
// streams), cpu_quantise.cpp (int8 activations), cpu_moe.cpp (feed-forwards and experts),
// cpu_attention.cpp (rope and attention), cpu_elementwise.cpp (norms and activations),
// host_buffer.h (buffers).

#include "cpu/kernel_table.h"
#include "cpu/thread_pool.h"
#include "ops/backend.h"

#include <string>
#include <vector>

namespace colibri {

class cpu_backend final : public backend {
public:
    cpu_backend(const cpu_options& o, int64_t max_cols);

    std::string name() const override { return std::string("cpu/") + kt_.name; }
    int n_threads() const override { return pool_.size(); }
    std::unique_ptr<device_buffer> alloc(size_t n) override;
    void embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) override;

    // cpu_matmul.cpp
    void matmul(const tensor_view& w, const float* x, int n, float* y) override;
    void matmul_many(const matmul_job* in_jobs, int n_jobs) override;
    void head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                     int64_t y_stride) override;

    // cpu_moe.cpp
    void ffn_many(const ffn_job* jobs, int n_jobs) override;
    void weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n, int k,
                           int dim) override;

    // cpu_attention.cpp
    void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& p) override;
    void attention(const attention_args& a) override;

    // cpu_norms.cpp
    void rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) override;
    void layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                   float* out) override;

    // cpu_elementwise.cpp
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                   int cols) override;
    void gelu(float* x, int64_t n) override;
    void geglu(float* gate, const float* up, int64_t n) override;
    void softcap(float* x, int64_t n, float cap) override;
    void add_bias(float* y, const tensor_view& b, int n, int dim) override;
    void swiglu(float* gate, const float* up, int64_t n) override;
    void add_scaled(float* x, const float* y, int64_t n, float s) override;
    void scale(float* x, int64_t n, float s) override;

private:
    // Streamed jobs in order (matmul_streamed, ffn_streamed), then one past them (begin:
    // their total groups).
    struct segment {
        int64_t begin;    // its first group among all streamed groups
        const uint8_t* w; // the job's weights
        uint64_t group_bytes;
        const block_q8_x* x; // its quantised activations
        float* y;            // its outputs
        int64_t groups, cols;
        decltype(kernel_table::streams_q4_0x8) streams;
        decltype(kernel_table::tile_q4_0x8) tile;
    };

    // cpu_matmul.cpp
    const matmul_job* f32_rows_gathered(const matmul_job* jobs, int n_jobs);
    void matmul_rows(const matmul_job& jb, const block_q8_x* xq, int64_t r0, int64_t r1) const;
    void f32_row_tokens(format::dtype row_type, const uint8_t* row, const matmul_job& jb, int64_t r) const;
    void matmul_groups(const matmul_job& jb, const block_q8_x* xq, int64_t r0, int64_t r1) const;
    // Decode's rows [r0, r1) of a product walked as four streams a quarter of the range
    // apart, which keeps more hardware prefetch streams busy than one sequential walk:
    // dot4(r, q, out) gives rows r, r + q, r + 2q and r + 3q; dot1(r) one of the rows left.
    template <class Dot4, class Dot1>
    static void four_streams(int64_t r0, int64_t r1, float* y, Dot4&& dot4, Dot1&& dot1) {
        const int64_t q = (r1 - r0) / 4;
        float out[4];
        for (int64_t i = 0; i < q; ++i) {
            dot4(r0 + i, q, out);
            for (int k = 0; k < 4; ++k) y[r0 + i + k * q] = out[k];
        }
        for (int64_t r = r0 + 4 * q; r < r1; ++r) y[r] = dot1(r);
    }

    // cpu_matmul_streams.cpp
    bool matmul_streamed(const matmul_job* jobs, int n_jobs, int64_t work);
    void add_segment(std::vector<segment>& segs, int64_t& groups, const tensor_view& w, const block_q8_x* x,
                     float* y) const;
    static void end_segments(std::vector<segment>& segs, int64_t groups);
    void other_job_rows(const matmul_job* jobs, int n_jobs, int64_t r0, int64_t r1) const;
    void run_steps(const std::vector<segment>& segs, int64_t pb, int64_t pe, int64_t k0, int64_t k1) const;

    // cpu_quantise.cpp
    void quantise_activations(const matmul_job* jobs, int n_jobs, size_t xq_blocks);

    // cpu_moe.cpp
    bool ffn_streamed(const ffn_job* jobs, int n_jobs);

    // Quantised rows without SIMD kernels for f32 activations (all but q8_0 and q4_0):
    // kernels::dot_row.
    static bool scalar_f32_rows(format::dtype t) { return format::is_k_quant(t) || format::is_read_only(t); }
    bool uses_int8(const tensor_view& w) const { return int8_activations_ && format::is_quantized(w.type); }
    bool streamed(const tensor_view& w) const { return format::is_interleaved(w.type) && uses_int8(w); }
    // The quantiser of w's int8 activations (kernel_table.h's superblock_activations).
    decltype(kernel_table::quantize_x) quantiser(const tensor_view& w) const {
        return superblock_activations(w.type) ? kt_.quantize_x_k : kt_.quantize_x;
    }

    static void add_scaled_row(float* x, const float* y, int64_t n, float s) {
        for (int64_t i = 0; i < n; ++i) x[i] += s * y[i];
    }

    // Below this many multiply-adds an operation runs on the calling thread: waking the
    // pool costs more than it saves (small models, short contexts).
    static constexpr int64_t min_parallel_work = 1 << 16;
    // Batches of up to this many tokens (decode, speculative decoding's verifying passes)
    // read each weight once from memory for all their tokens, several streams side by side,
    // instead of walking L2-sized blocks for chunks of many tokens.
    static constexpr int short_batch = 8;
    // The last rows of a product are handed to the threads in chunks of about this many
    // bytes of weights (see split). Short batches read each chunk as several streams, which
    // start cold, so their chunks are larger.
    // Interleaved rows in decode have their own split (matmul_streamed).
    static constexpr uint64_t chunk_bytes = 64 << 10;
    static constexpr uint64_t decode_chunk_bytes = 256 << 10;
    // Prefill walks a matrix in blocks of rows of about this many bytes, which stay in
    // L2 while every chunk of tokens passes over them.
    static constexpr uint64_t l2_block_bytes = 64 << 10;

    // items [0, n) on the calling thread below min_parallel_work, else across the pool:
    // the threads share the memory unevenly, so after equal shares of most of the items
    // the rest goes in chunks of `grain` to whichever thread is free, and no thread waits
    // long for another at the end of an operation.
    template <class F>
    void split(int64_t items, int64_t work, int64_t grain, F&& f) {
        if (work < min_parallel_work) f(int64_t(0), items);
        else pool_.parallel_balanced(items, grain, f);
    }

    thread_pool pool_;
    int64_t max_cols_;
    const kernel_table& kt_;
    bool int8_activations_;
    std::vector<block_q8_x> xq_; // quantised activations of every job
    struct quant_source {        // rows quantised into xq_
        const float* x;
        int64_t rows, cols;
        size_t xq_at;     // its first block
        bool indexed;     // rows that jobs take by index (copied to them after)
        bool superblocks; // quantize_x_k's blocks (superblock_activations)
    };
    std::vector<quant_source> quant_src_;
    std::vector<int64_t> quant_rows_; // the rows before each source, then their total
    struct indexed_job {              // a job that copies its blocks from a source
        int job;
        size_t source;
        int64_t first_row; // its rows' place among all copied rows
    };
    std::vector<indexed_job> indexed_;
    std::vector<float> f32_rows_; // rows taken by index for the f32 kernels
    std::vector<matmul_job> local_jobs_;
    std::vector<int64_t> row_begin_; // [n_jobs + 1] first global row of each job
    std::vector<int> blocks_;        // attention: each block's first token, then the batch's count
    std::vector<segment> segments_;
    std::vector<matmul_job> ffn_products_; // ffn_many's products, stepwise
    // ffn_many's decode: each thread's first job (then n_jobs), the first block of each
    // job's down activations
    std::vector<int> ffn_first_;
    std::vector<size_t> ffn_xq_at_;
    std::vector<segment> ffn_gate_up_, ffn_down_;
    std::vector<size_t> xq_begin_; // [n_jobs] first block of each job in xq_
    // rotary angles of the last positions seen: [n][cos of half pairs, sin of half pairs]
    std::vector<int32_t> rope_pos_;
    std::vector<float> rope_cs_;
    float rope_theta_ = 0.0f;
    const float* rope_factors_ = nullptr;
    float rope_attn_ = 1.0f;
    int rope_half_ = 0;
};

} // namespace colibri
