// colibri-bench: prefill and decode speed, time to first token, load time and peak memory
// of a model on the CPU, against the machine's measured limits (the roofline).

#include "api/runtime.h"
#include "convert/convert.h"
#include "core/cpu_count.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "tools/machine_limits.h"
#include "cpu/kernel_table.h"
#include "cuda/bandwidth_probe.h"
#include "cuda/cuda_backend.h"
#include "model/session.h"
#include "model/profiled_backend.h"
#include "sampling/sampler.h"
#include "tools/bench_speculative.h"
#include "command_line.hpp"

#include <algorithm>
#include <array>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <sys/resource.h>

namespace po = boost::program_options;
using namespace colibri;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> v;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) v.push_back(std::stoi(item));
    if (v.empty()) throw error(errc::invalid_argument, "empty list '" + s + "'");
    return v;
}

// Decoded tokens between two measurements of the read bandwidth, and the passes of each
// (one of each of the probe's stream counts: read_probe::measure).
constexpr int decode_stretch = 16;
constexpr int probe_passes = 3;

struct stats {
    double median = 0, min = 0, max = 0;
};
stats summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    stats s;
    s.min = v.front();
    s.max = v.back();
    s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    return s;
}

// The sampler's pick between two decode steps, in microseconds: greedy, the default
// parameters, and every token a candidate (top-k 0); the median of five timings.
struct pick_times {
    double greedy_us, defaults_us, all_us;
};

pick_times time_picks(const std::vector<float>& logits) {
    const int n_vocab = static_cast<int>(logits.size());
    sampler smp(n_vocab);
    const auto time = [&](sampling_params p, int picks) {
        smp.set_params(p);
        std::vector<double> us;
        for (int rep = 0; rep < 5; ++rep) {
            const auto t0 = clock_type::now();
            for (int i = 0; i < picks; ++i) smp.sample(logits.data(), {});
            us.push_back(ms_since(t0) * 1000.0 / picks);
        }
        std::sort(us.begin(), us.end());
        return us[2];
    };
    sampling_params greedy, all;
    greedy.temperature = 0.0f;
    all.top_k = 0;
    return {time(greedy, 200), time(sampling_params{}, 200), time(all, 20)};
}

// --ops: a decode's operations, each as time per token, its share of the step, the bytes it
// reads, their rate, that rate against the read bandwidth (probe, bytes/s), and its time
// beyond what its bytes take at that bandwidth; then the time between operations (the
// session's own work and the token's pick). Text, or one JSON object.
using op_table = std::array<profiled_backend::op_stats, profiled_backend::op_count>;

// the step's time outside every operation
double between_ops(const op_table& ops, double seconds) {
    for (const profiled_backend::op_stats& o : ops) seconds -= o.seconds;
    return seconds;
}

void print_ops(const op_table& ops, double probe, double seconds, int tokens) {
    std::printf("  decode by operation (the last repetition through a timing wrapper; bytes against %.2f GB/s):\n", probe / 1e9);
    std::printf("    %-18s %10s %7s %9s %7s %8s %11s %6s\n", "operation", "us/token", "share", "MB/token", "GB/s", "of probe",
                "us beyond", "calls");
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        const double us = o.seconds / tokens * 1e6, mb = o.bytes / tokens / 1e6;
        std::printf("    %-18s %10.1f %6.1f%%", profiled_backend::op_name(static_cast<profiled_backend::op>(i)), us,
                    100.0 * o.seconds / seconds);
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
    std::printf("  prefill of %d tokens by operation (the last repetition through the timing wrapper, %.1f ms):\n", tokens,
                seconds * 1e3);
    std::printf("    %-18s %10s %7s %6s\n", "operation", "ms", "share", "calls");
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        std::printf("    %-18s %10.1f %6.1f%% %6llu\n", profiled_backend::op_name(static_cast<profiled_backend::op>(i)),
                    o.seconds * 1e3, 100.0 * o.seconds / seconds, static_cast<unsigned long long>(o.calls));
    }
    const double between = between_ops(ops, seconds);
    std::printf("    %-18s %10.1f %6.1f%%\n", "between operations", between * 1e3, 100.0 * between / seconds);
}

void write_prefill_ops_json(FILE* f, const op_table& ops, double seconds) {
    std::fprintf(f, ",\"prefill_ops\":{\"ms\":%.2f,\"ops\":[", seconds * 1e3);
    bool first = true;
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        std::fprintf(f, "%s{\"op\":\"%s\",\"ms\":%.3f,\"calls\":%llu}", first ? "" : ",",
                     profiled_backend::op_name(static_cast<profiled_backend::op>(i)), o.seconds * 1e3,
                     static_cast<unsigned long long>(o.calls));
        first = false;
    }
    std::fprintf(f, "],\"between_ms\":%.3f}", between_ops(ops, seconds) * 1e3);
}

