// Random-weight models of any shape, for benchmarks and tests of large shapes.

#include "convert/convert.h"

#include "convert/bpe_import.h"
#include "core/cpu_count.h"
#include "core/error.h"
#include "format/row_codec.h"
#include "format/tensor_names.h"
#include "sampling/sampler.h"

#include <chrono>
#include <cmath>
#include <sentencepiece_processor.h>

namespace colibri {

using namespace format;

convert_summary write_random_model(const random_model_options& o, const std::string& output, const quant_choice& quant,
                                   const model_writer::progress& progress) {
    const auto t0 = std::chrono::steady_clock::now();
    hparams hp{};
    hp.arch = static_cast<uint32_t>(o.arch);
    hp.n_layer = o.n_layer;
    hp.n_embd = o.n_embd;
    hp.n_head = o.n_head;
    hp.n_head_kv = o.n_head_kv;
    hp.head_dim = o.head_dim;
    hp.n_expert = o.n_expert;
    hp.n_expert_used = o.n_expert_used;
    hp.n_ff_exp = o.n_ff_exp;
    hp.n_ff = o.n_ff;
    hp.n_ff_shexp = o.n_ff_shexp;
    hp.n_vocab = o.n_vocab;
    hp.n_ctx = o.n_ctx;
    const bool latent = o.kv_lora_rank > 0;
    hp.flags = flag_norm_topk_prob | (o.n_ff_shexp > 0 && !latent ? uint32_t(flag_shared_expert_gate) : 0u);
    hp.kv_lora_rank = o.kv_lora_rank;
    hp.rope_dim = o.rope_dim;
    hp.v_head_dim = o.v_head_dim;
    const mix_shape shape{o.n_layer, o.n_expert, false};
    hp.weight_type =
        static_cast<uint32_t>(matmul_storage(quant.matrix_type(names::layer(0, names::blk::attn_q), o.n_embd, shape),
                                             uint64_t(o.n_head) * o.head_dim)); // as blk.0.attn_q is stored
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.embedding_scale = hp.residual_scale = hp.logit_scale = 1.0f;
    if (o.n_layer == 0 || o.n_embd == 0 || o.n_head == 0 || o.n_head_kv == 0 || o.n_head % o.n_head_kv ||
        o.head_dim == 0 || o.head_dim % 2 || o.n_vocab == 0 || (o.n_expert == 0 && o.n_ff == 0) ||
        (o.n_expert > 0 && (o.n_expert_used == 0 || o.n_expert_used > o.n_expert || o.n_ff_exp == 0)) ||
        (o.n_dense_lead > 0 && o.n_ff == 0) ||
        (latent &&
         (o.n_head_kv != 1 || o.rope_dim == 0 || o.rope_dim % 2 || o.rope_dim >= o.head_dim || o.v_head_dim == 0))) {
        throw error(errc::invalid_argument, "random model: inconsistent shape");
    }
    if (o.tokenizer_model.empty()) throw error(errc::invalid_argument, "random model: a tokenizer model is required");
    tokenizer_header th{};
    std::vector<uint8_t> proto;
    if (o.tokenizer_model.ends_with(".json")) { // a Hugging Face tokenizer.json: BPE
        tokenizer_section sec = import_tokenizer_json(o.tokenizer_model);
        if (sec.n_tokens > o.n_vocab) {
            throw error(errc::format, o.tokenizer_model + ": " + std::to_string(sec.n_tokens) +
                                          " token ids do not fit the vocabulary of " + std::to_string(o.n_vocab));
        }
        th = sec.header;
        proto = std::move(sec.payload);
    } else {
        proto = read_file_bytes(o.tokenizer_model);
        sentencepiece::SentencePieceProcessor sp;
        if (!sp.LoadFromSerializedProto(std::string_view(reinterpret_cast<const char*>(proto.data()), proto.size()))
                 .ok() ||
            static_cast<uint32_t>(sp.GetPieceSize()) > o.n_vocab) {
            throw error(errc::format, o.tokenizer_model + ": not a sentencepiece model that fits the vocabulary");
        }
        th.kind = static_cast<uint32_t>(tokenizer_kind::sentencepiece);
        th.bos_id = sp.bos_id();
        th.eos_id = sp.eos_id();
        th.pad_id = sp.pad_id();
        th.flags = th.bos_id >= 0 ? uint32_t(tok_add_bos) : 0u;
    }

    model_writer w(hp, th, std::move(proto));
    convert_summary sum;
    sum.family = std::string(arch_name(o.arch));
    uint64_t tensor_seed = o.seed;
    // uniform in +-1/sqrt(cols): activations keep their scale through the layers
    auto add = [&](const std::string& name, std::vector<uint64_t> dims, dtype type, bool ones, bool active) {
        const uint64_t rows = dims.size() == 2 ? dims[0] : 1, cols = dims.back();
        const uint64_t seed = ++tensor_seed;
        w.add_tensor(name, type, dims, [=](uint8_t* dst) {
            xorshift64s rng(seed);
            std::vector<float> row(cols);
            const float a = 1.0f / std::sqrt(static_cast<float>(cols));
            const uint64_t rb = row_bytes(type, cols);
            for (uint64_t r = 0; r < rows; ++r) {
                for (auto& v : row) v = ones ? 1.0f : a * (2.0f * rng.uniform() - 1.0f);
                format::row_from_f32(type, row.data(), dst + r * rb, static_cast<int64_t>(cols));
            }
        });
        sum.n_params += rows * cols;
        if (active) sum.n_params_active += rows * cols;
    };
    const auto mat = [&](const std::string& name, std::vector<uint64_t> dims, bool active) {
        const dtype type = quant.matrix_type(name, dims.back(), shape);
        add(name, std::move(dims), type, false, active);
    };
    const uint64_t E = o.n_embd, q_dim = uint64_t(o.n_head) * o.head_dim, kv_dim = uint64_t(o.n_head_kv) * o.head_dim;
    mat(std::string(names::token_embd), {o.n_vocab, E}, false);
    sum.n_params_active += E;
    for (int il = 0; il < static_cast<int>(o.n_layer); ++il) {
        auto n = [il](std::string_view s) { return names::layer(il, s); };
        add(n(names::blk::attn_norm), {E}, dtype::f32, true, true);
        if (latent) {
            const uint64_t H = o.n_head, r = o.rope_dim, nope = o.head_dim - r, L = o.kv_lora_rank;
            const dtype small = quant.base() == dtype::f32 ? dtype::f32 : dtype::f16;
            mat(n(names::blk::attn_q_nope), {H * nope, E}, true);
            mat(n(names::blk::attn_q_pe), {H * r, E}, true);
            mat(n(names::blk::attn_kv_a), {L, E}, true);
            add(n(names::blk::attn_kv_a_norm), {L}, dtype::f32, true, true);
            mat(n(names::blk::attn_k_pe), {r, E}, true);
            add(n(names::blk::attn_k_b), {H * L, nope}, small, false, true);
            add(n(names::blk::attn_v_b), {H * o.v_head_dim, L}, small, false, true);
            mat(n(names::blk::attn_output), {E, H * o.v_head_dim}, true);
        } else {
            mat(n(names::blk::attn_q), {q_dim, E}, true);
            mat(n(names::blk::attn_k), {kv_dim, E}, true);
            mat(n(names::blk::attn_v), {kv_dim, E}, true);
            mat(n(names::blk::attn_output), {E, q_dim}, true);
        }
        add(n(names::blk::ffn_norm), {E}, dtype::f32, true, true);
        if (o.n_expert > 0 && il >= static_cast<int>(o.n_dense_lead)) {
            add(n(names::blk::ffn_gate_inp), {o.n_expert, E}, dtype::f32, false, true);
            for (int e = 0; e < static_cast<int>(o.n_expert); ++e) {
                const bool active = e < static_cast<int>(o.n_expert_used);
                mat(names::expert(il, e, names::exp::gate), {o.n_ff_exp, E}, active);
                mat(names::expert(il, e, names::exp::up), {o.n_ff_exp, E}, active);
                mat(names::expert(il, e, names::exp::down), {E, o.n_ff_exp}, active);
            }
            if (o.n_ff_shexp > 0) {
                mat(n(names::blk::ffn_gate_shexp), {o.n_ff_shexp, E}, true);
                mat(n(names::blk::ffn_up_shexp), {o.n_ff_shexp, E}, true);
                mat(n(names::blk::ffn_down_shexp), {E, o.n_ff_shexp}, true);
                if (!latent) add(n(names::blk::ffn_gate_inp_shexp), {1, E}, dtype::f32, false, true);
            }
        } else {
            mat(n(names::blk::ffn_gate), {o.n_ff, E}, true);
            mat(n(names::blk::ffn_up), {o.n_ff, E}, true);
            mat(n(names::blk::ffn_down), {E, o.n_ff}, true);
        }
    }
    add(std::string(names::output_norm), {E}, dtype::f32, true, true);
    mat(std::string(names::output), {o.n_vocab, E}, true);
    sum.n_tensors = w.n_tensors();
    sum.file_size = w.write(output, progress, static_cast<unsigned>(usable_cpu_count())); // producers are independent
    sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return sum;
}

} // namespace colibri
