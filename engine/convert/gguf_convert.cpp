// GGUF file -> .colibri: metadata to hyperparameters, tensors to ours (experts split,
// llama.cpp's rotary row order undone), the embedded vocabulary to a tokenizer section.
// Every architecture's quirks are in the family registry; docs/gguf.md describes the mapping.

#include "convert/convert.h"
#include "convert/latent_rows.h"

#include "convert/ggml_quants.h"
#include "convert/gguf_file.h"
#include "convert/gguf_tokenizer.h"
#include "convert/rope_scaling.h"
#include "core/error.h"
#include "format/row_codec.h"
#include "format/tensor_names.h"
#include "model/family_registry.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

namespace colibri {

using namespace format;

namespace {

/// ggml types whose blocks are byte for byte one of ours.
bool same_layout(uint32_t ggml_type, dtype t) {
    return (ggml_type == ggml::f32 && t == dtype::f32) || (ggml_type == ggml::f16 && t == dtype::f16) ||
           (ggml_type == ggml::bf16 && t == dtype::bf16) || (ggml_type == ggml::q8_0 && t == dtype::q8_0) ||
           (ggml_type == ggml::q4_0 && t == dtype::q4_0) || (ggml_type == ggml::q4_k && t == dtype::q4_k) ||
           (ggml_type == ggml::q5_k && t == dtype::q5_k) || (ggml_type == ggml::q6_k && t == dtype::q6_k) ||
           (ggml_type == ggml::q4_1 && t == dtype::q4_1) || (ggml_type == ggml::q5_0 && t == dtype::q5_0) ||
           (ggml_type == ggml::q5_1 && t == dtype::q5_1) || (ggml_type == ggml::iq4_nl && t == dtype::iq4_nl) ||
           (ggml_type == ggml::iq4_xs && t == dtype::iq4_xs) || (ggml_type == ggml::q2_k && t == dtype::q2_k) ||
           (ggml_type == ggml::q3_k && t == dtype::q3_k);
}

/// What "keep" writes for a source type: the same layout where we have it, else q8_0.
dtype kept_type(uint32_t ggml_type) {
    switch (ggml_type) {
    case ggml::f32: return dtype::f32;
    case ggml::f16: return dtype::f16;
    case ggml::bf16: return dtype::bf16;
    case ggml::q4_0: return dtype::q4_0;
    case ggml::q4_k: return dtype::q4_k;
    case ggml::q5_k: return dtype::q5_k;
    case ggml::q6_k: return dtype::q6_k;
    case ggml::q4_1: return dtype::q4_1;
    case ggml::q5_0: return dtype::q5_0;
    case ggml::q5_1: return dtype::q5_1;
    case ggml::iq4_nl: return dtype::iq4_nl;
    case ggml::iq4_xs: return dtype::iq4_xs;
    case ggml::q2_k: return dtype::q2_k;
    case ggml::q3_k: return dtype::q3_k;
    default: return dtype::q8_0;
    }
}

struct planned {
    std::string name;
    dtype type;
    std::vector<uint64_t> shape; // ours, outermost first
    const gguf_tensor* src;
    uint64_t index = 0;         // matrix of a stacked 3-D source
    std::vector<uint64_t> rows; // when not empty: the source row of each row (of matrix `index`)
    size_t conversion = 0;      // index into the summary's conversions
    std::vector<float> values;  // computed by the converter (src null), stored as `type`
};

/// The source row of each row of a q or k matrix of `heads` heads that llama.cpp's converter
/// permuted: it stores row (h, j, i) of Hugging Face's layout (head h, half j, pair i) at
/// (h, i, j), giving interleaved RoPE pairs; our rotate-half RoPE wants the original order.
std::vector<uint64_t> unpermuted_rows(uint64_t rows, uint64_t heads) {
    std::vector<uint64_t> src(rows);
    const uint64_t head = rows / heads;
    for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t h = r / head, within = r % head, j = within / (head / 2), i = within % (head / 2);
        src[r] = h * head + 2 * i + j;
    }
    return src;
}

std::string shape_text(const std::vector<uint64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

class gguf_planner {
public:
    gguf_planner(const gguf_file& f, std::optional<quant_choice> quant, std::vector<type_conversion>& conv)
        : f_(f), quant_(quant), conv_(conv) {}

    mix_shape shape; ///< for quant's mixes

    const gguf_tensor& get(const std::string& name) const {
        const gguf_tensor* t = f_.find_tensor(name);
        if (t == nullptr) throw error(errc::format, f_.path() + ": tensor '" + name + "' is missing");
        return *t;
    }
    bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

    /// A matrix [rows, cols] from `src` ([rows, cols], or matrix `index` of [n, rows, cols]).
    void matrix(const std::string& name, const std::string& src, uint64_t rows, uint64_t cols, bool router = false,
                uint32_t perm_heads = 0) {
        const gguf_tensor& t = get(src);
        const std::vector<uint64_t> s = t.torch_shape();
        const bool ok = (s.size() == 2 && s[0] == rows && s[1] == cols) || (s.size() == 1 && rows == 1 && s[0] == cols);
        if (!ok) bad_shape(t, shape_text({rows, cols}));
        add(name, t, {rows, cols}, 0, perm_heads ? unpermuted_rows(rows, perm_heads) : std::vector<uint64_t>{},
            router ? kind::router : kind::matrix);
    }
    void expert(const std::string& name, const std::string& src, uint64_t e, uint64_t n_expert, uint64_t rows,
                uint64_t cols) {
        const gguf_tensor& t = get(src);
        const std::vector<uint64_t> s = t.torch_shape();
        if (s.size() != 3 || s[0] != n_expert || s[1] != rows || s[2] != cols)
            bad_shape(t, shape_text({n_expert, rows, cols}));
        add(name, t, {rows, cols}, e, {}, kind::matrix);
    }
    /// The given rows of `src` [n, cols] (or of its [a, b, cols] taken as [a * b, cols]);
    /// `small`: f32, or f16 for any other source type (latent attention's per-head matrices).
    void rows(const std::string& name, const std::string& src, std::vector<uint64_t> rows, uint64_t cols,
              bool small = false) {
        const gguf_tensor& t = get(src);
        const std::vector<uint64_t> s = t.torch_shape();
        const uint64_t n = s.size() == 3 ? s[0] * s[1] : s.size() == 2 ? s[0] : 0;
        const bool ok = s.size() >= 2 && s.back() == cols &&
                        std::all_of(rows.begin(), rows.end(), [&](uint64_t r) { return r < n; });
        if (!ok)
            bad_shape(t, "[" + std::to_string(*std::max_element(rows.begin(), rows.end()) + 1) + "+, " +
                             std::to_string(cols) + "]");
        const uint64_t count = rows.size();
        add(name, t, {count, cols}, 0, std::move(rows), small ? kind::small : kind::matrix);
    }
    /// Latent attention's k_b [n_head * lora, nope] from a file that has only kv_b
    /// [n_head * (nope + v), lora] (older conversions): each head's key rows, transposed.
    void transposed_heads(const std::string& name, const std::string& src, uint64_t n_head, uint64_t nope, uint64_t v,
                          uint64_t lora) {
        const gguf_tensor& t = get(src);
        if (t.torch_shape() != std::vector<uint64_t>{n_head * (nope + v), lora})
            bad_shape(t, shape_text({n_head * (nope + v), lora}));
        check_readable(t);
        std::vector<float> row(lora), values(n_head * lora * nope);
        const uint64_t rb = ggml::row_bytes(t.type, lora);
        for (uint64_t h = 0; h < n_head; ++h) {
            for (uint64_t i = 0; i < nope; ++i) {
                ggml::dequantize_row(t.type, t.data + (h * (nope + v) + i) * rb, row.data(),
                                     static_cast<int64_t>(lora));
                check_finite(row, f_.path(), t.name, h * (nope + v) + i);
                for (uint64_t c = 0; c < lora; ++c) values[(h * lora + c) * nope + i] = row[c];
            }
        }
        const dtype type = t.type == ggml::f32 ? dtype::f32 : dtype::f16;
        plan.push_back({name, type, {n_head * lora, nope}, nullptr, 0, {}, 0, std::move(values)});
    }
    void vector(const std::string& name, const std::string& src, uint64_t n) {
        const gguf_tensor& t = get(src);
        if (t.torch_shape() != std::vector<uint64_t>{n}) bad_shape(t, shape_text({n}));
        check_readable(t);
        plan.push_back(
            {name, dtype::f32, {n}, &t, 0, {}, conversion(t.type, dtype::f32, same_layout(t.type, dtype::f32)), {}});
    }

    /// A vector the converter computed.
    void computed(const std::string& name, std::vector<float> values) {
        plan.push_back({name, dtype::f32, {values.size()}, nullptr, 0, {}, 0, std::move(values)});
    }

    std::vector<planned> plan;

private:
    [[noreturn]] void bad_shape(const gguf_tensor& t, const std::string& expected) const {
        throw error(errc::format, f_.path() + ": tensor '" + t.name + "' has shape " + shape_text(t.torch_shape()) +
                                      " (outermost first), expected " + expected);
    }
    void check_readable(const gguf_tensor& t) const {
        const ggml::type_info* ti = ggml::find_type(t.type);
        if (ti == nullptr || !ti->readable) {
            throw error(errc::unsupported,
                        f_.path() + ": tensor '" + t.name + "' has type " + ggml::type_name(t.type) +
                            ", which is not supported (supported: " + std::string(ggml::readable_types()) + ")");
        }
    }
    enum class kind { matrix, router, small };
    void add(const std::string& name, const gguf_tensor& t, std::vector<uint64_t> dims, uint64_t index,
             std::vector<uint64_t> rows, kind k) {
        check_readable(t);
        dtype type = k == kind::router  ? dtype::f32
                     : k == kind::small ? (t.type == ggml::f32 ? dtype::f32 : dtype::f16)
                     : quant_           ? quant_->matrix_type(name, dims[1], shape)
                                        : kept_type(t.type);
        if (row_bytes(type, dims[1]) == 0) type = dtype::f16; // rows that do not fill whole blocks
        plan.push_back({name,
                        type,
                        std::move(dims),
                        &t,
                        index,
                        std::move(rows),
                        conversion(t.type, type, same_layout(t.type, type)),
                        {}});
    }
    size_t conversion(uint32_t from, dtype to, bool copied) {
        const std::string name = ggml::type_name(from);
        for (size_t i = 0; i < conv_.size(); ++i) {
            if (conv_[i].from == name && conv_[i].to == to) return i;
        }
        conv_.push_back({name, to, 0, 0, copied, 0, 0});
        return conv_.size() - 1;
    }

    const gguf_file& f_;
    std::optional<quant_choice> quant_;
    std::vector<type_conversion>& conv_;
};

struct gguf_plan {
    std::string family;
    hparams hp{};
    std::vector<planned> tensors;
};

// Latent attention's projections (deepseek2): the query's and the latent's rows split into
// their roped and plain parts; k_b and v_b as newer files split them, or from kv_b.
void plan_latent_attention(gguf_planner& pl, const hparams& hp, int il) {
    auto n = [il](std::string_view s) { return names::layer(il, s); };
    const uint64_t H = hp.n_head, r = hp.rope_dim, nope = hp.head_dim - r, L = hp.kv_lora_rank, v = hp.v_head_dim;
    uint64_t q_in = hp.n_embd;
    std::string q = n(names::blk::attn_q);
    if (hp.q_lora_rank > 0) {
        q_in = hp.q_lora_rank;
        pl.matrix(n(names::blk::attn_q_a), n(names::blk::attn_q_a), q_in, hp.n_embd);
        pl.vector(n(names::blk::attn_q_a_norm), n(names::blk::attn_q_a_norm), q_in);
        q = n("attn_q_b.weight");
    }
    pl.rows(n(names::blk::attn_q_nope), q, head_rows(H, nope + r, 0, nope, false), q_in);
    pl.rows(n(names::blk::attn_q_pe), q, head_rows(H, nope + r, nope, r, true), q_in);
    const std::string kv_a = n("attn_kv_a_mqa.weight");
    pl.rows(n(names::blk::attn_kv_a), kv_a, head_rows(1, L + r, 0, L, false), hp.n_embd);
    pl.rows(n(names::blk::attn_k_pe), kv_a, head_rows(1, L + r, L, r, true), hp.n_embd);
    pl.vector(n(names::blk::attn_kv_a_norm), n(names::blk::attn_kv_a_norm), L);
    if (pl.has(n(names::blk::attn_k_b))) { // [H, L, nope] and [H, v, L]
        pl.rows(n(names::blk::attn_k_b), n(names::blk::attn_k_b), head_rows(1, H * L, 0, H * L, false), nope, true);
        pl.rows(n(names::blk::attn_v_b), n(names::blk::attn_v_b), head_rows(1, H * v, 0, H * v, false), L, true);
    } else {
        pl.transposed_heads(n(names::blk::attn_k_b), n("attn_kv_b.weight"), H, nope, v, L);
        pl.rows(n(names::blk::attn_v_b), n("attn_kv_b.weight"), head_rows(H, nope + v, nope, v, false), L, true);
    }
    pl.matrix(n(names::blk::attn_output), n(names::blk::attn_output), hp.n_embd, H * v);
}

gguf_plan plan_gguf(const gguf_file& f, std::optional<quant_choice> quant, std::vector<type_conversion>& conv) {
    const std::string a = f.string_of("general.architecture");
    const family_info* desc = find_gguf_family(a, f.get_uint(a + ".expert_count").value_or(0) > 0);
    if (desc == nullptr) {
        throw error(errc::unsupported, f.path() + ": architecture '" + a +
                                           "' is not supported (supported: " + known_gguf_architectures() + ")");
    }
    auto key = [&a](std::string_view k) { return a + "." + std::string(k); };
    auto u32 = [&](std::string_view k, std::optional<uint32_t> fallback = std::nullopt) -> uint32_t {
        const auto v = f.get_uint(key(k));
        if (!v) {
            if (fallback) return *fallback;
            f.fail("metadata '" + key(k) + "' is missing");
        }
        if (*v > UINT32_MAX) f.fail("metadata '" + key(k) + "' is out of range");
        return static_cast<uint32_t>(*v);
    };
    auto unsupported = [&](const std::string& what) {
        throw error(errc::unsupported, f.path() + ": " + what + " is not supported");
    };

    gguf_plan p;
    hparams& hp = p.hp;
    hp.n_layer = u32("block_count");
    hp.n_embd = u32("embedding_length");
    hp.n_head = u32("attention.head_count");
    hp.n_head_kv = u32("attention.head_count_kv", hp.n_head);
    if (hp.n_layer == 0 || hp.n_embd == 0 || hp.n_head == 0 || hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0) {
        f.fail("inconsistent attention shape (" + key("attention.head_count_kv") + " must divide " +
               key("attention.head_count") + ")");
    }
    hp.head_dim = u32("attention.key_length", hp.n_embd / hp.n_head);
    if (desc->blocks.latent_attention()) {
        // newer files state the latent's sizes as key_length (kv_lora_rank + rope) and
        // value_length (kv_lora_rank), the heads' own as key_length_mla and value_length_mla
        hp.n_head_kv = 1;
        hp.kv_lora_rank = u32("attention.kv_lora_rank");
        hp.q_lora_rank = u32("attention.q_lora_rank", 0);
        hp.rope_dim = u32("rope.dimension_count");
        hp.v_head_dim = u32("attention.value_length_mla", u32("attention.value_length"));
        hp.head_dim = u32("attention.key_length_mla", hp.head_dim);
        if (hp.kv_lora_rank == 0 || hp.rope_dim == 0 || hp.rope_dim % 2 != 0 || hp.rope_dim >= hp.head_dim ||
            hp.v_head_dim == 0) {
            f.fail("inconsistent latent attention sizes (" + key("attention.kv_lora_rank") + ", " +
                   key("rope.dimension_count") + ", " + key("attention.key_length_mla") + ", " +
                   key("attention.value_length_mla") + ")");
        }
    } else {
        if (u32("attention.value_length", hp.head_dim) != hp.head_dim)
            unsupported("a value length other than the key length");
        if (u32("rope.dimension_count", hp.head_dim) != hp.head_dim)
            unsupported("RoPE over part of a head (" + key("rope.dimension_count") + ")");
    }
    if (hp.head_dim == 0 || hp.head_dim % 2 != 0) f.fail(key("attention.key_length") + " must be even");
    hp.n_ctx = u32("context_length", 4096);
    hp.rope_theta = static_cast<float>(f.get_float(key("rope.freq_base")).value_or(10000.0));
    // RoPE scaling: linear by its factor; llama3 comes as the rope_freqs tensor llama.cpp's
    // converter computed, read below
    rope_scaling rope;
    const std::string scaling_type = f.get_string(key("rope.scaling.type")).value_or("none");
    const double scaling_factor = f.get_float(key("rope.scaling.factor")).value_or(0.0);
    if (scaling_type == "linear" || (scaling_type == "none" && scaling_factor != 0.0 && scaling_factor != 1.0)) {
        if (!(scaling_factor > 0)) f.fail(key("rope.scaling.factor") + " must be positive");
        rope.type = rope_scaling::kind::linear;
        rope.factor = scaling_factor;
    } else if (scaling_type == "yarn" && desc->blocks.latent_attention()) {
        // DeepSeek's YaRN as llama.cpp runs it: cos and sin unscaled, the scores by
        // (1 + yarn_log_multiplier * ln factor)^2 (the multiplier stored as 0.1 * mscale_all_dim)
        if (!(scaling_factor > 1)) f.fail(key("rope.scaling.factor") + " must exceed 1");
        if (f.get_float(key("rope.scaling.yarn_attn_factor")).value_or(1.0) != 1.0)
            unsupported("a YaRN attention factor other than 1");
        rope.type = rope_scaling::kind::yarn;
        rope.factor = scaling_factor;
        rope.original_ctx = u32("rope.scaling.original_context_length");
        rope.beta_fast = f.get_float(key("rope.scaling.yarn_beta_fast")).value_or(32.0);
        rope.beta_slow = f.get_float(key("rope.scaling.yarn_beta_slow")).value_or(1.0);
        rope.mscale = rope.mscale_all_dim = f.get_float(key("rope.scaling.yarn_log_multiplier")).value_or(0.0) / 0.1;
        if (!(rope.original_ctx > 0) || !(rope.beta_fast > 0) || !(rope.beta_slow > 0) || !(rope.mscale >= 0)) {
            f.fail("inconsistent YaRN settings (" + key("rope.scaling") + ".*)");
        }
    } else if (scaling_type != "none") {
        unsupported("RoPE scaling '" + scaling_type + "' (" + key("rope.scaling.type") + ")");
    }
    const std::string eps_key =
        key(desc->blocks.layer_norm() ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon");
    const auto eps = f.get_float(eps_key);
    if (!eps) {
        if (f.find(key("attention.layer_norm_epsilon")))
            unsupported("LayerNorm (" + key("attention.layer_norm_epsilon") + ")");
        f.fail("metadata '" + eps_key + "' is missing");
    }
    hp.norm_eps = static_cast<float>(*eps);
    if (desc->blocks.layer_norm()) hp.flags |= flag_layer_norm;
    if (desc->blocks.ffn == ffn_kind::gelu_mlp) hp.flags |= flag_gelu_mlp;
    // llama.cpp's files do not record StarCoder2's window: the family's own then
    if (desc->sliding_window > 0) {
        hp.sliding_window = u32("attention.sliding_window", desc->sliding_window);
    } else if (desc->swa_pattern > 0) { // Gemma 3: local layers, every N-th global (llama.cpp's defaults)
        hp.sliding_window = u32("attention.sliding_window", 0);
        if (hp.sliding_window > 0) {
            hp.swa_pattern = u32("attention.sliding_window_pattern", desc->swa_pattern);
            hp.rope_theta_swa =
                static_cast<float>(f.get_float(key("rope.freq_base_swa")).value_or(desc->rope_theta_swa));
            if (desc->rope_theta_swa == 0) hp.rope_theta_swa = 0; // one base for every layer (Gemma 2)
        }
    } else if (f.find(key("attention.sliding_window"))) {
        unsupported("sliding-window attention");
    }
    if (desc->blocks.ffn == ffn_kind::geglu) hp.flags |= flag_geglu;
    if (desc->blocks.sandwich_norm) hp.flags |= flag_sandwich_norm;
    hp.attn_softcap = static_cast<float>(f.get_float(key("attn_logit_softcapping")).value_or(0.0));
    if (!(hp.attn_softcap >= 0)) f.fail(key("attn_logit_softcapping") + " must be positive");
    hp.final_softcap = static_cast<float>(f.get_float(key("final_logit_softcapping")).value_or(0.0));
    if (!(hp.final_softcap >= 0)) f.fail(key("final_logit_softcapping") + " must be positive");
    if (const auto g = f.get_uint(key("expert_gating_func")); g && *g != 1)
        unsupported("expert gating other than softmax");
    hp.embedding_scale = hp.residual_scale = hp.logit_scale = 1.0f;
    hp.attention_scale = 0.0f;
    if (desc->embed_scale_sqrt) {
        hp.embedding_scale = std::sqrt(float(hp.n_embd));
        // query_pre_attn_scalar is not in llama.cpp's files: its rule (head_dim, but n_embd / n_head
        // for the 27B) unless attention.scale says
        const float qs = hp.n_layer == desc->gguf_wide_query_layers ? float(hp.n_embd / hp.n_head) : float(hp.head_dim);
        hp.attention_scale = static_cast<float>(f.get_float(key("attention.scale")).value_or(1.0 / std::sqrt(qs)));
    }
    if (desc->granite_scales) {
        hp.embedding_scale = static_cast<float>(f.get_float(key("embedding_scale")).value_or(1.0));
        hp.residual_scale = static_cast<float>(f.get_float(key("residual_scale")).value_or(1.0));
        hp.attention_scale = static_cast<float>(f.get_float(key("attention.scale")).value_or(0.0));
        const double ls = f.get_float(key("logit_scale")).value_or(1.0);
        if (!(ls > 0)) f.fail(key("logit_scale") + " must be positive");
        hp.logit_scale = static_cast<float>(1.0 / ls); // llama.cpp divides the logits by it
    }
    hp.n_expert = u32("expert_count", 0);
    hp.n_expert_used = u32("expert_used_count", 0);
    if (hp.n_expert > 0 && (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert)) {
        f.fail(key("expert_used_count") + " must be in 1.." + key("expert_count"));
    }
    hp.arch = static_cast<uint32_t>(desc->arch);
    p.family = std::string(desc->name());
    hp.qk_norm = static_cast<uint32_t>(desc->blocks.qk);
    if (hp.n_expert > 0 && f.get_bool(key("expert_weights_norm")).value_or(desc->norm_topk_default))
        hp.flags |= flag_norm_topk_prob;
    if (desc->blocks.shared_experts == shared_experts_kind::ungated &&
        hp.n_expert > 0) { // DeepSeek's routing (model_file checks the groups)
        hp.expert_weights_scale = static_cast<float>(f.get_float(key("expert_weights_scale")).value_or(1.0));
        if (!(hp.expert_weights_scale > 0)) f.fail(key("expert_weights_scale") + " must be positive");
        hp.n_expert_group = u32("expert_group_count", 1);
        hp.n_group_used = u32("expert_group_used_count", 1);
        if (hp.n_expert_group <= 1) hp.n_expert_group = hp.n_group_used = 0;
    }

    gguf_planner pl(f, quant, conv);
    const gguf_tensor& embd = pl.get(std::string(names::token_embd));
    if (embd.ne.size() != 2 || embd.ne[0] != hp.n_embd)
        f.fail("tensor 'token_embd.weight' does not have rows of " + key("embedding_length"));
    hp.n_vocab = static_cast<uint32_t>(embd.ne[1]);
    const bool tied = !pl.has(std::string(names::output));
    if (tied) hp.flags |= flag_tie_embeddings;
    pl.shape = {hp.n_layer, hp.n_expert, tied};
    if (pl.has("blk.0.attn_q.bias")) hp.flags |= flag_attn_bias;
    if (pl.has("blk.0.attn_output.bias")) {
        if (desc->blocks.ffn != ffn_kind::gelu_mlp) unsupported("an output-projection bias (attn_output.bias)");
        hp.flags |= flag_out_bias; // StarCoder2: the MLP's too
    }
    if (pl.has("blk.0.ffn_gate_inp_shexp.weight")) hp.flags |= flag_shared_expert_gate;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (pl.has(names::layer(int(il), "exp_probs_b.bias")))
            unsupported("an expert score bias (exp_probs_b, DeepSeek-V3's routing)");
    }
    auto rows_of = [&](const std::string& name) { return pl.get(name).torch_shape().end()[-2]; };

    const uint64_t q_dim = uint64_t(hp.n_head) * hp.head_dim, kv_dim = uint64_t(hp.n_head_kv) * hp.head_dim;
    pl.matrix(std::string(names::token_embd), std::string(names::token_embd), hp.n_vocab, hp.n_embd);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const int l = static_cast<int>(il);
        auto n = [l](std::string_view s) { return names::layer(l, s); };
        pl.vector(n(names::blk::attn_norm), n(names::blk::attn_norm), hp.n_embd);
        if (desc->blocks.layer_norm())
            pl.vector(n(names::blk::attn_norm_bias), n(names::blk::attn_norm_bias), hp.n_embd);
        if (desc->blocks.latent_attention()) {
            plan_latent_attention(pl, hp, l);
        } else {
            const uint32_t qp = desc->gguf_permuted_qk ? hp.n_head : 0, kp = desc->gguf_permuted_qk ? hp.n_head_kv : 0;
            pl.matrix(n(names::blk::attn_q), n(names::blk::attn_q), q_dim, hp.n_embd, false, qp);
            pl.matrix(n(names::blk::attn_k), n(names::blk::attn_k), kv_dim, hp.n_embd, false, kp);
            pl.matrix(n(names::blk::attn_v), n(names::blk::attn_v), kv_dim, hp.n_embd);
            pl.matrix(n(names::blk::attn_output), n(names::blk::attn_output), hp.n_embd, q_dim);
        }
        if (hp.flags & flag_out_bias)
            pl.vector(n(names::blk::attn_output_bias), n(names::blk::attn_output_bias), hp.n_embd);
        if (hp.flags & flag_attn_bias) {
            if (desc->gguf_permuted_qk) unsupported("q/k biases with llama's rotary row order");
            pl.vector(n(names::blk::attn_q_bias), n(names::blk::attn_q_bias), q_dim);
            pl.vector(n(names::blk::attn_k_bias), n(names::blk::attn_k_bias), kv_dim);
            pl.vector(n(names::blk::attn_v_bias), n(names::blk::attn_v_bias), kv_dim);
        }
        if (desc->blocks.qk != qk_norm::none) {
            const bool per_head = desc->blocks.qk == qk_norm::per_head;
            pl.vector(n(names::blk::attn_q_norm), n(names::blk::attn_q_norm), per_head ? hp.head_dim : q_dim);
            pl.vector(n(names::blk::attn_k_norm), n(names::blk::attn_k_norm), per_head ? hp.head_dim : kv_dim);
        }
        pl.vector(n(names::blk::ffn_norm), n(names::blk::ffn_norm), hp.n_embd);
        if (desc->blocks.layer_norm()) pl.vector(n(names::blk::ffn_norm_bias), n(names::blk::ffn_norm_bias), hp.n_embd);
        if (desc->blocks.sandwich_norm) { // llama.cpp's converter stored Gemma's 1 + w already
            pl.vector(n(names::blk::attn_post_norm), n(names::blk::attn_post_norm), hp.n_embd);
            pl.vector(n(names::blk::ffn_post_norm), n(names::blk::ffn_post_norm), hp.n_embd);
        }
        if (hp.n_expert > 0 && pl.has(n(names::blk::ffn_gate_inp))) {
            pl.matrix(n(names::blk::ffn_gate_inp), n(names::blk::ffn_gate_inp), hp.n_expert, hp.n_embd, true);
            const std::string stacked = n("ffn_gate_exps.weight");
            const bool is_stacked = pl.has(stacked);
            // older files: one 2-D tensor per expert, blk.N.ffn_gate.E.weight
            auto per_expert = [&](std::string_view kind, int e) {
                return n(std::string(kind) + "." + std::to_string(e) + ".weight");
            };
            if (hp.n_ff_exp == 0)
                hp.n_ff_exp = static_cast<uint32_t>(is_stacked ? rows_of(stacked) : rows_of(per_expert("ffn_gate", 0)));
            for (int e = 0; e < static_cast<int>(hp.n_expert); ++e) {
                for (std::string_view kind : {names::exp::gate, names::exp::up, names::exp::down}) {
                    const bool down = kind == names::exp::down;
                    const uint64_t rows = down ? hp.n_embd : hp.n_ff_exp, cols = down ? hp.n_ff_exp : hp.n_embd;
                    if (is_stacked)
                        pl.expert(names::expert(l, e, kind), n(std::string(kind) + "_exps.weight"), e, hp.n_expert,
                                  rows, cols);
                    else pl.matrix(names::expert(l, e, kind), per_expert(kind, e), rows, cols);
                }
            }
            if (pl.has(n(names::blk::ffn_gate_shexp))) {
                if (hp.n_ff_shexp == 0) hp.n_ff_shexp = static_cast<uint32_t>(rows_of(n(names::blk::ffn_gate_shexp)));
                pl.matrix(n(names::blk::ffn_gate_shexp), n(names::blk::ffn_gate_shexp), hp.n_ff_shexp, hp.n_embd);
                pl.matrix(n(names::blk::ffn_up_shexp), n(names::blk::ffn_up_shexp), hp.n_ff_shexp, hp.n_embd);
                pl.matrix(n(names::blk::ffn_down_shexp), n(names::blk::ffn_down_shexp), hp.n_embd, hp.n_ff_shexp);
                if (desc->blocks.shared_experts != shared_experts_kind::ungated) {
                    if (!(hp.flags & flag_shared_expert_gate))
                        unsupported("a shared expert without its gate (ffn_gate_inp_shexp)");
                    pl.matrix(n(names::blk::ffn_gate_inp_shexp), n(names::blk::ffn_gate_inp_shexp), 1, hp.n_embd, true);
                }
            }
        } else {
            // a dense layer (dense Llama, or an MoE family's dense layers)
            const bool gelu = desc->blocks.ffn == ffn_kind::gelu_mlp;
            if (hp.n_ff == 0)
                hp.n_ff = static_cast<uint32_t>(rows_of(n(gelu ? names::blk::ffn_up : names::blk::ffn_gate)));
            if (!gelu) pl.matrix(n(names::blk::ffn_gate), n(names::blk::ffn_gate), hp.n_ff, hp.n_embd);
            pl.matrix(n(names::blk::ffn_up), n(names::blk::ffn_up), hp.n_ff, hp.n_embd);
            pl.matrix(n(names::blk::ffn_down), n(names::blk::ffn_down), hp.n_embd, hp.n_ff);
            if (hp.flags & flag_out_bias) {
                pl.vector(n(names::blk::ffn_up_bias), n(names::blk::ffn_up_bias), hp.n_ff);
                pl.vector(n(names::blk::ffn_down_bias), n(names::blk::ffn_down_bias), hp.n_embd);
            }
        }
    }
    pl.vector(std::string(names::output_norm), std::string(names::output_norm), hp.n_embd);
    if (desc->blocks.layer_norm())
        pl.vector(std::string(names::output_norm_bias), std::string(names::output_norm_bias), hp.n_embd);
    if (!tied) pl.matrix(std::string(names::output), std::string(names::output), hp.n_vocab, hp.n_embd);
    const uint32_t roped = desc->blocks.latent_attention() ? hp.rope_dim : hp.head_dim;
    if (pl.has(std::string(names::rope_freqs))) {
        if (rope.type != rope_scaling::kind::none) unsupported("RoPE scaling and a rope_freqs tensor together");
        pl.vector(std::string(names::rope_freqs), std::string(names::rope_freqs), roped / 2);
    } else if (rope.type != rope_scaling::kind::none) {
        pl.computed(std::string(names::rope_freqs), rope_freq_factors(rope, hp.rope_theta, static_cast<int>(roped)));
        if (rope.type == rope_scaling::kind::yarn) { // DeepSeek's, above
            const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
            hp.attention_scale = static_cast<float>(m * m / std::sqrt(double(hp.head_dim)));
        }
    }
    for (const planned& t : pl.plan) { // as blk.0.attn_q is stored (informative)
        if (t.name == names::layer(0, names::blk::attn_q) || t.name == names::layer(0, names::blk::attn_q_nope))
            hp.weight_type = static_cast<uint32_t>(matmul_storage(t.type, t.shape[0]));
    }
    p.tensors = std::move(pl.plan);
    return p;
}

} // namespace

