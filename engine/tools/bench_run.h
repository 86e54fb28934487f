#pragma once
// colibri-bench's measurements: a model's load, prefill, decode and token pick, on the CPU
// against the machine's measured limits or on a GPU against its read bandwidth.

#include "model/profiled_backend.h"
#include "model/session.h"
#include "ops/backend.h"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace colibri {

struct kernel_table;

using bench_clock = std::chrono::steady_clock;

/// Decoded tokens between two measurements of the read bandwidth on the CPU.
constexpr int decode_stretch = 16;

/// What a run measures: its sizes and the extras asked for (the command line's options).
struct bench_options {
    int prompt_tokens = 512, gen_tokens = 128, reps = 3;
    int batch = session::default_batch; ///< most prompt tokens evaluated at once
    int bandwidth_mib = 1024;           ///< the bandwidth probe's buffer
    bool f32_act = false;               ///< --f32-act: f32 activations for q8_0/q4_0 weights
    bool by_op = false;                 ///< --ops: the last repetition timed by operation
    bool routing = false;               ///< --routing: expert selections of the last decode
};

/// Median, smallest and largest of a measurement's repetitions.
struct stats {
    double median = 0, min = 0, max = 0;
};

using op_table = std::array<profiled_backend::op_stats, profiled_backend::op_count>;

/// The sampler's pick between two decode steps, in microseconds: greedy, the default
/// parameters, and every token a candidate (top-k 0); the median of five timings.
struct pick_times {
    double greedy_us = 0, defaults_us = 0, all_us = 0;
};

/// Expert selections per layer (a session's route observer).
struct route_counts {
    int n_layer = 0, n_expert = 0;
    std::vector<uint64_t> counts; // [n_layer][n_expert]
    static void observe(void* user, int, int layer, const int32_t* e, const float*, int k) {
        auto* rc = static_cast<route_counts*>(user);
        for (int j = 0; j < k; ++j) ++rc->counts[size_t(layer) * size_t(rc->n_expert) + size_t(e[j])];
    }
};

/// One thread count's repetitions on the CPU, each against the machine's limits measured
/// just before it (on a shared host the read bandwidth moves by tens of percent a minute).
struct thread_run {
    int threads = 0;
    stats bandwidth, ceiling, machine_peak, used_peak; // bytes/s, tok/s, multiply-adds/s
    stats prefill_tps, decode_tps, ttft_ms;
    stats decode_fraction, prefill_fraction, prefill_used_fraction;
    // every decode stretch of every repetition: the probe it is compared with (bytes/s)
    // and the fraction of that ceiling it read
    std::vector<std::pair<double, double>> stretches;
    // --ops: the last repetition's decode by operation, its probes' mean (bytes/s), its
    // decode time and tokens; its prompt by operation and the prompt's time
    op_table ops{};
    double ops_probe = 0, ops_seconds = 0;
    int ops_tokens = 0;
    op_table prefill_ops{};
    double prefill_ops_seconds = 0;
};

/// A model measured on the CPU: what it is, its load, and one thread_run per thread count.
struct cpu_bench {
    bench_options options;
    std::string model_path, arch, weight_type, kernels;
    std::string cpu; // cpu_description()
    uint64_t file_bytes = 0, params = 0, params_active = 0;
    uint32_t n_vocab = 0;
    int n_batch = 0;
    double load_ms = 0, ready_ms = 0; // load to ready, process start to ready
    double page_in_ms = 0;            // the file's pages mapped in, before the repetitions
    double huge_share = -1;           // share of the weights' resident pages in 2 MiB pages; -1: unknown
    double weight_bytes = 0, kv_bytes = 0, bytes_per_token = 0; // read per decoded token
    long model_rss_kib = 0; // peak resident memory, the bandwidth probe's buffer left out
    pick_times pick;        // on the last decode step's logits
    route_counts routes;    // --routing: the last repetition's decode
    std::vector<thread_run> runs;
};

/// Loads `model_path` (timed to ready, and from process_start to ready), maps its pages in,
/// then measures it with each of `threads`.
cpu_bench run_on_cpu(const std::string& model_path, const std::vector<int>& threads, const kernel_table& kt,
                     const bench_options& options, bench_clock::time_point process_start);

/// A model measured on a GPU: prefill and decode against its measured read bandwidth.
struct device_bench {
    bench_options options;
    std::string model_path, arch, weight_type, device, backend;
    int n_batch = 0;
    size_t weight_budget = 0; // bytes of device memory for the weights; 0: no limit
    double load_ms = 0, ready_ms = 0;
    double upload_ms = 0; // the weights copied to the device during the first batch
    stats bandwidth, ceiling, prefill_tps, decode_tps, decode_fraction, ttft_ms;
    expert_cache_stats cache; // the decode phases', all repetitions
    std::string profile;      // recorded steps; with COLIBRI_CUDA_PROFILE=1 the device time by operation
};

/// --device cuda:N. The GPU's bandwidth does not move with other tenants' load: one probe
/// per repetition.
device_bench run_on_device(const std::string& model_path, const std::string& device, size_t weight_budget,
                           const bench_options& options, bench_clock::time_point process_start);

} // namespace colibri
