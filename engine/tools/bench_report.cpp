// colibri-bench's reports: a run's figures as text (with the tables of --ops) and as one
// JSON object per run, whose keys scripts and tests read.

#include "tools/bench_report.h"

#include "core/error.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace colibri {

namespace {

using json = nlohmann::ordered_json; // keys in the order written

// A figure at the precision it carries (a decimal fraction, or a whole number): the lines
// stay short, and a figure too small to show reads as zero.
double fixed(double v, int decimals) {
    const double scale = std::pow(10.0, decimals);
    return std::round(v * scale) / scale;
}
int64_t whole(double v) { return std::llround(v); }

json summary(const stats& s, int decimals) {
    return {{"median", fixed(s.median, decimals)}, {"min", fixed(s.min, decimals)}, {"max", fixed(s.max, decimals)}};
}

// [min, max], scaled
json range(const stats& s, double scale) { return json::array({fixed(s.min * scale, 4), fixed(s.max * scale, 4)}); }

const char* op_name(int i) { return profiled_backend::op_name(static_cast<profiled_backend::op>(i)); }

// the step's time outside every operation
double between_ops(const op_table& ops, double seconds) {
    for (const profiled_backend::op_stats& o : ops) seconds -= o.seconds;
    return seconds;
}

// --ops: a decode's operations, each as time per token, its share of the step, the bytes it
// reads, their rate, that rate against the read bandwidth (probe, bytes/s), and its time
// beyond what its bytes take at that bandwidth; then the time between operations (the
// session's own work and the token's pick).
void print_ops(const op_table& ops, double probe, double seconds, int tokens) {
    std::printf("  decode by operation (the last repetition through a timing wrapper; bytes against %.2f GB/s):\n",
                probe / 1e9);
    std::printf("    %-18s %10s %7s %9s %7s %8s %11s %6s\n", "operation", "us/token", "share", "MB/token", "GB/s",
                "of probe", "us beyond", "calls");
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        const double us = o.seconds / tokens * 1e6, mb = o.bytes / tokens / 1e6;
        std::printf("    %-18s %10.1f %6.1f%%", op_name(i), us, 100.0 * o.seconds / seconds);
        if (o.bytes > 0) {
            std::printf(" %9.2f %7.1f %8.3f %11.1f", mb, o.bytes / o.seconds / 1e9, o.bytes / o.seconds / probe,
                        us - o.bytes / probe / tokens * 1e6);
        } else {
            std::printf(" %9s %7s %8s %11.1f", "-", "-", "-", us);
        }
        std::printf(" %6.1f\n", double(o.calls) / tokens);
    }
    const double between = between_ops(ops, seconds);
    std::printf("    %-18s %10.1f %6.1f%%\n", "between operations", between / tokens * 1e6, 100.0 * between / seconds);
}

// --ops: the prompt's operations, each as its time, its share of the prompt and its calls
// (prefill is bound by arithmetic, not by bytes).
void print_prefill_ops(const op_table& ops, double seconds, int tokens) {
    std::printf("  prefill of %d tokens by operation (the last repetition through the timing wrapper, %.1f ms):\n",
                tokens, seconds * 1e3);
    std::printf("    %-18s %10s %7s %6s\n", "operation", "ms", "share", "calls");
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        std::printf("    %-18s %10.1f %6.1f%% %6llu\n", op_name(i), o.seconds * 1e3, 100.0 * o.seconds / seconds,
                    static_cast<unsigned long long>(o.calls));
    }
    const double between = between_ops(ops, seconds);
    std::printf("    %-18s %10.1f %6.1f%%\n", "between operations", between * 1e3, 100.0 * between / seconds);
}

json decode_ops_json(const op_table& ops, double probe, double seconds, int tokens) {
    json list = json::array();
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        list.push_back({{"op", op_name(i)},
                        {"us_per_token", fixed(o.seconds / tokens * 1e6, 2)},
                        {"bytes_per_token", whole(o.bytes / tokens)},
                        {"calls_per_token", fixed(double(o.calls) / tokens, 2)}});
    }
    return {{"probe_gbs", fixed(probe / 1e9, 3)},
            {"step_us", fixed(seconds / tokens * 1e6, 2)},
            {"ops", list},
            {"between_us", fixed(between_ops(ops, seconds) / tokens * 1e6, 2)}};
}

