#pragma once
// The CUDA backend's class, private to engine/cuda. Its operations are defined with their
// kernels, one file per kind of operation (named at each group below); all of them run on
// the backend's one stream.

#include "cuda/cuda_backend.h"
#include "cuda/cuda_expert_cache.cuh"
#include "cuda/cuda_resources.cuh"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace colibri::cuda_detail {

struct expert_ptrs; // a row of a layer's device table of expert weights (cuda_moe.cu)

class cuda_backend final : public backend {
public:
    explicit cuda_backend(const cuda_options& o);
    ~cuda_backend() override;

    std::string name() const override { return name_; }
    int n_threads() const override { return 1; }
    expert_cache_stats expert_cache_usage() const override { return expert_cache_.stats(); }

    // ---- buffers and copies (cuda_buffers.cu) ----
    std::unique_ptr<device_buffer> alloc(size_t n) override;
    const float* to_host(const float* p, size_t n, std::vector<float>& staging) override;
    void from_host(const float* src, size_t n, float* dst) override;
    void embed(const tensor_view& table, const int32_t* ids, int n, float scale, float* out) override;

    // ---- matrix products (cuda_matmul.cu) ----
    void matmul(const tensor_view& w, const float* x, int n, float* y) override;
    void matmul_many(const matmul_job* jobs, int n_jobs) override;
    void ffn_many(const ffn_job* jobs, int n_jobs) override;
    void head_matmul(const tensor_view& w, int n_head, const float* x, int64_t x_stride, int n, float* y,
                     int64_t y_stride) override;

    // ---- norms (cuda_norms.cu) ----
    void rmsnorm(const float* x, const tensor_view& w, int n, int dim, float eps, float* out) override;
    void layernorm(const float* x, const tensor_view& w, const tensor_view& b, int n, int dim, float eps,
                   float* out) override;

    // ---- element-wise operations and row copies (cuda_elementwise.cu) ----
    void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                   int cols) override;
    void add_bias(float* y, const tensor_view& b, int n, int dim) override;
    void gelu(float* x, int64_t n) override;
    void geglu(float* gate, const float* up, int64_t n) override;
    void softcap(float* x, int64_t n, float cap) override;
    void swiglu(float* gate, const float* up, int64_t n) override;
    void add_scaled(float* x, const float* y, int64_t n, float s) override;
    void scale(float* x, int64_t n, float s) override;

    // ---- RoPE and attention (cuda_attention.cu) ----
    void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const rope_params& rp) override;
    void attention(const attention_args& a) override;

    // ---- MoE: routing on the device, the experts' weighted sums (cuda_moe.cu) ----
    void weighted_sum_rows(float* out, const float* rows, const int32_t* index, const float* weight, int n, int k,
                           int dim) override;
    bool moe_one(const moe_step& st) override;

    // ---- one-token steps as CUDA graphs (cuda_step_graphs.cu) ----
    bool step_replay(const void* key, int32_t pos) override;
    bool step_begin(const void* key, int32_t pos) override;
    bool step_end(const void* key) override;
    void step_abandon(const void* key) override;
    void step_forget(const void* key) override;

    // ---- the profile, COLIBRI_CUDA_PROFILE=1 (cuda_backend.cu) ----

    // The device time of each operation, by name: calls, total milliseconds, one line each,
    // the longest first ("" when not profiling).
    std::string profile_report();

