// colibri: one-shot runner. Standard output carries the completion text only; diagnostics,
// progress and timings go to standard error.

#include "api/runtime.h"
#include "command_line.hpp"
#include "core/error.h"
#include "generate/generate.h"
#include "generate/perplexity.h"
#include "tools/tokenize_cmd.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

namespace po = boost::program_options;
using namespace colibri;

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
    std::vector<int32_t> ids;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        size_t used = 0;
        long v = 0;
        try {
            v = std::stol(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
            throw error(errc::invalid_argument, "--tokens: '" + item + "' is not a token id");
        }
        ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) throw error(errc::invalid_argument, "--tokens: no token ids");
    return ids;
}

// Writes logits [n_tokens][n_vocab] as raw little-endian f32.
void dump_logits(runtime& rt, const std::vector<int32_t>& ids, const std::string& path) {
    const int n_vocab = static_cast<int>(rt.mdl->hp().n_vocab);
    session s(*rt.mdl, *rt.be, static_cast<int>(ids.size()) + 1, 32, true);
    std::ofstream out(path, std::ios::binary);
    if (!out) throw error(errc::io, path + ": cannot create");
    for (size_t i = 0; i < ids.size(); i += 32) {
        const int n = static_cast<int>(std::min<size_t>(32, ids.size() - i));
        s.eval(ids.data() + i, n);
        out.write(reinterpret_cast<const char*>(s.logits()), std::streamsize(sizeof(float)) * n * n_vocab);
    }
    if (!out) throw error(errc::io, path + ": write failed");
    std::fprintf(stderr, "wrote logits [%zu][%d] to %s\n", ids.size(), n_vocab, path.c_str());
}

