// colibri-convert: Hugging Face checkpoint directory, GGUF file (or random weights) -> .colibri file.

#include "command_line.hpp"
#include "convert/convert.h"
#include "convert/gguf_file.h"
#include "core/error.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <unistd.h>

namespace po = boost::program_options;
using namespace colibri;

namespace {

format::arch parse_arch(const std::string& s) {
    for (uint32_t i = 1; i <= format::arch_max; ++i) {
        if (format::arch_name(static_cast<format::arch>(i)) == s) return static_cast<format::arch>(i);
    }
    throw error(errc::invalid_argument, "unknown --arch '" + s + "'");
}

std::string human_count(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2fB", double(n) / 1e9);
    else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.2fM", double(n) / 1e6);
    else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1fK", double(n) / 1e3);
    else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
    return buf;
}

} // namespace

int main(int argc, char** argv) {
    std::string input, output, quant, arch = "mixtral", tokenizer, fim_order_name;
    random_model_options ro;
    po::options_description opts(
        "colibri-convert: write a .colibri model file\n\n"
        "  colibri-convert --input <hf-checkpoint-dir> --output <file.colibri> [--quant TYPE]\n"
        "  colibri-convert --input <model.gguf> --output <file.colibri> [--quant TYPE]\n"
        "  colibri-convert --random --tokenizer <tokenizer.model> --output <file.colibri> [shape options]\n\n"
        "Options");
    // clang-format off
    opts.add_options()
        ("help,h", "show this help")
        ("input,i", po::value(&input), "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.model or tokenizer.json), or a GGUF file")
        ("output,o", po::value(&output), "the .colibri file to write")
        ("quant,q", po::value(&quant), "weight type of the matrices: f32, f16, bf16, q8_0 (int8), q4_0 (int4), q4_k, q5_k, q6_k, "
                               "or llama.cpp's mixes q4_k_m and q5_k_m (q6_k for the output and, in some layers, attn_v and "
                               "ffn_down); default f16, or for a GGUF file each tensor's own type, kept as stored (F32, F16, BF16, "
                               "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS; other types are "
                               "refused by name)")
        ("fim-order", po::value(&fim_order_name), "the fill-in-the-middle order the model was trained with, recorded in the file as "
                                              "the order its prompts use: psm (prefix, suffix, middle) or spm (suffix first); default "
                                              "tokenizer_config.json's \"fim_order\" when present, else psm")
        ("quiet", "no progress output")
        ("random", "write a random-weight model of the shape given below instead of converting")
        ("tokenizer", po::value(&tokenizer), "with --random: tokenizer.model (sentencepiece) or tokenizer.json (BPE) to embed")
        ("arch", po::value(&arch), "with --random: architecture recorded in the file (default mixtral)")
        ("n-layer", po::value(&ro.n_layer), "with --random: layers")
        ("n-embd", po::value(&ro.n_embd), "with --random: hidden size")
        ("n-head", po::value(&ro.n_head), "with --random: attention heads")
        ("n-head-kv", po::value(&ro.n_head_kv), "with --random: key/value heads")
        ("head-dim", po::value(&ro.head_dim), "with --random: head dimension")
        ("n-expert", po::value(&ro.n_expert), "with --random: experts (0: dense)")
        ("n-expert-used", po::value(&ro.n_expert_used), "with --random: experts per token")
        ("n-ff-exp", po::value(&ro.n_ff_exp), "with --random: expert FFN width")
        ("n-ff", po::value(&ro.n_ff), "with --random: dense FFN width (dense models)")
        ("n-ff-shexp", po::value(&ro.n_ff_shexp), "with --random: shared expert FFN width (0: none)")
        ("n-vocab", po::value(&ro.n_vocab), "with --random: vocabulary size")
        ("n-ctx", po::value(&ro.n_ctx), "with --random: context length")
        ("seed", po::value(&ro.seed), "with --random: weight seed");
    // clang-format on
    po::variables_map vm;
    if (const int status = cli::parse(argc, argv, "colibri-convert", opts, vm); status >= 0) return status;
    const bool random = vm.count("random") > 0;
    if (output.empty() || (input.empty() && !random))
        return cli::usage_error("colibri-convert", "--output and one of --input or --random are required");
    const bool quiet = vm.count("quiet") > 0;
    const bool tty = isatty(STDERR_FILENO) != 0;
    size_t last_decile = 0;
    auto progress = [&](size_t i, size_t n, const std::string& name) {
        if (quiet) return;
        if (tty) {
            std::fprintf(stderr, "\r[%zu/%zu] %-48s", i, n, name.c_str());
            if (i == n) std::fprintf(stderr, "\n");
        } else if (i * 10 / n > last_decile || i == n) {
            last_decile = i * 10 / n;
            std::fprintf(stderr, "[%zu/%zu] %3zu%% %s\n", i, n, i * 100 / n, name.c_str());
        }
    };
    try {
        const quant_choice q = quant_choice::parse(quant.empty() ? "f16" : quant);
        convert_summary s;
        std::optional<fim_order> order;
        if (!fim_order_name.empty() && !parse_fim_order(fim_order_name, order.emplace()))
            throw error(errc::invalid_argument, "--fim-order must be 'psm' or 'spm' (got '" + fim_order_name + "')");
        if (random && order)
            throw error(errc::invalid_argument, "--fim-order applies to a converted model, not --random");
        if (!random && std::filesystem::is_regular_file(input) && is_gguf_file(input)) {
            s = convert_gguf(input, output, quant.empty() ? std::nullopt : std::optional<quant_choice>(q), progress,
                             order);
        } else if (random) {
            ro.arch = parse_arch(arch);
            ro.tokenizer_model = tokenizer;
            s = write_random_model(ro, output, q, progress);
        } else {
            s = convert_checkpoint(input, output, q, progress, order);
        }
        std::fprintf(stderr, "wrote %s: %s, %zu tensors, %s parameters (%s active per token), %.1f MiB, %.2f s\n",
                     output.c_str(), s.family.c_str(), s.n_tensors, human_count(s.n_params).c_str(),
                     human_count(s.n_params_active).c_str(), double(s.file_size) / 1048576.0, s.seconds);
        for (const type_conversion& c : s.conversions) {
            const std::string how = c.copied      ? "blocks copied"
                                    : c.err2 == 0 ? "exact"
                                                  : "relative RMS error " + std::to_string(c.rms_rel_error());
            std::fprintf(stderr, "  %-5s -> %-5s %4llu tensors, %s elements: %s\n", c.from.c_str(),
                         format::dtype_name(c.to).data(), static_cast<unsigned long long>(c.n_tensors),
                         human_count(c.n_elements).c_str(), how.c_str());
        }
    } catch (const std::exception& e) {
        std::cerr << "colibri-convert: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