void write_ops_json(FILE* f, const op_table& ops, double probe, double seconds, int tokens) {
    std::fprintf(f, ",\"decode_ops\":{\"probe_gbs\":%.3f,\"step_us\":%.2f,\"ops\":[", probe / 1e9, seconds / tokens * 1e6);
    bool first = true;
    for (int i = 0; i < profiled_backend::op_count; ++i) {
        const profiled_backend::op_stats& o = ops[size_t(i)];
        if (o.calls == 0) continue;
        std::fprintf(f, "%s{\"op\":\"%s\",\"us_per_token\":%.2f,\"bytes_per_token\":%.0f,\"calls_per_token\":%.2f}", first ? "" : ",",
                     profiled_backend::op_name(static_cast<profiled_backend::op>(i)), o.seconds / tokens * 1e6, o.bytes / tokens,
                     double(o.calls) / tokens);
        first = false;
    }
    std::fprintf(f, "],\"between_us\":%.2f}", between_ops(ops, seconds) / tokens * 1e6);
}

struct route_counts {
    int n_expert = 0;
    std::vector<uint64_t> counts; // [n_layer][n_expert]
    static void observe(void* user, int, int layer, const int32_t* e, const float*, int k) {
        auto* rc = static_cast<route_counts*>(user);
        for (int j = 0; j < k; ++j) ++rc->counts[size_t(layer) * size_t(rc->n_expert) + size_t(e[j])];
    }
};

// Peak resident memory since the last reset_peak_rss (the kernel's high-water mark), so
// that the bandwidth probe's buffer and a random model's writing are not counted.
long peak_rss_kib() {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
    }
    rusage ru{}; // no procfs: the peak of the whole process
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

void reset_peak_rss() {
    std::ofstream("/proc/self/clear_refs") << "5"; // 5: the high-water mark back to the current RSS
}

// The share of a mapping's resident pages that are 2 MiB pages, from /proc/self/smaps: the
// mapping that holds `addr`; -1 where the kernel does not tell. A model file's page cache
// holds it in 2 MiB folios when it was written in 2 MiB chunks (the converter) or read from
// disk, and in 4 KiB pages after most other writers; 2 MiB pages read a few percent faster.
double huge_page_share(const void* addr) {
    const long rss = mapping_kib(addr, "Rss"), pmd = mapping_kib(addr, "FilePmdMapped");
    return rss > 0 && pmd >= 0 ? double(pmd) / double(rss) : -1;
}

// n token ids, 3 and above, the same for the same repetition on every device.
std::vector<int32_t> random_prompt(int n, uint32_t n_vocab, int rep) {
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    uint64_t st = 0x9E3779B97F4A7C15ull + uint64_t(rep);
    for (auto& id : prompt) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        id = static_cast<int32_t>(3 + (st >> 33) % (n_vocab - 3));
    }
    return prompt;
}

// The JSON line write() prints: appended to json_file when set, on stdout when asked.
void emit_json(const std::function<void(FILE*)>& write, const std::string& json_file, bool to_stdout) {
    if (!json_file.empty()) {
        FILE* f = std::fopen(json_file.c_str(), "a");
        if (f == nullptr) throw error(errc::io, json_file + ": cannot open");
        write(f);
        std::fclose(f);
    }
    if (to_stdout) write(stdout);
}

