#pragma once
// colibri-convert: Hugging Face checkpoint (or random weights) -> .colibri file.

#include "convert/quant_choice.h"
#include "format/format.h"
#include "format/writer.h"
#include "generate/fim.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace colibri {

class safetensors_checkpoint;

/// A slice of a source tensor: rows [row0, row0 + rows) of matrix `index` of a tensor
/// that stacks matrices along its first dimension (index 0 for a plain tensor).
struct source_slice {
    std::string name; // name in the checkpoint
    uint64_t index = 0;
    uint64_t row0 = 0;
    std::vector<uint64_t> rows; // when not empty: the source row (of matrix `index`) of each row, row0 unused
};

/// What the converter writes for one tensor.
struct tensor_plan {
    std::string name; // .colibri name (format/tensor_names.h)
    format::dtype type;
    std::vector<uint64_t> shape; // [rows, cols] or [n]
    source_slice src;
    std::vector<float> values; // values the converter computed (rope_freqs, Gemma's 1 + w norms, latent
                               // attention's k_b), stored as `type` (f32 or f16); src unused
};

/// Everything a checkpoint family contributes: hyperparameters and the tensor list.
struct checkpoint_plan {
    std::string family;
    format::hparams hp{};
    std::vector<tensor_plan> tensors;
};

/// Reads config.json in `dir` and maps it and the checkpoint's tensors for the family named
/// by `architectures`. Matrices get quant's type for them (quant_choice::matrix_type);
/// norms and biases f32; the router and the shared-expert gate always f32.
/// Throws colibri::error for an unsupported architecture or setting, or a missing or
/// mis-shaped tensor, naming it.
checkpoint_plan plan_checkpoint(const std::string& dir, const safetensors_checkpoint& ckpt, const quant_choice& quant);

/// How one kind of source element became one of ours (GGUF input), with the error it added.
struct type_conversion {
    std::string from; ///< ggml type name (F32, Q4_K, ...)
    format::dtype to = format::dtype::f32;
    uint64_t n_tensors = 0, n_elements = 0;
    bool copied = false;       ///< blocks copied byte for byte (the layouts are identical)
    double err2 = 0, ref2 = 0; ///< sums of squared error and of squared source values
    /// RMS of the added error relative to the RMS of the source values.
    double rms_rel_error() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0; }
};

struct convert_summary {
    std::string family;
    uint64_t n_params = 0;
    uint64_t n_params_active = 0;
    uint64_t file_size = 0;
    size_t n_tensors = 0;
    double seconds = 0;
    std::vector<type_conversion> conversions; ///< GGUF input only
};

/// Throws colibri::error (format) naming `file`, `tensor` and row r when a value of `row` is
/// not finite: quantising a NaN is undefined, and a model that holds one computes nothing
/// (llama.cpp's quantiser refuses them too).
void check_finite(const std::vector<float>& row, const std::string& file, const std::string& tensor, uint64_t r);

/// Converts the checkpoint directory `input` to `output`. The tokenizer is input/tokenizer.model
/// (sentencepiece) when present, else input/tokenizer.json (byte-level BPE). The FIM order the
/// model was trained with, recorded in the file (format::tok_fim_spm) so that generation uses
/// it unless told otherwise, is `fim_order` when given, else tokenizer_config.json's
/// "fim_order" ("psm" or "spm") when present, else psm.
convert_summary convert_checkpoint(const std::string& input, const std::string& output, const quant_choice& quant,
                                   const model_writer::progress& progress,
                                   std::optional<fim_order> order = std::nullopt);

/// Converts a GGUF file (docs/gguf.md). `quant` empty keeps each tensor's type where ours
/// has the same layout (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) and writes the other
/// quantised types as q8_0; a given `quant` picks every matrix's. Throws colibri::error naming the file
/// and any unsupported architecture, tensor type or tokenizer. `order` as for a checkpoint.
convert_summary convert_gguf(const std::string& input, const std::string& output, std::optional<quant_choice> quant,
                             const model_writer::progress& progress, std::optional<fim_order> order = std::nullopt);

/// Adds the parameter counts of tensors (name, elements) to `sum`: all of them, and those
/// one token uses (n_expert_used of the experts; one row of the embedding).
void count_params(const format::hparams& hp, const std::vector<std::pair<std::string, uint64_t>>& sizes,
                  convert_summary& sum);

struct random_model_options {
    format::arch arch = format::arch::mixtral;
    uint32_t n_layer = 2, n_embd = 256, n_head = 8, n_head_kv = 4, head_dim = 32;
    uint32_t n_expert = 8, n_expert_used = 2, n_ff_exp = 512, n_ff = 0, n_ff_shexp = 0;
    uint32_t n_vocab = 32000, n_ctx = 4096;
    uint32_t n_dense_lead = 0; ///< leading layers with a dense FFN of n_ff in an MoE model
    /// kv_lora_rank > 0: latent attention (DeepSeek-V2: arch deepseek2), head_dim being
    /// the query/key head's size; shared experts then come ungated
    uint32_t kv_lora_rank = 0, rope_dim = 0, v_head_dim = 0;
    uint64_t seed = 1;
    std::string tokenizer_model; ///< tokenizer.model (sentencepiece) or tokenizer.json (BPE) to embed (required)
};

/// Writes a model of the given shape with random weights (for benchmarks and tests).
convert_summary write_random_model(const random_model_options& opt, const std::string& output,
                                   const quant_choice& quant, const model_writer::progress& progress);

/// Reads a whole file into memory; throws colibri::error (io) naming it.
std::vector<uint8_t> read_file_bytes(const std::string& path);

} // namespace colibri
