#include "model/model.h"

#include "core/error.h"
#include "format/tensor_names.h"

#include <cmath>
#include <unordered_set>

namespace colibri {

using namespace format;

namespace {

std::string shape_text(const uint64_t* shape, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

} // namespace

model::model(const std::string& path) : file_(path) {
    const hparams& hp = file_.hp();
    const uint64_t n_embd = hp.n_embd;
    const uint64_t q_dim = uint64_t(hp.n_head) * hp.head_dim;
    const uint64_t kv_dim = uint64_t(hp.n_head_kv) * hp.head_dim;

    token_embd_ = require(std::string(names::token_embd), {hp.n_vocab, n_embd}, kind::matrix);
    output_norm_ = require(std::string(names::output_norm), {n_embd}, kind::vector);
    const bool layer_norm = (hp.flags & flag_layer_norm) != 0, out_bias = (hp.flags & flag_out_bias) != 0;
    if (layer_norm) output_norm_bias_ = require(std::string(names::output_norm_bias), {n_embd}, kind::vector);
    output_ = (hp.flags & flag_tie_embeddings)
                  ? token_embd_
                  : require(std::string(names::output), {hp.n_vocab, n_embd}, kind::matrix);

    const bool mla = hp.kv_lora_rank > 0;
    const uint64_t rope_pairs = (mla ? hp.rope_dim : hp.head_dim) / 2;
    rope_freqs_ = optional(std::string(names::rope_freqs), {rope_pairs}, kind::vector);
    if (rope_freqs_ != nullptr) {
        const auto* f = reinterpret_cast<const float*>(rope_freqs_->data);
        for (uint64_t i = 0; i < rope_pairs; ++i) {
            if (!std::isfinite(f[i]) || f[i] <= 0) {
                throw error(errc::format,
                            file_.path() + ": tensor 'rope_freqs.weight' holds a value that is not a positive number");
            }
        }
    }

    layers_.resize(hp.n_layer);
    for (int il = 0; il < static_cast<int>(hp.n_layer); ++il) {
        layer_weights& l = layers_[il];
        auto name = [il](std::string_view suffix) { return names::layer(il, suffix); };
        l.attn_norm = require(name(names::blk::attn_norm), {n_embd}, kind::vector);
        if (layer_norm) l.attn_norm_bias = require(name(names::blk::attn_norm_bias), {n_embd}, kind::vector);
        if (mla) {
            load_mla(il, l.mla);
            l.wo = require(name(names::blk::attn_output), {n_embd, uint64_t(hp.n_head) * hp.v_head_dim}, kind::matrix);
        } else {
            l.wq = require(name(names::blk::attn_q), {q_dim, n_embd}, kind::matrix);
            l.wk = require(name(names::blk::attn_k), {kv_dim, n_embd}, kind::matrix);
            l.wv = require(name(names::blk::attn_v), {kv_dim, n_embd}, kind::matrix);
            l.wo = require(name(names::blk::attn_output), {n_embd, q_dim}, kind::matrix);
        }
        if (out_bias) l.bo = require(name(names::blk::attn_output_bias), {n_embd}, kind::vector);
        if (hp.flags & flag_attn_bias) {
            l.bq = require(name(names::blk::attn_q_bias), {q_dim}, kind::vector);
            l.bk = require(name(names::blk::attn_k_bias), {kv_dim}, kind::vector);
            l.bv = require(name(names::blk::attn_v_bias), {kv_dim}, kind::vector);
        }
        switch (static_cast<qk_norm>(hp.qk_norm)) {
        case qk_norm::none: break;
        case qk_norm::per_head:
            l.q_norm = require(name(names::blk::attn_q_norm), {hp.head_dim}, kind::vector);
            l.k_norm = require(name(names::blk::attn_k_norm), {hp.head_dim}, kind::vector);
            break;
        case qk_norm::full:
            l.q_norm = require(name(names::blk::attn_q_norm), {q_dim}, kind::vector);
            l.k_norm = require(name(names::blk::attn_k_norm), {kv_dim}, kind::vector);
            break;
        }
        l.ffn_norm = require(name(names::blk::ffn_norm), {n_embd}, kind::vector);
        if (layer_norm) l.ffn_norm_bias = require(name(names::blk::ffn_norm_bias), {n_embd}, kind::vector);
        if (hp.flags & flag_sandwich_norm) {
            l.attn_post_norm = require(name(names::blk::attn_post_norm), {n_embd}, kind::vector);
            l.ffn_post_norm = require(name(names::blk::ffn_post_norm), {n_embd}, kind::vector);
        }

        l.router =
            hp.n_expert ? optional(name(names::blk::ffn_gate_inp), {hp.n_expert, n_embd}, kind::router) : nullptr;
        if (l.router != nullptr) {
            l.experts.resize(hp.n_expert);
            for (int e = 0; e < static_cast<int>(hp.n_expert); ++e) {
                l.experts[e].gate =
                    require(names::expert(il, e, names::exp::gate), {hp.n_ff_exp, n_embd}, kind::matrix);
                l.experts[e].up = require(names::expert(il, e, names::exp::up), {hp.n_ff_exp, n_embd}, kind::matrix);
                l.experts[e].down =
                    require(names::expert(il, e, names::exp::down), {n_embd, hp.n_ff_exp}, kind::matrix);
            }
            if (hp.n_ff_shexp > 0) {
                l.shared.gate = require(name(names::blk::ffn_gate_shexp), {hp.n_ff_shexp, n_embd}, kind::matrix);
                l.shared.up = require(name(names::blk::ffn_up_shexp), {hp.n_ff_shexp, n_embd}, kind::matrix);
                l.shared.down = require(name(names::blk::ffn_down_shexp), {n_embd, hp.n_ff_shexp}, kind::matrix);
                if (hp.flags & flag_shared_expert_gate) {
                    l.shared_gate = require(name(names::blk::ffn_gate_inp_shexp), {1, n_embd}, kind::router);
                }
            }
        } else {
            if (hp.n_ff == 0) {
                throw error(errc::format, file_.path() + ": layer " + std::to_string(il) + " has no router ('" +
                                              name(names::blk::ffn_gate_inp) +
                                              "') and the model has no dense FFN width");
            }
            if (!(hp.flags & flag_gelu_mlp))
                l.dense.gate = require(name(names::blk::ffn_gate), {hp.n_ff, n_embd}, kind::matrix);
            l.dense.up = require(name(names::blk::ffn_up), {hp.n_ff, n_embd}, kind::matrix);
            l.dense.down = require(name(names::blk::ffn_down), {n_embd, hp.n_ff}, kind::matrix);
            if (out_bias) {
                l.dense.up_bias = require(name(names::blk::ffn_up_bias), {hp.n_ff}, kind::vector);
                l.dense.down_bias = require(name(names::blk::ffn_down_bias), {n_embd}, kind::vector);
            }
        }
    }
    count_params();
}

void model::load_mla(int il, mla_weights& m) const {
    const hparams& hp = file_.hp();
    auto name = [il](std::string_view suffix) { return names::layer(il, suffix); };
    const uint64_t n_head = hp.n_head, nope = hp.head_dim - hp.rope_dim, lora = hp.kv_lora_rank;
    uint64_t q_in = hp.n_embd;
    if (hp.q_lora_rank > 0) {
        q_in = hp.q_lora_rank;
        m.q_a = require(name(names::blk::attn_q_a), {q_in, hp.n_embd}, kind::matrix);
        m.q_a_norm = require(name(names::blk::attn_q_a_norm), {q_in}, kind::vector);
    }
    m.q_nope = require(name(names::blk::attn_q_nope), {n_head * nope, q_in}, kind::matrix);
    m.q_pe = require(name(names::blk::attn_q_pe), {n_head * hp.rope_dim, q_in}, kind::matrix);
    m.kv_a = require(name(names::blk::attn_kv_a), {lora, hp.n_embd}, kind::matrix);
    m.kv_a_norm = require(name(names::blk::attn_kv_a_norm), {lora}, kind::vector);
    m.k_pe = require(name(names::blk::attn_k_pe), {hp.rope_dim, hp.n_embd}, kind::matrix);
    m.k_b = require(name(names::blk::attn_k_b), {n_head * lora, nope}, kind::small);
    m.v_b = require(name(names::blk::attn_v_b), {n_head * hp.v_head_dim, lora}, kind::small);
}

const tensor_view* model::optional(const std::string& name, std::initializer_list<uint64_t> shape, kind k) const {
    const tensor_view* t = file_.find(name);
    if (t == nullptr) return nullptr;
    const bool same = t->n_dims == static_cast<int>(shape.size()) && std::equal(shape.begin(), shape.end(), t->shape);
    if (!same) {
        throw error(errc::format, file_.path() + ": tensor '" + name + "' has shape " +
                                      shape_text(t->shape, t->n_dims) + ", expected " +
                                      shape_text(shape.begin(), shape.size()));
    }
    if (k == kind::vector && t->type != dtype::f32) {
        throw error(errc::format, file_.path() + ": tensor '" + name + "' has dtype " +
                                      std::string(dtype_name(t->type)) + ", expected f32");
    }
    if (k == kind::small && t->type != dtype::f32 && t->type != dtype::f16) {
        throw error(errc::format, file_.path() + ": tensor '" + name + "' has dtype " +
                                      std::string(dtype_name(t->type)) + ", expected f32 or f16");
    }
    if (k == kind::router && is_quantized(t->type)) {
        throw error(errc::format, file_.path() + ": tensor '" + name + "' has dtype " +
                                      std::string(dtype_name(t->type)) +
                                      ": routing weights must be stored at 16 bits or more");
    }
    return t;
}

const tensor_view* model::require(const std::string& name, std::initializer_list<uint64_t> shape, kind k) const {
    const tensor_view* t = optional(name, shape, k);
    if (t == nullptr) throw error(errc::format, file_.path() + ": missing tensor '" + name + "'");
    return t;
}

void model::count_params() {
    const hparams& hp = file_.hp();
    std::unordered_set<const tensor_view*> seen;
    auto add = [&](const tensor_view* t, bool active) {
        if (t == nullptr || !seen.insert(t).second) return;
        n_params_ += t->n_elements();
        if (active) n_params_active_ += t->n_elements();
    };
    add(output_, true);
    add(output_norm_, true);
    add(output_norm_bias_, true);
    add(token_embd_, false); // a lookup touches one row (unless tied to the LM head)
    n_params_active_ += hp.n_embd;
    for (const layer_weights& l : layers_) {
        for (const tensor_view* t : l.shared_tensors()) add(t, true);
        for (size_t e = 0; e < l.experts.size(); ++e) {
            const bool active = e < hp.n_expert_used; // any k experts cost the same
            add(l.experts[e].gate, active);
            add(l.experts[e].up, active);
            add(l.experts[e].down, active);
        }
    }
}

double model::decode_weight_bytes() const {
    const auto& h = hp();
    double bytes = double(output().size) + double(output_norm().size) + double(token_embd().size) / h.n_vocab;
    if (output_norm_bias_ != nullptr) bytes += double(output_norm_bias_->size);
    for (const layer_weights& l : layers_) {
        for (const tensor_view* t : l.shared_tensors()) {
            if (t != nullptr) bytes += double(t->size);
        }
        double experts = 0;
        for (const expert_weights& e : l.experts) experts += double(e.gate->size + e.up->size + e.down->size);
        if (!l.experts.empty()) bytes += experts / double(l.experts.size()) * h.n_expert_used;
    }
    return bytes;
}

} // namespace colibri