// --device cuda:N: prefill and decode on the GPU against its measured read bandwidth. The
// GPU's bandwidth does not move with other tenants' load: one probe per repetition.
int run_on_device(const std::string& model_path, const std::string& device, size_t weight_budget, int prompt_tokens,
                  int gen_tokens, int reps, int batch, size_t probe_bytes, bool json, const std::string& json_file,
                  clock_type::time_point process_start) {
    const device_spec d = parse_device(device);
    const auto t_load = clock_type::now();
    auto rt = load_runtime(model_path, device, 0, false, weight_budget);
    const auto& hp = rt->mdl->hp();
    const int n_ctx = prompt_tokens + gen_tokens + 1;
    const int n_batch = std::min(prompt_tokens, batch);
    { session warm(*rt->mdl, *rt->be, n_ctx, n_batch); } // ready: a session can be made
    const double load_ms = ms_since(t_load);
    const double ready_ms = ms_since(process_start);
    const double w_bytes = rt->mdl->decode_weight_bytes();
    std::vector<double> bw, ceilings, pre, dec, ttft, frac;
    double upload_ms = 0;
    expert_cache_stats decode_cache{}; // the decode phases' expert cache counters, all repetitions
    for (int rep = 0; rep < reps; ++rep) {
        session s(*rt->mdl, *rt->be, n_ctx, n_batch);
        const std::vector<int32_t> prompt = random_prompt(prompt_tokens, hp.n_vocab, rep);
        if (rep == 0) { // the weights go to the device the first time each is used
            const auto t = clock_type::now();
            s.eval(prompt.data(), std::min(n_batch, prompt_tokens));
            upload_ms = ms_since(t);
            s.truncate(0);
        }
        const auto t0 = clock_type::now();
        for (int i = 0; i < prompt_tokens; i += n_batch) s.eval(prompt.data() + i, std::min(n_batch, prompt_tokens - i));
        int32_t id = argmax(s.logits(), static_cast<int>(hp.n_vocab)); // each step's logits come back to the host
        const double t_first = ms_since(t0);
        const double band = measure_device_read_bandwidth(d.index, probe_bytes, 5);
        double bytes = 0;
        const expert_cache_stats before = rt->be->expert_cache_usage();
        const auto t1 = clock_type::now();
        for (int k = 0; k < gen_tokens; ++k) {
            bytes += w_bytes + double(s.kv_bytes_read(s.n_past()));
            s.eval(&id, 1);
            id = argmax(s.logits(), static_cast<int>(hp.n_vocab));
        }
        const double t_dec = ms_since(t1);
        const expert_cache_stats after = rt->be->expert_cache_usage();
        decode_cache.slots_per_layer = after.slots_per_layer;
        decode_cache.hits += after.hits - before.hits;
        decode_cache.misses += after.misses - before.misses;
        decode_cache.bytes_copied += after.bytes_copied - before.bytes_copied;
        bw.push_back(band);
        const double bytes_per_token = bytes / gen_tokens;
        ceilings.push_back(band / bytes_per_token);
        pre.push_back(prompt_tokens * 1000.0 / t_first);
        dec.push_back(gen_tokens * 1000.0 / t_dec);
        ttft.push_back(t_first);
        frac.push_back(bytes * 1000.0 / t_dec / band);
    }
    const stats b = summarise(bw), c = summarise(ceilings), p = summarise(pre), dt = summarise(dec), f = summarise(frac),
                tt = summarise(ttft);
    const std::string weight_type(format::dtype_name(static_cast<format::dtype>(hp.weight_type)));
    const double decoded = double(gen_tokens) * reps, used = double(decode_cache.hits + decode_cache.misses);
    const double hit_rate = used > 0 ? double(decode_cache.hits) / used : 1.0;
    auto write_json = [&](FILE* out) {
        std::fprintf(out, "{\"model\":\"%s\",\"arch\":\"%s\",\"weight_type\":\"%s\",\"device\":\"%s\",\"backend\":\"%s\","
                          "\"prompt_tokens\":%d,\"batch\":%d,\"gen_tokens\":%d,\"reps\":%d,\"load_ms\":%.2f,"
                          "\"process_start_to_ready_ms\":%.2f,\"weights_upload_ms\":%.2f,\"read_bandwidth_gbs\":%.3f,"
                          "\"decode_ceiling_tps\":%.3f,\"decode_tps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f},"
                          "\"decode_fraction\":%.4f,\"prefill_tps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f},"
                          "\"ttft_ms\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},\"weight_budget_mib\":%zu,"
                          "\"expert_cache\":{\"slots_per_layer\":%d,\"hit_rate\":%.4f,\"misses_per_token\":%.3f,"
                          "\"bytes_copied_per_token\":%.0f}}\n",
                     model_path.c_str(), format::arch_name(static_cast<format::arch>(hp.arch)).data(), weight_type.c_str(),
                     device.c_str(), rt->be->name().c_str(), prompt_tokens, n_batch, gen_tokens, reps, load_ms, ready_ms, upload_ms,
                     b.median / 1e9, c.median, dt.median, dt.min, dt.max, f.median, p.median, p.min, p.max, tt.median, tt.min,
                     tt.max, weight_budget >> 20, decode_cache.slots_per_layer, hit_rate, double(decode_cache.misses) / decoded,
                     double(decode_cache.bytes_copied) / decoded);
    };
    emit_json(write_json, json_file, json);
    if (json) return 0;
    std::printf("model %s: %s, %s weights, on %s\n", model_path.c_str(), format::arch_name(static_cast<format::arch>(hp.arch)).data(),
                weight_type.c_str(), rt->be->name().c_str());
    std::printf("load to ready %.1f ms (process start to ready %.1f ms); weights copied to the device during the first "
                "batch: %.1f ms\n", load_ms, ready_ms, upload_ms);
    std::printf("prompt %d tokens (batches of %d), %d decoded, %d repetitions: median [min-max]\n", prompt_tokens, n_batch,
                gen_tokens, reps);
    std::printf("device read bandwidth %.1f GB/s [%.1f-%.1f] -> decode ceiling %.1f tok/s\n", b.median / 1e9, b.min / 1e9,
                b.max / 1e9, c.median);
    std::printf("  decode  %8.2f tok/s [%.2f-%.2f]  %5.1f%% of the ceiling [%.1f-%.1f]\n", dt.median, dt.min, dt.max,
                100.0 * f.median, 100.0 * f.min, 100.0 * f.max);
    std::printf("  prefill %8.2f tok/s [%.2f-%.2f]\n", p.median, p.min, p.max);
    std::printf("  time to first token %.1f ms [%.1f-%.1f]\n", tt.median, tt.min, tt.max);
    const std::string profile = cuda_profile_report(*rt->be);
    if (!profile.empty()) std::printf("%s", profile.c_str());
    if (weight_budget > 0) {
        std::printf("weights within %zu MiB of device memory: %d experts per MoE layer kept; during decode %.1f%% of the "
                    "experts used were there, %.2f copied in per token (%.1f MiB)\n",
                    weight_budget >> 20, decode_cache.slots_per_layer, 100.0 * hit_rate, double(decode_cache.misses) / decoded,
                    double(decode_cache.bytes_copied) / decoded / 1048576.0);
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    auto process_start = clock_type::now();
    std::string model_path, shape, quant = "q8_0", threads_list, cache_dir, json_file, device = "cpu", speculative;
    int gpu_memory_mib = 0;
    int prompt_tokens = 512, gen_tokens = 128, reps = 3, bandwidth_mib = 1024, batch = session::default_batch;
    po::options_description opts("colibri-bench: measure a model on the CPU (or a GPU: --device) against the machine's limits\n\n"
                                 "  colibri-bench --model FILE [options]\n"
                                 "  colibri-bench --shape mixtral-like|fine-grained|deepseek-v2-lite [--quant q8_0|q4_0|...] [options]\n\n"
                                 "Options");
    opts.add_options()
        ("help,h", "show this help")
        ("model,m", po::value(&model_path), "a .colibri file")
        ("shape", po::value(&shape), "random-weight model instead: mixtral-like (dim 1024, 16 layers, 16/8 heads, "
                                      "8 experts top-2, FFN 2816) or fine-grained (dim 1024, 24 layers, 16/8 heads, "
                                      "32 experts top-8, FFN 512), vocabulary 32000; or deepseek-v2-lite (dim 2048, 27 layers, "
                                      "latent attention of rank 512 over 16 heads, 64 experts top-6 of 1408 plus two "
                                      "shared, a first dense layer of 10944, vocabulary 102400)")
        ("quant", po::value(&quant), "weight type of the random model, as colibri-convert's --quant (default q8_0)")
        ("cache-dir", po::value(&cache_dir), "where random models are kept between runs (default: the temp directory)")
        ("device", po::value(&device), "cpu (default) or cuda:N: on a GPU, decode against its measured read bandwidth")
        ("gpu-memory", po::value(&gpu_memory_mib), "on a GPU: MiB of device memory for the weights (default 0: no limit); "
                                                   "reports the expert cache's hit rate")
        ("threads,t", po::value(&threads_list), "comma-separated thread counts (default: the CPUs this process may use)")
        ("prompt-tokens", po::value(&prompt_tokens), "prefill length (default 512)")
        ("batch", po::value(&batch), "most prompt tokens evaluated at once (default 128, as in colibrid)")
        ("gen-tokens", po::value(&gen_tokens), "decoded tokens (default 128)")
        ("reps", po::value(&reps), "repetitions per thread count (default 3)")
        ("bandwidth-mib", po::value(&bandwidth_mib), "buffer of the bandwidth probe (default 1024 MiB)")
        ("f32-act", "keep activations in f32 for q8_0/q4_0 weights (default: int8 integer dot products)")
        ("routing", "print per-layer expert selection counts of the decode phase")
        ("speculative", po::value(&speculative), "instead: a greedy completion of --gen-tokens after the prompt in this "
                                                 "file, plainly and with drafts from the context, alternating --reps times "
                                                 "(the first --threads count)")
        ("ops", "time the last repetition's prefill and decode by operation (on the CPU), decode's each against its "
                "bytes at the read bandwidth")
        ("json", "print one JSON object instead of text")
        ("json-file", po::value(&json_file), "also append the JSON object as one line to this file");
    po::variables_map vm;
    if (const int status = cli::parse(argc, argv, "colibri-bench", opts, vm); status >= 0) return status;
    if (model_path.empty() == shape.empty()) return cli::usage_error("colibri-bench", "give one of --model or --shape");
    if (prompt_tokens < 1 || gen_tokens < 1 || reps < 1 || batch < 1 || batch > 4096) {
        std::cerr << "colibri-bench: --prompt-tokens, --gen-tokens and --reps must be at least 1, --batch 1..4096\n";
        return 2;
    }
    const bool json = vm.count("json") > 0;
    if (vm.count("ops") && parse_device(device).type != device_spec::kind::cpu) {
        std::cerr << "colibri-bench: --ops times the CPU's operations; on a GPU, COLIBRI_CUDA_PROFILE=1 reports each "
                     "operation's device time\n";
        return 2;
    }
    try {
        usable_device(device); // before a random model is written for nothing
        if (!shape.empty()) {
            random_model_options o;
            o.n_embd = 1024;
            o.n_head = 16;
            o.n_head_kv = 8;
            o.head_dim = 64;
            o.n_vocab = 32000;
            if (shape == "mixtral-like") {
                o.n_layer = 16;
                o.n_expert = 8;
                o.n_expert_used = 2;
                o.n_ff_exp = 2816;
            } else if (shape == "fine-grained") {
                o.n_layer = 24;
                o.n_expert = 32;
                o.n_expert_used = 8;
                o.n_ff_exp = 512;
            } else if (shape == "deepseek-v2-lite") { // DeepSeek-V2-Lite's (DeepSeek-Coder-V2-Lite's) shape
                o.arch = format::arch::deepseek2;
                o.n_layer = 27;
                o.n_embd = 2048;
                o.n_head_kv = 1;
                o.head_dim = 192;
                o.kv_lora_rank = 512;
                o.rope_dim = 64;
                o.v_head_dim = 128;
                o.n_expert = 64;
                o.n_expert_used = 6;
                o.n_ff_exp = 1408;
                o.n_ff_shexp = 2 * 1408;
                o.n_dense_lead = 1;
                o.n_ff = 10944;
                o.n_vocab = 102400;
            } else {
                throw error(errc::invalid_argument, "unknown --shape '" + shape + "'");
            }
            const quant_choice q = quant_choice::parse(quant);
            // named after the type the matrices are stored as: a file from before a layout
            // change is not taken for a current one
            const std::string stored = std::string(format::dtype_name(format::matmul_storage(q.base(), 8))) + (q.is_mix() ? "-mix" : "");
            const auto dir = cache_dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(cache_dir);
            model_path = (dir / ("colibri-bench-" + shape + "-" + stored + ".colibri")).string();
            if (!std::filesystem::exists(model_path)) {
                // the tokenizer only labels the ids; any sentencepiece model that fits will do
                // (next to the build tree, the source tree, or COLIBRI_FIXTURES_DIR)
                const auto exe_dir = std::filesystem::canonical("/proc/self/exe").parent_path();
                o.tokenizer_model = (exe_dir / "../../tests/fixtures/tokenizer/tokenizer.model").string();
                if (!std::filesystem::exists(o.tokenizer_model)) o.tokenizer_model = COLIBRI_SOURCE_DIR "/tests/fixtures/tokenizer/tokenizer.model";
                if (const char* fixtures = std::getenv("COLIBRI_FIXTURES_DIR")) o.tokenizer_model = std::string(fixtures) + "/tokenizer/tokenizer.model";
                if (!json) std::fprintf(stderr, "writing %s ...\n", model_path.c_str());
                write_random_model(o, model_path, q, {});
                process_start = clock_type::now(); // start-up is measured without the writing
            }
        }
        if (parse_device(device).type != device_spec::kind::cpu) {
            if (gpu_memory_mib < 0) throw error(errc::invalid_argument, "--gpu-memory must not be negative");
            return run_on_device(model_path, device, size_t(gpu_memory_mib) << 20, prompt_tokens, gen_tokens, reps, batch,
                                 size_t(bandwidth_mib) << 20, json, json_file, process_start);
        }
        const kernel_table& kt = best_kernel_table();
        const std::vector<int> threads = threads_list.empty() ? std::vector<int>{usable_cpu_count()} : parse_list(threads_list);
        if (!speculative.empty()) return run_speculative(model_path, speculative, threads.front(), gen_tokens, reps, json);

        // load to ready: map + validate + tokenizer + backend + a session
        const auto t_load = clock_type::now();
        auto rt = load_runtime(model_path, "cpu", threads.front());
        const auto& hp = rt->mdl->hp();
        const int n_ctx = prompt_tokens + gen_tokens + 1;
        const int n_batch = std::min(prompt_tokens, batch);
        size_t kv_token_bytes = 0; // keys and values of one position, all layers (f16 or f32)
        {
            session warm(*rt->mdl, *rt->be, n_ctx, n_batch);
            kv_token_bytes = warm.token_bytes();
        }
        const double load_ms = ms_since(t_load);
        const double ready_ms = ms_since(process_start);
        // The file's pages mapped into the process before the timed repetitions, as colibrid's
        // worker maps them after loading (start_page_in), here waited for: otherwise the first
        // repetition's prefill would take a fault per page.
        start_page_in(*rt, 0);
        rt->paging->wait();
        const double page_in_ms = rt->paging->elapsed_ms();
        const double huge_share = huge_page_share(rt->mdl->file().tensors().front().data);

        const double w_bytes = rt->mdl->decode_weight_bytes();
        // the prefill kernel measured on cached data is the one the layers' matrices use
        const layer_weights& first = rt->mdl->layers().front();
        const format::dtype matrix_type = (first.wq != nullptr ? first.wq : first.mla.q_nope)->type;
        const double kv_bytes = double(kv_token_bytes) * (prompt_tokens + gen_tokens / 2.0);
        const double bytes_per_token = w_bytes + kv_bytes;
        const double macs_per_token = double(rt->mdl->n_params_active()) - hp.n_embd;

        // Each repetition is measured against the machine's limits measured just before it:
        // on a shared host the read bandwidth moves by tens of percent within a minute.
        struct result {
            int threads;
            stats bandwidth, ceiling, machine_peak, used_peak; // bytes/s, tok/s, multiply-adds/s
            stats prefill_tps, decode_tps, ttft_ms;
            stats decode_fraction, prefill_fraction, prefill_used_fraction;
            // every decode stretch of every repetition: the probe it is compared with
            // (bytes/s) and the fraction of that ceiling it read
            std::vector<std::pair<double, double>> stretches;
            // --ops: the last repetition's decode by operation, its probes' mean (bytes/s),
            // its decode time and tokens; its prompt by operation and the prompt's time
            op_table ops{};
            double ops_probe = 0, ops_seconds = 0;
            int ops_tokens = 0;
            op_table prefill_ops{};
            double prefill_ops_seconds = 0;
        };
        long model_rss_kib = 0;
        std::vector<result> results;
        std::vector<float> last_logits; // of the last decode step: the pick's timing
        route_counts routes;
        routes.n_expert = static_cast<int>(hp.n_expert);
        routes.counts.assign(size_t(hp.n_layer) * std::max<size_t>(hp.n_expert, 1), 0);
        for (int nt : threads) {
            result r{};
            r.threads = nt;
            cpu_options co;
            co.n_threads = nt;
            co.int8_activations = vm.count("f32-act") == 0;
            const int64_t max_cols = std::max({hp.n_embd, hp.n_head * hp.head_dim, hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp});
            auto be = make_cpu_backend(co, max_cols);
            profiled_backend profiled(*be, *rt->mdl);
            const bool f32_act = vm.count("f32-act") > 0;
            std::vector<double> bw, ceilings, machine, used, pre, dec, ttft, dec_frac, pre_frac, pre_used_frac;
            read_probe probe(nt, size_t(bandwidth_mib) << 20, kt);
            if (probe.bytes() == 0) {
                throw error(errc::out_of_memory, "cannot allocate the bandwidth probe's " + std::to_string(bandwidth_mib) +
                                                     " MiB (--bandwidth-mib)");
            }
            for (int rep = 0; rep < reps; ++rep) {
                const dot_peak peak = measure_dot_peak(nt, kt, matrix_type);
                machine.push_back(peak.machine_int8);
                used.push_back(f32_act ? peak.f32_act : peak.int8_act);
                reset_peak_rss();
                const bool by_op = vm.count("ops") > 0 && rep == reps - 1;
                session s(*rt->mdl, by_op ? static_cast<backend&>(profiled) : *be, n_ctx, n_batch);
                const std::vector<int32_t> prompt = random_prompt(prompt_tokens, hp.n_vocab, rep);
                profiled.set_recording(by_op);
                const auto t0 = clock_type::now();
                for (int i = 0; i < prompt_tokens; i += n_batch) s.eval(prompt.data() + i, std::min(n_batch, prompt_tokens - i));
                const float* l = s.logits();
                int32_t id = argmax(l, static_cast<int>(hp.n_vocab)); // greedy, as the sampler picks
                const double t_first = ms_since(t0);
                profiled.set_recording(false);
                if (by_op) {
                    r.prefill_ops = profiled.stats();
                    r.prefill_ops_seconds = t_first / 1000.0;
                    profiled.reset();
                }
                if (rep == reps - 1 && vm.count("routing")) s.set_route_observer({route_counts::observe, &routes});
                // Decode in stretches of decode_stretch tokens, each against the read bandwidth
                // measured just before and just after it (the higher of the two): the host's
                // bandwidth can change within a second, so a probe taken once per repetition
                // may meet another state than the tokens it is compared with.
                double before = probe.measure(probe_passes), t_dec = 0;
                std::vector<double> stretch_frac;
                for (int i = 0; i < gen_tokens; i += decode_stretch) {
                    const int n = std::min(decode_stretch, gen_tokens - i);
                    double bytes = 0;
                    profiled.set_recording(by_op);
                    const auto t1 = clock_type::now();
                    for (int k = 0; k < n; ++k) {
                        bytes += w_bytes + double(s.kv_bytes_read(s.n_past())); // the keys and values it reads
                        s.eval(&id, 1);
                        l = s.logits();
                        id = argmax(l, static_cast<int>(hp.n_vocab));
                    }
                    const double ms = ms_since(t1);
                    profiled.set_recording(false);
                    t_dec += ms;
                    const double after = probe.measure(probe_passes);
                    bw.push_back(after);
                    stretch_frac.push_back(bytes * 1000.0 / ms / std::max(before, after));
                    r.stretches.emplace_back(std::max(before, after), stretch_frac.back());
                    if (by_op) r.ops_probe += std::max(before, after) * n; // weighted by tokens
                    before = after;
                }
                if (by_op) {
                    r.ops = profiled.stats();
                    r.ops_probe /= gen_tokens;
                    r.ops_seconds = t_dec / 1000.0;
                    r.ops_tokens = gen_tokens;
                }
                last_logits.assign(l, l + hp.n_vocab);
                pre.push_back(prompt_tokens * 1000.0 / t_first);
                dec.push_back(gen_tokens * 1000.0 / t_dec);
                ttft.push_back(t_first);
                dec_frac.push_back(summarise(stretch_frac).median);
                pre_frac.push_back(pre.back() * macs_per_token / machine.back());
                pre_used_frac.push_back(pre.back() * macs_per_token / used.back());
                // the probe's buffer is resident all along: not the model's
                model_rss_kib = std::max(model_rss_kib, peak_rss_kib() - long(probe.bytes() / 1024));
            }
            for (double b : bw) ceilings.push_back(b / bytes_per_token);
            r.bandwidth = summarise(bw);
            r.ceiling = summarise(ceilings);
            r.machine_peak = summarise(machine);
            r.used_peak = summarise(used);
            r.prefill_tps = summarise(pre);
            r.decode_tps = summarise(dec);
            r.ttft_ms = summarise(ttft);
            r.decode_fraction = summarise(dec_frac);
            r.prefill_fraction = summarise(pre_frac);
            r.prefill_used_fraction = summarise(pre_used_frac);
            results.push_back(r);
        }

        const pick_times pick = time_picks(last_logits);

        const std::string weight_type(format::dtype_name(static_cast<format::dtype>(hp.weight_type)));
        auto write_json = [&](FILE* f) {
            std::fprintf(f, "{\"model\":\"%s\",\"arch\":\"%s\",\"weight_type\":\"%s\",\"kernels\":\"%s\",\"int8_activations\":%s,"
                        "\"file_bytes\":%llu,\"params\":%llu,\"params_active\":%llu,\"bytes_per_token\":%.0f,"
                        "\"prompt_tokens\":%d,\"batch\":%d,\"gen_tokens\":%d,\"reps\":%d,\"load_ms\":%.2f,\"process_start_to_ready_ms\":%.2f,\"page_in_ms\":%.2f,"
                        "\"weights_in_2mib_pages\":%.4f,\"peak_rss_kib\":%ld,\"pick_us\":{\"greedy\":%.3f,\"defaults\":%.3f,\"top_k_0\":%.3f},\"runs\":[",
                        model_path.c_str(), format::arch_name(static_cast<format::arch>(hp.arch)).data(), weight_type.c_str(),
                        kt.name, vm.count("f32-act") ? "false" : "true",
                        static_cast<unsigned long long>(rt->mdl->file().file_size()),
                        static_cast<unsigned long long>(rt->mdl->n_params()),
                        static_cast<unsigned long long>(rt->mdl->n_params_active()), bytes_per_token, prompt_tokens,
                        n_batch, gen_tokens, reps, load_ms, ready_ms, page_in_ms, huge_share, model_rss_kib, pick.greedy_us,
                        pick.defaults_us, pick.all_us);
            // medians, and [min, max] as "..._range"
            const auto range = [](const stats& v, double scale) {
                char b[64];
                std::snprintf(b, sizeof b, "[%.4f,%.4f]", v.min * scale, v.max * scale);
                return std::string(b);
            };
            for (size_t i = 0; i < results.size(); ++i) {
                const result& r = results[i];
                std::fprintf(f, "%s{\"threads\":%d,\"read_bandwidth_gbs\":%.3f,\"read_bandwidth_gbs_range\":%s,\"decode_ceiling_tps\":%.3f,"
                            "\"decode_tps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f},\"decode_fraction\":%.4f,\"decode_fraction_range\":%s,"
                            "\"prefill_tps\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f},\"ttft_ms\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
                            "\"dot_peak_gmacs\":{\"machine_int8\":%.2f,\"used\":%.2f},\"prefill_fraction_of_int8_peak\":%.4f,"
                            "\"prefill_fraction_of_int8_peak_range\":%s,\"prefill_fraction_of_used_peak\":%.4f,\"decode_stretches\":[",
                            i ? "," : "", r.threads, r.bandwidth.median / 1e9, range(r.bandwidth, 1e-9).c_str(), r.ceiling.median,
                            r.decode_tps.median, r.decode_tps.min, r.decode_tps.max, r.decode_fraction.median,
                            range(r.decode_fraction, 1).c_str(), r.prefill_tps.median, r.prefill_tps.min, r.prefill_tps.max,
                            r.ttft_ms.median, r.ttft_ms.min, r.ttft_ms.max, r.machine_peak.median / 1e9, r.used_peak.median / 1e9,
                            r.prefill_fraction.median, range(r.prefill_fraction, 1).c_str(), r.prefill_used_fraction.median);
                for (size_t k = 0; k < r.stretches.size(); ++k) {
                    std::fprintf(f, "%s[%.3f,%.4f]", k ? "," : "", r.stretches[k].first / 1e9, r.stretches[k].second);
                }
                std::fprintf(f, "]");
                if (r.ops_tokens > 0) write_ops_json(f, r.ops, r.ops_probe, r.ops_seconds, r.ops_tokens);
                if (r.prefill_ops_seconds > 0) write_prefill_ops_json(f, r.prefill_ops, r.prefill_ops_seconds);
                std::fprintf(f, "}");
            }
            std::fprintf(f, "]}\n");
        };
        emit_json(write_json, json_file, json);
        if (!json) {
            std::printf("model %s: %s, %s weights, %.1f MiB, %.1fM parameters (%.1fM active), %s kernels%s\n",
                        model_path.c_str(), format::arch_name(static_cast<format::arch>(hp.arch)).data(), weight_type.c_str(),
                        rt->mdl->file().file_size() / 1048576.0, rt->mdl->n_params() / 1e6,
                        rt->mdl->n_params_active() / 1e6, kt.name, vm.count("f32-act") ? ", f32 activations" : ", int8 activations");
            std::printf("load to ready %.1f ms (process start to ready %.1f ms, not counting a random model's writing; then the "
                        "weights' pages mapped in, %.1f ms, before the repetitions); bytes read per decoded token %.1f MiB "
                        "(weights %.1f MiB + KV cache %.2f MiB)\n",
                        load_ms, ready_ms, page_in_ms, bytes_per_token / 1048576.0, w_bytes / 1048576.0, kv_bytes / 1048576.0);
            if (huge_share >= 0) {
                std::printf("weights in 2 MiB pages: %.0f%% of their resident pages (4 KiB pages read a few percent slower; "
                            "docs/performance-log.md)\n", 100.0 * huge_share);
            }
            std::printf("prompt %d tokens (batches of %d), %d decoded, %d repetitions: median [min-max]\n", prompt_tokens, n_batch,
                        gen_tokens, reps);
            std::printf("decode: every %d tokens against the read bandwidth measured just before and after them; prefill: each "
                        "repetition against the int8 peak measured just before it\n", decode_stretch);
            for (const result& r : results) {
                std::printf("threads %d: read bandwidth %.2f GB/s [%.2f-%.2f] -> decode ceiling %.2f tok/s\n", r.threads,
                            r.bandwidth.median / 1e9, r.bandwidth.min / 1e9, r.bandwidth.max / 1e9, r.ceiling.median);
                std::printf("  decode  %8.2f tok/s [%.2f-%.2f]  %5.1f%% of the ceiling [%.1f-%.1f]\n", r.decode_tps.median,
                            r.decode_tps.min, r.decode_tps.max, 100.0 * r.decode_fraction.median, 100.0 * r.decode_fraction.min,
                            100.0 * r.decode_fraction.max);
                std::printf("  prefill %8.2f tok/s [%.2f-%.2f]  %5.1f%% of the machine's int8 peak (%.1f GMAC/s) [%.1f-%.1f], %5.1f%% of "
                            "the kernel used on cached data (%.1f GMAC/s)\n",
                            r.prefill_tps.median, r.prefill_tps.min, r.prefill_tps.max, 100.0 * r.prefill_fraction.median,
                            r.machine_peak.median / 1e9, 100.0 * r.prefill_fraction.min, 100.0 * r.prefill_fraction.max,
                            100.0 * r.prefill_used_fraction.median, r.used_peak.median / 1e9);
                std::printf("  time to first token %.1f ms [%.1f-%.1f]\n", r.ttft_ms.median, r.ttft_ms.min, r.ttft_ms.max);
                if (r.prefill_ops_seconds > 0) print_prefill_ops(r.prefill_ops, r.prefill_ops_seconds, prompt_tokens);
                if (r.ops_tokens > 0) print_ops(r.ops, r.ops_probe, r.ops_seconds, r.ops_tokens);
            }
            std::printf("peak RSS %.1f MiB (the model running, without the probes)\n", model_rss_kib / 1024.0);
            std::printf("token pick on the last step's logits (%u tokens): greedy %.1f us, defaults (temperature 0.8, "
                        "top-k 40, top-p 0.95, min-p 0.05) %.1f us, top-k 0 %.1f us\n",
                        hp.n_vocab, pick.greedy_us, pick.defaults_us, pick.all_us);
            if (vm.count("routing") && hp.n_expert > 0) {
                std::printf("expert selections per layer during decode (last repetition):\n");
                for (uint32_t il = 0; il < hp.n_layer; ++il) {
                    std::printf("  layer %2u:", il);
                    for (uint32_t e = 0; e < hp.n_expert; ++e) std::printf(" %llu", static_cast<unsigned long long>(routes.counts[il * hp.n_expert + e]));
                    std::printf("\n");
                }
            }
        }
    } catch (const std::exception& e) {
        std::cerr << "colibri-bench: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
