// colibri-bench: prefill and decode speed, time to first token, load time and peak memory
// of a model on the CPU, against the machine's measured limits (the roofline), or on a GPU.
// This file: the command line, the random-weight shapes, and which run to make.

#include "api/runtime.h"
#include "command_line.hpp"
#include "convert/convert.h"
#include "core/cpu_count.h"
#include "core/error.h"
#include "cpu/kernel_table.h"
#include "tools/bench_report.h"
#include "tools/bench_run.h"
#include "tools/bench_speculative.h"
#include "tools/machine_limits.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace po = boost::program_options;
using namespace colibri;

namespace {

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> v;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) v.push_back(std::stoi(item));
    if (v.empty()) throw error(errc::invalid_argument, "empty list '" + s + "'");
    return v;
}

// The random-weight model of --shape (its help text gives each shape).
random_model_options shape_options(const std::string& shape) {
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
    return o;
}

// The random model's file in cache_dir (empty: the temp directory), named after the type
// its matrices are stored as: a file from before a layout change is not taken for a
// current one.
std::string shape_path(const std::string& shape, const quant_choice& q, const std::string& cache_dir) {
    const std::string stored =
        std::string(format::dtype_name(format::matmul_storage(q.base(), 8))) + (q.is_mix() ? "-mix" : "");
    const auto dir = cache_dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(cache_dir);
    return (dir / ("colibri-bench-" + shape + "-" + stored + ".colibri")).string();
}

// The tokenizer only labels a random model's ids; any sentencepiece model that fits will do
// (next to the build tree, the source tree, or COLIBRI_FIXTURES_DIR).
std::string fixture_tokenizer() {
    const auto exe_dir = std::filesystem::canonical("/proc/self/exe").parent_path();
    std::string path = (exe_dir / "../../tests/fixtures/tokenizer/tokenizer.model").string();
    if (!std::filesystem::exists(path)) path = COLIBRI_SOURCE_DIR "/tests/fixtures/tokenizer/tokenizer.model";
    if (const char* fixtures = std::getenv("COLIBRI_FIXTURES_DIR"))
        path = std::string(fixtures) + "/tokenizer/tokenizer.model";
    return path;
}

} // namespace

int main(int argc, char** argv) {
    auto process_start = bench_clock::now();
    std::string model_path, shape, quant = "q8_0", threads_list, cache_dir, json_file, device = "cpu", speculative;
    float temperature = 0.0f;
    int gpu_memory_mib = 0;
    bench_options bo;
    po::options_description opts(
        "colibri-bench: measure a model on the CPU (or a GPU: --device) against the machine's limits\n\n"
        "  colibri-bench --model FILE [options]\n"
        "  colibri-bench --shape mixtral-like|fine-grained|deepseek-v2-lite [--quant q8_0|q4_0|...] [options]\n\n"
        "Options");
    // clang-format off
    opts.add_options()
        ("help,h", "show this help")
        ("cpu", "print this machine's CPU as the header names it (brand, family, model, core generation) and exit")
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
        ("prompt-tokens", po::value(&bo.prompt_tokens), "prefill length (default 512)")
        ("batch", po::value(&bo.batch), "most prompt tokens evaluated at once (default 128, as in colibrid)")
        ("gen-tokens", po::value(&bo.gen_tokens), "decoded tokens (default 128)")
        ("reps", po::value(&bo.reps), "repetitions per thread count (default 3)")
        ("bandwidth-mib", po::value(&bo.bandwidth_mib), "buffer of the bandwidth probe (default 1024 MiB)")
        ("f32-act", "keep activations in f32 for q8_0/q4_0 weights (default: int8 integer dot products)")
        ("routing", "print per-layer expert selection counts of the decode phase")
        ("speculative", po::value(&speculative), "instead, on the CPU: a greedy completion of --gen-tokens after the prompt in this "
                                                 "file, plainly and with drafts from the context, alternating --reps times "
                                                 "(the first --threads count)")
        ("temperature", po::value(&temperature), "--speculative: sample at this temperature instead, with seeds 1, 2 ... "
                                                 "(default 0: greedy)")
        ("ops", "time the last repetition's prefill and decode by operation (on the CPU), decode's each against its "
                "bytes at the read bandwidth")
        ("json", "print one JSON object instead of text")
        ("json-file", po::value(&json_file), "also append the JSON object as one line to this file");
    // clang-format on
    po::variables_map vm;
    if (const int status = cli::parse(argc, argv, "colibri-bench", opts, vm); status >= 0) return status;
    if (vm.count("cpu") > 0) {
        std::printf("cpu %s\n", cpu_description().c_str());
        return 0;
    }
    if (model_path.empty() == shape.empty()) return cli::usage_error("colibri-bench", "give one of --model or --shape");
    if (bo.prompt_tokens < 1 || bo.gen_tokens < 1 || bo.reps < 1 || bo.batch < 1 || bo.batch > 4096) {
        std::cerr << "colibri-bench: --prompt-tokens, --gen-tokens and --reps must be at least 1, --batch 1..4096\n";
        return 2;
    }
    bo.f32_act = vm.count("f32-act") > 0;
    bo.by_op = vm.count("ops") > 0;
    bo.routing = vm.count("routing") > 0;
    const bool json = vm.count("json") > 0;
    if (!speculative.empty() && parse_device(device).type != device_spec::kind::cpu) {
        std::cerr << "colibri-bench: --speculative runs on the CPU\n";
        return 2;
    }
    if (bo.by_op && parse_device(device).type != device_spec::kind::cpu) {
        std::cerr << "colibri-bench: --ops times the CPU's operations; on a GPU, COLIBRI_CUDA_PROFILE=1 reports each "
                     "operation's device time\n";
        return 2;
    }
    try {
        usable_device(device); // before a random model is written for nothing
        if (!shape.empty()) {
            random_model_options o = shape_options(shape);
            const quant_choice q = quant_choice::parse(quant);
            model_path = shape_path(shape, q, cache_dir);
            if (!std::filesystem::exists(model_path)) {
                o.tokenizer_model = fixture_tokenizer();
                if (!cache_dir.empty()) std::filesystem::create_directories(cache_dir);
                if (!json) std::fprintf(stderr, "writing %s ...\n", model_path.c_str());
                write_random_model(o, model_path, q, {});
                process_start = bench_clock::now(); // start-up is measured without the writing
            }
        }
        if (parse_device(device).type != device_spec::kind::cpu) {
            if (gpu_memory_mib < 0) throw error(errc::invalid_argument, "--gpu-memory must not be negative");
            const device_bench b = run_on_device(model_path, device, size_t(gpu_memory_mib) << 20, bo, process_start);
            emit_json(json_line(b), json_file, json);
            if (!json) print_text(b);
            return 0;
        }
        const kernel_table& kt = best_kernel_table();
        const std::vector<int> threads =
            threads_list.empty() ? std::vector<int>{usable_cpu_count()} : parse_list(threads_list);
        if (!speculative.empty())
            return run_speculative(model_path, speculative, threads.front(), bo.gen_tokens, bo.reps, temperature, json,
                                   json_file);
        const cpu_bench b = run_on_cpu(model_path, threads, kt, bo, process_start);
        emit_json(json_line(b), json_file, json);
        if (!json) print_text(b);
    } catch (const std::exception& e) {
        std::cerr << "colibri-bench: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