json prefill_ops_json(const op_table& ops, double seconds) {
    json list = json::array();
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        list.push_back({{"op", op_name(i)}, {"ms", fixed(o.seconds * 1e3, 3)}, {"calls", o.calls}});
    }
    return {{"ms", fixed(seconds * 1e3, 2)}, {"ops", list}, {"between_ms", fixed(between_ops(ops, seconds) * 1e3, 3)}};
}

// medians, and [min, max] as "..._range"
json run_json(const thread_run& r) {
    json stretches = json::array();
    for (const auto& [probe, fraction] : r.stretches) stretches.push_back({fixed(probe / 1e9, 3), fixed(fraction, 4)});
    json j = {{"threads", r.threads},
              {"read_bandwidth_gbs", fixed(r.bandwidth.median / 1e9, 3)},
              {"read_bandwidth_gbs_range", range(r.bandwidth, 1e-9)},
              {"decode_ceiling_tps", fixed(r.ceiling.median, 3)},
              {"decode_tps", summary(r.decode_tps, 3)},
              {"decode_fraction", fixed(r.decode_fraction.median, 4)},
              {"decode_fraction_range", range(r.decode_fraction, 1)},
              {"prefill_tps", summary(r.prefill_tps, 3)},
              {"ttft_ms", summary(r.ttft_ms, 2)},
              {"dot_peak_gmacs",
               {{"machine_int8", fixed(r.machine_peak.median / 1e9, 2)}, {"used", fixed(r.used_peak.median / 1e9, 2)}}},
              {"prefill_fraction_of_int8_peak", fixed(r.prefill_fraction.median, 4)},
              {"prefill_fraction_of_int8_peak_range", range(r.prefill_fraction, 1)},
              {"prefill_fraction_of_used_peak", fixed(r.prefill_used_fraction.median, 4)},
              {"decode_stretches", stretches}};
    if (r.ops_tokens > 0) j["decode_ops"] = decode_ops_json(r.ops, r.ops_probe, r.ops_seconds, r.ops_tokens);
    if (r.prefill_ops_seconds > 0) j["prefill_ops"] = prefill_ops_json(r.prefill_ops, r.prefill_ops_seconds);
    return j;
}

// a model path need not be UTF-8: its stray bytes replaced rather than thrown at
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

} // namespace

std::string json_line(const cpu_bench& b) {
    const bench_options& o = b.options;
    json runs = json::array();
    for (const thread_run& r : b.runs) runs.push_back(run_json(r));
    const json j = {{"model", b.model_path},
                    {"arch", b.arch},
                    {"weight_type", b.weight_type},
                    {"kernels", b.kernels},
                    {"cpu", b.cpu},
                    {"int8_activations", !o.f32_act},
                    {"file_bytes", b.file_bytes},
                    {"params", b.params},
                    {"params_active", b.params_active},
                    {"bytes_per_token", whole(b.bytes_per_token)},
                    {"prompt_tokens", o.prompt_tokens},
                    {"batch", b.n_batch},
                    {"gen_tokens", o.gen_tokens},
                    {"reps", o.reps},
                    {"load_ms", fixed(b.load_ms, 2)},
                    {"process_start_to_ready_ms", fixed(b.ready_ms, 2)},
                    {"page_in_ms", fixed(b.page_in_ms, 2)},
                    {"weights_in_2mib_pages", fixed(b.huge_share, 4)},
                    {"peak_rss_kib", b.model_rss_kib},
                    {"pick_us",
                     {{"greedy", fixed(b.pick.greedy_us, 3)},
                      {"defaults", fixed(b.pick.defaults_us, 3)},
                      {"top_k_0", fixed(b.pick.all_us, 3)}}},
                    {"runs", runs}};
    return dump(j);
}

