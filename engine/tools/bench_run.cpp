// colibri-bench's measurements: the repetitions on the CPU and on a GPU, and what they time
// and read along the way (statistics, the token pick, peak memory, 2 MiB pages, prompts).

#include "tools/bench_run.h"

#include "api/runtime.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "cpu/kernel_table.h"
#include "cuda/bandwidth_probe.h"
#include "cuda/cuda_backend.h"
#include "sampling/sampler.h"
#include "tools/machine_limits.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sys/resource.h>

namespace colibri {

namespace {

// Passes of each measurement of the read bandwidth between decode stretches (one of each of
// the probe's stream counts: read_probe::measure).
constexpr int probe_passes = 3;

double ms_since(bench_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(bench_clock::now() - t0).count();
}

stats summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    stats s;
    s.min = v.front();
    s.max = v.back();
    s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    return s;
}

pick_times time_picks(const std::vector<float>& logits) {
    const int n_vocab = static_cast<int>(logits.size());
    sampler smp(n_vocab);
    const auto time = [&](sampling_params p, int picks) {
        smp.set_params(p);
        std::vector<double> us;
        for (int rep = 0; rep < 5; ++rep) {
            const auto t0 = bench_clock::now();
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

// One thread count's repetitions of the model in `rt`; b holds the sizes and bytes per
// token, and gathers the peak RSS and the expert selections. The last decode step's logits
// are left in last_logits.
thread_run run_threads(const runtime& rt, int n_threads, const kernel_table& kt, cpu_bench& b,
                       std::vector<float>& last_logits) {
    const bench_options& o = b.options;
    const auto& hp = rt.mdl->hp();
    const int n_ctx = o.prompt_tokens + o.gen_tokens + 1;
    // the prefill kernel measured on cached data is the one the layers' matrices use
    const layer_weights& first = rt.mdl->layers().front();
    const format::dtype matrix_type = (first.wq != nullptr ? first.wq : first.mla.q_nope)->type;
    const double macs_per_token = double(rt.mdl->n_params_active()) - hp.n_embd;

    thread_run r{};
    r.threads = n_threads;
    cpu_options co;
    co.n_threads = n_threads;
    co.int8_activations = !o.f32_act;
    const int64_t max_cols = std::max({hp.n_embd, hp.n_head * hp.head_dim, hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp});
    auto be = make_cpu_backend(co, max_cols);
    profiled_backend profiled(*be, *rt.mdl);
    std::vector<double> bw, ceilings, machine, used, pre, dec, ttft, dec_frac, pre_frac, pre_used_frac;
    read_probe probe(n_threads, size_t(o.bandwidth_mib) << 20, kt);
    if (probe.bytes() == 0) {
        throw error(errc::out_of_memory, "cannot allocate the bandwidth probe's " + std::to_string(o.bandwidth_mib) +
                                             " MiB (--bandwidth-mib)");
    }
    for (int rep = 0; rep < o.reps; ++rep) {
        const dot_peak peak = measure_dot_peak(n_threads, kt, matrix_type);
        machine.push_back(peak.machine_int8);
        used.push_back(o.f32_act ? peak.f32_act : peak.int8_act);
        reset_peak_rss();
        const bool by_op = o.by_op && rep == o.reps - 1;
        session s(*rt.mdl, by_op ? static_cast<backend&>(profiled) : *be, n_ctx, b.n_batch);
        const std::vector<int32_t> prompt = random_prompt(o.prompt_tokens, hp.n_vocab, rep);
        profiled.set_recording(by_op);
        const auto t0 = bench_clock::now();
        for (int i = 0; i < o.prompt_tokens; i += b.n_batch) {
            s.eval(prompt.data() + i, std::min(b.n_batch, o.prompt_tokens - i));
        }
        const float* l = s.logits();
        int32_t id = argmax(l, static_cast<int>(hp.n_vocab)); // greedy, as the sampler picks
        const double t_first = ms_since(t0);
        profiled.set_recording(false);
        if (by_op) {
            r.prefill_ops = profiled.stats();
            r.prefill_ops_seconds = t_first / 1000.0;
            profiled.reset();
        }
        if (rep == o.reps - 1 && o.routing) s.set_route_observer({route_counts::observe, &b.routes});
        // Decode in stretches of decode_stretch tokens, each against the read bandwidth
        // measured just before and just after it (the higher of the two): the host's
        // bandwidth can change within a second, so a probe taken once per repetition
        // may meet another state than the tokens it is compared with.
        double before = probe.measure(probe_passes), t_dec = 0;
        std::vector<double> stretch_frac;
        for (int i = 0; i < o.gen_tokens; i += decode_stretch) {
            const int n = std::min(decode_stretch, o.gen_tokens - i);
            double bytes = 0;
            profiled.set_recording(by_op);
            const auto t1 = bench_clock::now();
            for (int k = 0; k < n; ++k) {
                bytes += b.weight_bytes + double(s.kv_bytes_read(s.n_past())); // the keys and values it reads
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
            r.ops_probe /= o.gen_tokens;
            r.ops_seconds = t_dec / 1000.0;
            r.ops_tokens = o.gen_tokens;
        }
        last_logits.assign(l, l + hp.n_vocab);
        pre.push_back(o.prompt_tokens * 1000.0 / t_first);
        dec.push_back(o.gen_tokens * 1000.0 / t_dec);
        ttft.push_back(t_first);
        dec_frac.push_back(summarise(stretch_frac).median);
        pre_frac.push_back(pre.back() * macs_per_token / machine.back());
        pre_used_frac.push_back(pre.back() * macs_per_token / used.back());
        // the probe's buffer is resident all along: not the model's
        b.model_rss_kib = std::max(b.model_rss_kib, peak_rss_kib() - long(probe.bytes() / 1024));
    }
    for (double band : bw) ceilings.push_back(band / b.bytes_per_token);
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
    return r;
}

} // namespace

cpu_bench run_on_cpu(const std::string& model_path, const std::vector<int>& threads, const kernel_table& kt,
                     const bench_options& options, bench_clock::time_point process_start) {
    cpu_bench b;
    b.options = options;
    b.model_path = model_path;
    // load to ready: map + validate + tokenizer + backend + a session
    const auto t_load = bench_clock::now();
    auto rt = load_runtime(model_path, "cpu", threads.front());
    const auto& hp = rt->mdl->hp();
    const int n_ctx = options.prompt_tokens + options.gen_tokens + 1;
    b.n_batch = std::min(options.prompt_tokens, options.batch);
    size_t kv_token_bytes = 0; // keys and values of one position, all layers (f16 or f32)
    {
        session warm(*rt->mdl, *rt->be, n_ctx, b.n_batch);
        kv_token_bytes = warm.token_bytes();
    }
    b.load_ms = ms_since(t_load);
    b.ready_ms = ms_since(process_start);
    // The file's pages mapped into the process before the timed repetitions, as colibrid's
    // worker maps them after loading (start_page_in), here waited for: otherwise the first
    // repetition's prefill would take a fault per page.
    start_page_in(*rt, 0);
    rt->paging->wait();
    b.page_in_ms = rt->paging->elapsed_ms();
    b.huge_share = huge_page_share(rt->mdl->file().tensors().front().data);

    b.arch = format::arch_name(static_cast<format::arch>(hp.arch));
    b.weight_type = format::dtype_name(static_cast<format::dtype>(hp.weight_type));
    b.kernels = kt.name;
    b.cpu = cpu_description();
    b.file_bytes = rt->mdl->file().file_size();
    b.params = rt->mdl->n_params();
    b.params_active = rt->mdl->n_params_active();
    b.n_vocab = hp.n_vocab;
    b.weight_bytes = rt->mdl->decode_weight_bytes();
    b.kv_bytes = double(kv_token_bytes) * (options.prompt_tokens + options.gen_tokens / 2.0);
    b.bytes_per_token = b.weight_bytes + b.kv_bytes;
    b.routes.n_layer = static_cast<int>(hp.n_layer);
    b.routes.n_expert = static_cast<int>(hp.n_expert);
    b.routes.counts.assign(size_t(hp.n_layer) * std::max<size_t>(hp.n_expert, 1), 0);

    std::vector<float> last_logits; // of the last decode step: the pick's timing
    for (int nt : threads) b.runs.push_back(run_threads(*rt, nt, kt, b, last_logits));
    b.pick = time_picks(last_logits);
    return b;
}

device_bench run_on_device(const std::string& model_path, const std::string& device, size_t weight_budget,
                           const bench_options& options, bench_clock::time_point process_start) {
    const bench_options& o = options;
    device_bench b;
    b.options = options;
    b.model_path = model_path;
    b.device = device;
    b.weight_budget = weight_budget;
    const device_spec d = parse_device(device);
    const auto t_load = bench_clock::now();
    auto rt = load_runtime(model_path, device, 0, false, weight_budget);
    const auto& hp = rt->mdl->hp();
    const int n_ctx = o.prompt_tokens + o.gen_tokens + 1;
    b.n_batch = std::min(o.prompt_tokens, o.batch);
    { session warm(*rt->mdl, *rt->be, n_ctx, b.n_batch); } // ready: a session can be made
    b.load_ms = ms_since(t_load);
    b.ready_ms = ms_since(process_start);
    const double w_bytes = rt->mdl->decode_weight_bytes();
    const size_t probe_bytes = size_t(o.bandwidth_mib) << 20;
    std::vector<double> bw, ceilings, pre, dec, ttft, frac;
    for (int rep = 0; rep < o.reps; ++rep) {
        session s(*rt->mdl, *rt->be, n_ctx, b.n_batch);
        const std::vector<int32_t> prompt = random_prompt(o.prompt_tokens, hp.n_vocab, rep);
        if (rep == 0) { // the weights go to the device the first time each is used
            const auto t = bench_clock::now();
            s.eval(prompt.data(), std::min(b.n_batch, o.prompt_tokens));
            b.upload_ms = ms_since(t);
            s.truncate(0);
        }
        const auto t0 = bench_clock::now();
        for (int i = 0; i < o.prompt_tokens; i += b.n_batch) {
            s.eval(prompt.data() + i, std::min(b.n_batch, o.prompt_tokens - i));
        }
        int32_t id = argmax(s.logits(), static_cast<int>(hp.n_vocab)); // each step's logits come back to the host
        const double t_first = ms_since(t0);
        const double band = measure_device_read_bandwidth(d.index, probe_bytes, 5);
        double bytes = 0;
        const expert_cache_stats before = rt->be->expert_cache_usage();
        const auto t1 = bench_clock::now();
        for (int k = 0; k < o.gen_tokens; ++k) {
            bytes += w_bytes + double(s.kv_bytes_read(s.n_past()));
            s.eval(&id, 1);
            id = argmax(s.logits(), static_cast<int>(hp.n_vocab));
        }
        const double t_dec = ms_since(t1);
        const expert_cache_stats after = rt->be->expert_cache_usage();
        b.cache.slots_per_layer = after.slots_per_layer;
        b.cache.hits += after.hits - before.hits;
        b.cache.misses += after.misses - before.misses;
        b.cache.bytes_copied += after.bytes_copied - before.bytes_copied;
        bw.push_back(band);
        const double bytes_per_token = bytes / o.gen_tokens;
        ceilings.push_back(band / bytes_per_token);
        pre.push_back(o.prompt_tokens * 1000.0 / t_first);
        dec.push_back(o.gen_tokens * 1000.0 / t_dec);
        ttft.push_back(t_first);
        frac.push_back(bytes * 1000.0 / t_dec / band);
    }
    b.bandwidth = summarise(bw);
    b.ceiling = summarise(ceilings);
    b.prefill_tps = summarise(pre);
    b.decode_tps = summarise(dec);
    b.decode_fraction = summarise(frac);
    b.ttft_ms = summarise(ttft);
    b.arch = format::arch_name(static_cast<format::arch>(hp.arch));
    b.weight_type = format::dtype_name(static_cast<format::dtype>(hp.weight_type));
    b.backend = rt->be->name();
    b.profile = cuda_profile_report(*rt->be);
    return b;
}

} // namespace colibri