void print_route(void*, int pos, int layer, const int32_t* experts, const float* weights, int k) {
    std::fprintf(stderr, "route pos=%d layer=%d:", pos, layer);
    for (int j = 0; j < k; ++j) std::fprintf(stderr, " %d(%.4f)", experts[j], weights[j]);
    std::fprintf(stderr, "\n");
}

} // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::string_view(argv[1]) == "tokenize") return tokenize_main(argc - 1, argv + 1);
    std::string model_path, prompt, device = "cpu", dump_path, tokens, suffix, fim = "auto", order_name = "auto",
                                    ppl_path;
    std::vector<std::string> stops;
    generate_request req;
    int threads = 0, n_ctx = 0, gpu_memory_mib = 0;
    po::options_description opts("colibri: run a .colibri model once\n\n"
                                 "  colibri --model M --prompt P [options]\n"
                                 "  colibri --model M --tokens 1,2,3 --dump-logits FILE\n"
                                 "  colibri tokenize --model M --text T   (see colibri tokenize --help)\n\n"
                                 "Options (--max_tokens and --max-tokens are the same option, likewise the others)");
    auto both = [&](const char* underscored, const po::value_semantic* v1, const po::value_semantic* v2,
                    const char* help) {
        std::string dashed = underscored;
        for (char& c : dashed) c = c == '_' ? '-' : c;
        opts.add_options()(underscored, v1, help);
        if (dashed != underscored) opts.add_options()(dashed.c_str(), v2, "");
    };
    // clang-format off
    opts.add_options()
        ("help,h", "show this help")
        ("model,m", po::value(&model_path), "the .colibri model file")
        ("prompt,p", po::value(&prompt), "prompt text ('-' reads standard input); with --suffix, the text before the cursor")
        ("suffix", po::value(&suffix), "text after the cursor: fill in the middle with the model's FIM tokens")
        ("fim", po::value(&fim), "FIM template: auto (default: from the vocabulary), starcoder, qwen, deepseek, codellama, codestral, none")
        ("fim-order", po::value(&order_name), "auto (default: the order the model file records), psm (prefix, suffix, middle) or "
                                               "spm (suffix first; only for models trained so)")
        ("device", po::value(&device), "cpu (default) or cuda:N")
        ("gpu-memory", po::value(&gpu_memory_mib), "on a GPU: MiB of device memory for the weights (default 0: no limit); "
                                                   "routed experts that do not fit are copied in when used")
        ("threads,t", po::value(&threads), "worker threads (default: the CPUs this process may use)")
        ("seed,s", po::value(&req.sampling.seed), "sampling seed (same seed, same tokens)")
        ("stop", po::value(&stops)->composing(), "stop string (repeatable); not printed")
        ("stream", "print text as it is generated")
        ("dump-logits", po::value(&dump_path), "write f32 logits [n_tokens][n_vocab] of --tokens to FILE")
        ("tokens", po::value(&tokens), "comma-separated token ids for --dump-logits")
        ("perplexity", po::value(&ppl_path), "print the perplexity of the model over a text FILE (sliding windows of "
                                              "--ctx_size tokens, default the model's context, at most 512, each half a "
                                              "window after the last; see docs/engine.md)")
        ("route-debug", "print each token's chosen experts and weights per layer to standard error")
        ("no-speculative", "decode one token per step, without drafts from the context (the same tokens, "
                           "more steps where the completion repeats its context)")
        ("parse-special", "text in --prompt and --suffix that spells a special token (<|endoftext|>) becomes that token; "
                          "by default it is encoded as text");
    // clang-format on
    both("max_tokens", po::value(&req.max_tokens), po::value(&req.max_tokens),
         "tokens to generate at most (default 128)");
    both("max_lines", po::value(&req.max_lines), po::value(&req.max_lines),
         "end before line N+1 of the completion (1: the rest of the cursor's line); 0: no limit (default)");
    both("stop_on_dedent", po::bool_switch(&req.stop_on_dedent), po::bool_switch(&req.stop_on_dedent),
         "end before a line indented less than the prompt's last line");
    both("temperature", po::value(&req.sampling.temperature), nullptr, "0: greedy (default 0.8)");
    both("top_k", po::value(&req.sampling.top_k), po::value(&req.sampling.top_k), "top-k, 0: off (default 40)");
    both("top_p", po::value(&req.sampling.top_p), po::value(&req.sampling.top_p), "top-p, 1: off (default 0.95)");
    both("min_p", po::value(&req.sampling.min_p), po::value(&req.sampling.min_p), "min-p, 0: off (default 0.05)");
    both("repeat_penalty", po::value(&req.sampling.repeat_penalty), po::value(&req.sampling.repeat_penalty),
         "1: off (default 1.0)");
    both("ctx_size", po::value(&n_ctx), po::value(&n_ctx), "context length (default: the model's, at most 4096)");
    po::variables_map vm;
    if (const int status = cli::parse(argc, argv, "colibri", opts, vm); status >= 0) return status;
    if (model_path.empty()) return cli::usage_error("colibri", "--model is required");
    const bool dumping = !dump_path.empty() || !tokens.empty();
    const bool scoring = !ppl_path.empty();
    if (dumping && (dump_path.empty() || tokens.empty())) {
        std::cerr << "colibri: --dump-logits and --tokens go together\n";
        return 2;
    }
    if (!dumping && !scoring && !vm.count("prompt")) return cli::usage_error("colibri", "--prompt is required");
    try {
        if (gpu_memory_mib < 0) throw error(errc::invalid_argument, "--gpu-memory must not be negative");
        auto rt = load_runtime(model_path, device, threads, false, size_t(gpu_memory_mib) << 20);
        const auto& hp = rt->mdl->hp();
        std::fprintf(stderr, "model %s: %s, %u layers, %u experts (%u used), %s, %s, %d threads\n", model_path.c_str(),
                     format::arch_name(static_cast<format::arch>(hp.arch)).data(), hp.n_layer, hp.n_expert,
                     hp.n_expert_used, format::dtype_name(static_cast<format::dtype>(hp.weight_type)).data(),
                     rt->be->name().c_str(), rt->be->n_threads());
        if (dumping) {
            dump_logits(*rt, parse_ids(tokens), dump_path);
            return 0;
        }
        if (scoring) {
            std::ifstream in(ppl_path, std::ios::binary);
            if (!in) throw error(errc::io, ppl_path + ": cannot open");
            const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            std::vector<int32_t> ids;
            if (rt->tok->add_bos() && rt->tok->bos_id() >= 0) ids.push_back(rt->tok->bos_id());
            rt->tok->encode(text, ids);
            const int ctx = n_ctx > 0 ? n_ctx : static_cast<int>(std::min<uint32_t>(hp.n_ctx, 512));
            const bool tty = isatty(STDERR_FILENO) != 0;
            const perplexity_result r = perplexity(*rt->mdl, *rt->be, ids, ctx, [tty](int w, int nw) {
                if (tty) std::fprintf(stderr, "\rwindow %d/%d", w, nw);
            });
            std::fprintf(stderr, "%s%lld tokens scored in %d windows of %d\n", tty ? "\n" : "",
                         static_cast<long long>(r.n_scored), r.n_windows, ctx);
            std::printf("%.4f\n", r.perplexity);
            return 0;
        }
        if (prompt == "-") {
            std::stringstream ss;
            ss << std::cin.rdbuf();
            prompt = ss.str();
        }
        req.prompt = prompt;
        req.stop = stops;
        if (vm.count("parse-special")) req.specials = special_tokens::parsed;
        if (vm.count("suffix")) req.suffix = suffix;
        req.speculative = vm.count("no-speculative") == 0;
        if (fim != "auto") {
            fim_kind k;
            if (!parse_fim_kind(fim, k)) throw error(errc::invalid_argument, "unknown --fim '" + fim + "'");
            req.fim = k;
        }
        if (order_name != "auto" && !parse_fim_order(order_name, req.order.emplace()))
            throw error(errc::invalid_argument, "--fim-order must be auto, psm or spm, not '" + order_name + "'");
        session s(*rt->mdl, *rt->be, n_ctx);
        if (vm.count("route-debug")) s.set_route_observer({print_route, nullptr});
        sampler smp(static_cast<int>(hp.n_vocab));
        const bool stream = vm.count("stream") > 0;
        std::string all;
        const generate_result r = generate(s, *rt->tok, smp, req, [&](std::string_view piece) {
            if (stream) {
                std::fwrite(piece.data(), 1, piece.size(), stdout);
                std::fflush(stdout);
            } else {
                all.append(piece);
            }
            return true;
        });
        if (!stream) std::fwrite(all.data(), 1, all.size(), stdout);
        std::fflush(stdout);
        if (req.suffix) std::fprintf(stderr, "\nfill-in-the-middle: %s", fim_kind_name(r.fim).data());
        std::fprintf(
            stderr,
            "\nprompt: %d tokens in %.1f ms (%.1f tok/s); generated: %d tokens in %.1f ms (%.1f tok/s); finish: %s\n",
            r.n_prompt_tokens, r.prompt_ms, r.n_prompt_tokens * 1000.0 / std::max(r.prompt_ms, 1e-3),
            r.n_generated_tokens, r.generate_ms,
            r.n_generated_tokens > 1 ? (r.n_generated_tokens - 1) * 1000.0 / std::max(r.generate_ms, 1e-3) : 0.0,
            finish_reason_name(r.reason).data());
        if (r.n_drafted_tokens > 0)
            std::fprintf(stderr, "drafts: %d of %d tokens kept\n", r.n_accepted_tokens, r.n_drafted_tokens);
    } catch (const std::exception& e) {
        std::cerr << "colibri: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