convert_summary convert_gguf(const std::string& input, const std::string& output, std::optional<quant_choice> quant,
                             const model_writer::progress& progress, std::optional<fim_order> order) {
    const auto t0 = std::chrono::steady_clock::now();
    const gguf_file f(input);
    auto conv = std::make_shared<std::vector<type_conversion>>();
    gguf_plan plan = plan_gguf(f, quant, *conv);
    tokenizer_section tok = import_gguf_tokenizer(f);
    if (tok.n_tokens > plan.hp.n_vocab) {
        f.fail("the vocabulary has " + std::to_string(tok.n_tokens) + " tokens, more than the " +
               std::to_string(plan.hp.n_vocab) + " rows of token_embd.weight");
    }
    tok.header.payload_size = tok.payload.size();
    if (order == fim_order::spm) tok.header.flags |= format::tok_fim_spm;
    make_tokenizer(tok.header, tok.payload, plan.hp.n_vocab, input); // refuses what the engine could not load
    model_writer w(plan.hp, tok.header, std::move(tok.payload));
    std::vector<std::pair<std::string, uint64_t>> sizes;
    for (const planned& t : plan.tensors) {
        if (t.src == nullptr) { // computed: no conversion to account for
            const uint64_t cols = t.shape.back();
            w.add_tensor(t.name, t.type, t.shape, [values = t.values, type = t.type, cols](uint8_t* dst) {
                const uint64_t rb = row_bytes(type, cols);
                for (uint64_t r = 0; r < values.size() / cols; ++r) {
                    format::row_from_f32(type, values.data() + r * cols, dst + r * rb, static_cast<int64_t>(cols));
                }
            });
            if (t.name != names::rope_freqs) sizes.emplace_back(t.name, t.values.size());
            continue;
        }
        const uint64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.shape.back();
        type_conversion& c = (*conv)[t.conversion];
        c.n_tensors += 1;
        c.n_elements += rows * cols;
        w.add_tensor(t.name, t.type, t.shape, [t, rows, cols, conv, &input](uint8_t* dst) {
            const gguf_tensor& src = *t.src;
            const uint64_t src_rb = ggml::row_bytes(src.type, cols);
            const uint64_t rb = row_bytes(t.type, cols);
            const uint8_t* base = src.data + t.index * rows * src_rb;
            type_conversion& stats = (*conv)[t.conversion];
            std::vector<float> x(cols), back(cols);
            for (uint64_t r = 0; r < rows; ++r) {
                const uint64_t sr = t.rows.empty() ? r : t.rows[r];
                const uint8_t* srow = base + sr * src_rb;
                uint8_t* drow = dst + r * rb;
                // every value read, copied blocks too: a NaN or an infinity is refused by name
                ggml::dequantize_row(src.type, srow, x.data(), static_cast<int64_t>(cols));
                check_finite(x, input, t.src->name, r);
                if (stats.copied) {
                    std::memcpy(drow, srow, rb);
                    continue;
                }
                format::row_from_f32(t.type, x.data(), drow, static_cast<int64_t>(cols));
                format::row_to_f32(t.type, drow, back.data(), static_cast<int64_t>(cols));
                for (uint64_t k = 0; k < cols; ++k) {
                    const double e = double(back[k]) - double(x[k]);
                    stats.err2 += e * e;
                    stats.ref2 += double(x[k]) * double(x[k]);
                }
            }
        });
        sizes.emplace_back(t.name, rows * cols);
    }
    convert_summary sum;
    sum.family = plan.family;
    sum.n_tensors = plan.tensors.size();
    count_params(plan.hp, sizes, sum);
    sum.file_size = w.write(output, progress);
    sum.conversions = *conv;
    sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return sum;
}

} // namespace colibri