std::string json_line(const device_bench& b) {
    const bench_options& o = b.options;
    const double decoded = double(o.gen_tokens) * o.reps, used = double(b.cache.hits + b.cache.misses);
    const json j = {{"model", b.model_path},
                    {"arch", b.arch},
                    {"weight_type", b.weight_type},
                    {"device", b.device},
                    {"backend", b.backend},
                    {"prompt_tokens", o.prompt_tokens},
                    {"batch", b.n_batch},
                    {"gen_tokens", o.gen_tokens},
                    {"reps", o.reps},
                    {"load_ms", fixed(b.load_ms, 2)},
                    {"process_start_to_ready_ms", fixed(b.ready_ms, 2)},
                    {"weights_upload_ms", fixed(b.upload_ms, 2)},
                    {"read_bandwidth_gbs", fixed(b.bandwidth.median / 1e9, 3)},
                    {"decode_ceiling_tps", fixed(b.ceiling.median, 3)},
                    {"decode_tps", summary(b.decode_tps, 3)},
                    {"decode_fraction", fixed(b.decode_fraction.median, 4)},
                    {"prefill_tps", summary(b.prefill_tps, 3)},
                    {"ttft_ms", summary(b.ttft_ms, 2)},
                    {"weight_budget_mib", b.weight_budget >> 20},
                    {"expert_cache",
                     {{"slots_per_layer", b.cache.slots_per_layer},
                      {"hit_rate", fixed(used > 0 ? double(b.cache.hits) / used : 1.0, 4)},
                      {"misses_per_token", fixed(double(b.cache.misses) / decoded, 3)},
                      {"bytes_copied_per_token", whole(double(b.cache.bytes_copied) / decoded)}}}};
    return dump(j);
}

void print_text(const cpu_bench& b) {
    const bench_options& o = b.options;
    std::printf("model %s: %s, %s weights, %.1f MiB, %.1fM parameters (%.1fM active), %s kernels%s\n",
                b.model_path.c_str(), b.arch.c_str(), b.weight_type.c_str(), double(b.file_bytes) / 1048576.0,
                double(b.params) / 1e6, double(b.params_active) / 1e6, b.kernels.c_str(),
                o.f32_act ? ", f32 activations" : ", int8 activations");
    std::printf("cpu %s\n", b.cpu.c_str());
    std::printf(
        "load to ready %.1f ms (process start to ready %.1f ms, not counting a random model's writing; then the "
        "weights' pages mapped in, %.1f ms, before the repetitions); bytes read per decoded token %.1f MiB "
        "(weights %.1f MiB + KV cache %.2f MiB)\n",
        b.load_ms, b.ready_ms, b.page_in_ms, b.bytes_per_token / 1048576.0, b.weight_bytes / 1048576.0,
        b.kv_bytes / 1048576.0);
    if (b.huge_share >= 0) {
        std::printf("weights in 2 MiB pages: %.0f%% of their resident pages (4 KiB pages read a few percent slower; "
                    "docs/performance-log.md)\n",
                    100.0 * b.huge_share);
    }
    std::printf("prompt %d tokens (batches of %d), %d decoded, %d repetitions: median [min-max]\n", o.prompt_tokens,
                b.n_batch, o.gen_tokens, o.reps);
    std::printf("decode: every %d tokens against the read bandwidth measured just before and after them; prefill: each "
                "repetition against the int8 peak measured just before it\n",
                decode_stretch);
    for (const thread_run& r : b.runs) {
        std::printf("threads %d: read bandwidth %.2f GB/s [%.2f-%.2f] -> decode ceiling %.2f tok/s\n", r.threads,
                    r.bandwidth.median / 1e9, r.bandwidth.min / 1e9, r.bandwidth.max / 1e9, r.ceiling.median);
        std::printf("  decode  %8.2f tok/s [%.2f-%.2f]  %5.1f%% of the ceiling [%.1f-%.1f]\n", r.decode_tps.median,
                    r.decode_tps.min, r.decode_tps.max, 100.0 * r.decode_fraction.median, 100.0 * r.decode_fraction.min,
                    100.0 * r.decode_fraction.max);
        std::printf("  prefill %8.2f tok/s [%.2f-%.2f]  %5.1f%% of the machine's int8 peak (%.1f GMAC/s) [%.1f-%.1f], "
                    "%5.1f%% of "
                    "the kernel used on cached data (%.1f GMAC/s)\n",
                    r.prefill_tps.median, r.prefill_tps.min, r.prefill_tps.max, 100.0 * r.prefill_fraction.median,
                    r.machine_peak.median / 1e9, 100.0 * r.prefill_fraction.min, 100.0 * r.prefill_fraction.max,
                    100.0 * r.prefill_used_fraction.median, r.used_peak.median / 1e9);
        std::printf("  time to first token %.1f ms [%.1f-%.1f]\n", r.ttft_ms.median, r.ttft_ms.min, r.ttft_ms.max);
        if (r.prefill_ops_seconds > 0) print_prefill_ops(r.prefill_ops, r.prefill_ops_seconds, o.prompt_tokens);
        if (r.ops_tokens > 0) print_ops(r.ops, r.ops_probe, r.ops_seconds, r.ops_tokens);
    }
    std::printf("peak RSS %.1f MiB (the model running, without the probes)\n", double(b.model_rss_kib) / 1024.0);
    std::printf("token pick on the last step's logits (%u tokens): greedy %.1f us, defaults (temperature 0.8, "
                "top-k 40, top-p 0.95, min-p 0.05) %.1f us, top-k 0 %.1f us\n",
                b.n_vocab, b.pick.greedy_us, b.pick.defaults_us, b.pick.all_us);
    if (o.routing && b.routes.n_expert > 0) {
        std::printf("expert selections per layer during decode (last repetition):\n");
        for (int il = 0; il < b.routes.n_layer; ++il) {
            std::printf("  layer %2d:", il);
            for (int e = 0; e < b.routes.n_expert; ++e) {
                std::printf(" %llu", static_cast<unsigned long long>(
                                         b.routes.counts[size_t(il) * size_t(b.routes.n_expert) + size_t(e)]));
            }
            std::printf("\n");
        }
    }
}