private:
    void select() const { COLIBRI_CUDA(cudaSetDevice(device_)); }

    // ---- the profile (cuda_backend.cu) ----

    // Events around an operation on the stream, when profiling and not inside another timed
    // operation.
    class op_timer {
    public:
        op_timer(cuda_backend& be, const char* name) : be_(be), name_(name) {
            if (!be_.profiling_ || be_.timer_depth_++ > 0) return;
            start_ = make_event();
            stop_ = make_event();
            COLIBRI_CUDA(cudaEventRecord(start_.get(), be_.stream_.get()));
        }
        ~op_timer() {
            if (!be_.profiling_ || --be_.timer_depth_ > 0) return;
            cudaEventRecord(stop_.get(), be_.stream_.get());
            be_.pending_.push_back({name_, std::move(start_), std::move(stop_)});
            if (be_.pending_.size() >= 4096) be_.resolve_timings();
        }
        op_timer(const op_timer&) = delete;
        op_timer& operator=(const op_timer&) = delete;

    private:
        cuda_backend& be_;
        const char* name_;
        cuda_event start_, stop_;
    };

    // The pending events' times added to the totals (waits for the stream).
    void resolve_timings();

    struct timing {
        const char* name;
        cuda_event start, stop;
    };
    struct op_total {
        uint64_t calls = 0;
        double ms = 0;
    };

    // ---- buffers and copies (cuda_buffers.cu) ----

    // m holds at least `bytes`, once the operations queued with its old memory are done.
    void grow(device_memory& m, size_t bytes);

    // n host values into scratch slot `slot`, copied in stream order (a slot is not reused
    // before the operations queued with it have read it).
    template <class T>
    const T* upload(const T* host, size_t n, int slot) {
        if (capturing_) {
            // a recorded step reads its one position from step_position_, set before each
            // replay; any other host array would be baked in: the step is not recorded
            if (slot == position_slot && n == 1) return reinterpret_cast<const T*>(step_position_.get());
            recording_fails("a host array");
            return reinterpret_cast<const T*>(step_position_.get());
        }
        device_memory& m = scratch_[size_t(slot)];
        grow(m, std::max<size_t>(n, 1) * sizeof(T));
        COLIBRI_CUDA(cudaMemcpyAsync(m.get(), host, n * sizeof(T), cudaMemcpyHostToDevice, stream_.get()));
        return static_cast<const T*>(m.get());
    }
    static constexpr int position_slot = 1;

    // w on the device: copied there the first time, or, for a routed expert under a budget,
    // in its layer's expert cache.
    const device_weights& weights(const tensor_view& w);

    // ---- matrix products (cuda_matmul.cu) ----

    void product(const tensor_view& w, const float* x, const int32_t* x_rows, int n, float* y);
    template <device_kind K>
    void launch_product(const device_weights& d, const float* x, const int32_t* x_rows, int n, float* y);

    // ---- MoE (cuda_moe.cu) ----

    // A layer's experts: the shape and type of each of their matrices (the same for all),
    // and the device table of their weights.
    struct matrix_shape {
        device_kind kind;
        int64_t rows, cols, row_bytes;
        bool operator==(const matrix_shape&) const = default;
    };
    struct expert_table {
        matrix_shape gate, up, down;
        device_memory ptrs; // expert_ptrs[n_expert]
    };

    const expert_table* table_for(const moe_step& st);
    void launch_by_id(const matrix_shape& m, const expert_ptrs* table, int which, int n_which, const int32_t* ids,
                      int k, const float* x, int64_t x_stride, float* y);

    // Scratch of moe_one, each grown as needed.
    struct scratch {
        device_memory mem;
        float* f() const { return static_cast<float*>(mem.get()); }
        void reserve_floats(cuda_backend& be, size_t n) { be.grow(mem, std::max<size_t>(n, 1) * sizeof(float)); }
    };
    struct moe_scratch {
        scratch logits, probs, weights, ids, gu, y, sg, su, sy, sgate; // gu: the gates' outputs, then the ups'
    };

    // ---- one-token steps as CUDA graphs (cuda_step_graphs.cu) ----

    void set_step_position(int32_t pos);

    struct step_graph {
        int steps = 0;        // steps begun
        bool give_up = false; // a step could not be recorded: run them plainly
        cuda_graph_exec exec;
    };

    cuda_stream stream_; // first, so that it goes last: after the events and graphs made on it
    int device_;
    std::string name_;
    std::unordered_map<const uint8_t*, device_weights> weights_;
    device_memory scratch_[4]; // upload slots: token rows, positions, expert indices, expert weights
    device_memory scores_;     // attention: [n * n_head, n_ctx]
    std::vector<float> embed_rows_;
    expert_cache expert_cache_; // with a weight budget
    moe_scratch moe_;
    std::unordered_map<const expert_weights*, std::unique_ptr<expert_table>> tables_; // null: the session routes
    std::unordered_map<const void*, step_graph> steps_;
    bool capturing_ = false, capture_failed_ = false;
    const char* capture_failure_ = nullptr; // what stopped the last recording that failed
    // while recording: the step cannot be recorded (why: what it needed)
    void recording_fails(const char* why) {
        capture_failed_ = true;
        capture_failure_ = why;
    }
    // a recording that will be dropped: its remaining launches are skipped (they may lack
    // weights that could not be copied while recording)
    bool recording_failed() const { return capturing_ && capture_failed_; }
    uint64_t steps_replayed_ = 0, steps_recorded_ = 0, steps_not_recorded_ = 0;
    device_memory step_position_{sizeof(int32_t)};
    int32_t step_position_host_ = 0;
    bool profiling_ = false;
    int timer_depth_ = 0;
    std::vector<timing> pending_;
    std::map<std::string, op_total> totals_;
};

} // namespace colibri::cuda_detail