void print_text(const device_bench& b) {
    const bench_options& o = b.options;
    const stats &bw = b.bandwidth, &dt = b.decode_tps, &f = b.decode_fraction, &p = b.prefill_tps, &tt = b.ttft_ms;
    std::printf("model %s: %s, %s weights, on %s\n", b.model_path.c_str(), b.arch.c_str(), b.weight_type.c_str(),
                b.backend.c_str());
    std::printf("load to ready %.1f ms (process start to ready %.1f ms); weights copied to the device during the first "
                "batch: %.1f ms\n",
                b.load_ms, b.ready_ms, b.upload_ms);
    std::printf("prompt %d tokens (batches of %d), %d decoded, %d repetitions: median [min-max]\n", o.prompt_tokens,
                b.n_batch, o.gen_tokens, o.reps);
    std::printf("device read bandwidth %.1f GB/s [%.1f-%.1f] -> decode ceiling %.1f tok/s\n", bw.median / 1e9,
                bw.min / 1e9, bw.max / 1e9, b.ceiling.median);
    std::printf("  decode  %8.2f tok/s [%.2f-%.2f]  %5.1f%% of the ceiling [%.1f-%.1f]\n", dt.median, dt.min, dt.max,
                100.0 * f.median, 100.0 * f.min, 100.0 * f.max);
    std::printf("  prefill %8.2f tok/s [%.2f-%.2f]\n", p.median, p.min, p.max);
    std::printf("  time to first token %.1f ms [%.1f-%.1f]\n", tt.median, tt.min, tt.max);
    if (!b.profile.empty()) std::printf("%s", b.profile.c_str());
    if (b.weight_budget > 0) {
        const double decoded = double(o.gen_tokens) * o.reps, used = double(b.cache.hits + b.cache.misses);
        const double hit_rate = used > 0 ? double(b.cache.hits) / used : 1.0;
        std::printf(
            "weights within %zu MiB of device memory: %d experts per MoE layer kept; during decode %.1f%% of the "
            "experts used were there, %.2f copied in per token (%.1f MiB)\n",
            b.weight_budget >> 20, b.cache.slots_per_layer, 100.0 * hit_rate, double(b.cache.misses) / decoded,
            double(b.cache.bytes_copied) / decoded / 1048576.0);
    }
}

void emit_json(const std::string& line, const std::string& json_file, bool to_stdout) {
    if (!json_file.empty()) {
        std::ofstream f(json_file, std::ios::app);
        if (!f) throw error(errc::io, json_file + ": cannot open");
        f << line << '\n';
    }
    if (to_stdout) std::printf("%s\n", line.c_str());
}

} // namespace colibri
