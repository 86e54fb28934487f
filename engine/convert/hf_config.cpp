// Hugging Face config.json + tensor names -> .colibri hyperparameters and tensor plan.
// Every family's quirks live in the family registry; the runtime sees flat flags.

#include "convert/convert.h"
#include "convert/latent_rows.h"
#include "convert/rope_scaling.h"
#include "convert/safetensors.h"
#include "core/error.h"
#include "core/half.h"
#include "format/tensor_names.h"
#include "model/family_registry.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace colibri {

using json = nlohmann::json;
using namespace format;

namespace {

std::string with_expert(std::string_view pattern, int e) {
    std::string s(pattern);
    const size_t at = s.find("{e}");
    if (at != std::string::npos) s.replace(at, 3, std::to_string(e));
    return s;
}

class config_reader {
public:
    config_reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

    bool has(std::string_view key) const { return j_.contains(key) && !j_.at(std::string(key)).is_null(); }

    uint32_t u32(std::string_view key) const {
        if (!has(key)) fail(key, "is missing");
        const json& v = j_.at(std::string(key));
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > UINT32_MAX) {
            fail(key, "is not a non-negative integer");
        }
        return v.get<uint32_t>();
    }
    uint32_t u32(std::string_view key, uint32_t fallback) const { return has(key) ? u32(key) : fallback; }

    float f32(std::string_view key, float fallback) const {
        if (!has(key)) return fallback;
        const json& v = j_.at(std::string(key));
        if (!v.is_number()) fail(key, "is not a number");
        return v.get<float>();
    }
    bool boolean(std::string_view key, bool fallback) const {
        if (!has(key)) return fallback;
        const json& v = j_.at(std::string(key));
        if (!v.is_boolean()) fail(key, "is not true/false");
        return v.get<bool>();
    }
    const json& raw(std::string_view key) const { return j_.at(std::string(key)); }

    [[noreturn]] void fail(std::string_view key, const std::string& what) const {
        throw error(errc::format, path_ + ": '" + std::string(key) + "' " + what);
    }
    [[noreturn]] void unsupported(const std::string& what) const {
        throw error(errc::unsupported, path_ + ": " + what);
    }

private:
    const json& j_;
    std::string path_;
};

std::string shape_text(const std::vector<uint64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

class planner {
public:
    planner(const safetensors_checkpoint& ckpt, const quant_choice& quant, const mix_shape& shape,
            checkpoint_plan& plan)
        : ckpt_(ckpt), quant_(quant), shape_(shape), plan_(plan) {}

    /// A matrix [rows, cols] from rows row0.. of matrix `index` of `src`.
    void matrix(const std::string& name, const std::string& src, uint64_t rows, uint64_t cols, uint64_t index = 0,
                uint64_t row0 = 0, bool keep_f32 = false) {
        const st_tensor& t = ckpt_.get(src);
        bool ok;
        if (t.shape.size() == 3) ok = index < t.shape[0] && row0 + rows <= t.shape[1] && t.shape[2] == cols;
        else ok = t.shape.size() == 2 && index == 0 && row0 + rows <= t.shape[0] && t.shape[1] == cols;
        if (!ok) bad_shape(src, t, shape_text({rows, cols}));
        const dtype type = keep_f32 ? dtype::f32 : quant_.matrix_type(name, cols, shape_);
        plan_.tensors.push_back({name, type, {rows, cols}, {src, index, row0, {}}, {}});
    }

    /// A matrix of the given rows of `src` [*, cols]; `small`: f32 or f16 as the source is
    /// (latent attention's per-head matrices), else a matrix of quant's type.
    void rows(const std::string& name, const std::string& src, std::vector<uint64_t> rows, uint64_t cols,
              bool small = false) {
        const st_tensor& t = ckpt_.get(src);
        const bool ok = t.shape.size() == 2 && t.shape[1] == cols &&
                        std::all_of(rows.begin(), rows.end(), [&](uint64_t r) { return r < t.shape[0]; });
        if (!ok)
            bad_shape(src, t,
                      "[" + std::to_string(*std::max_element(rows.begin(), rows.end()) + 1) + "+, " +
                          std::to_string(cols) + "]");
        const uint64_t n = rows.size();
        const dtype type = small ? small_type(t) : quant_.matrix_type(name, cols, shape_);
        plan_.tensors.push_back({name, type, {n, cols}, {src, 0, 0, std::move(rows)}, {}});
    }

    /// Latent attention's k_b [n_head * lora, nope]: each head's key rows of kv_b
    /// [n_head * (nope + v), lora], transposed.
    void transposed_heads(const std::string& name, const std::string& src, uint64_t n_head, uint64_t nope, uint64_t v,
                          uint64_t lora) {
        const st_tensor& t = ckpt_.get(src);
        if (t.shape != std::vector<uint64_t>{n_head * (nope + v), lora})
            bad_shape(src, t, shape_text({n_head * (nope + v), lora}));
        tensor_plan tp{name, small_type(t), {n_head * lora, nope}, {}, {}};
        tp.values.resize(n_head * lora * nope);
        for (uint64_t h = 0; h < n_head; ++h) {
            for (uint64_t i = 0; i < nope; ++i) {
                for (uint64_t c = 0; c < lora; ++c) {
                    tp.values[(h * lora + c) * nope + i] = st_element(t, ((h * (nope + v)) + i) * lora + c);
                }
            }
        }
        plan_.tensors.push_back(std::move(tp));
    }

    void vector(const std::string& name, const std::string& src, uint64_t n) {
        const st_tensor& t = ckpt_.get(src);
        if (t.shape.size() != 1 || t.shape[0] != n) bad_shape(src, t, shape_text({n}));
        plan_.tensors.push_back({name, dtype::f32, {n}, {src, 0, 0, {}}, {}});
    }

    /// A norm weight w stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w), in f32 as
    /// the reference computes it.
    void norm_plus_one(const std::string& name, const std::string& src, uint64_t n) {
        const st_tensor& t = ckpt_.get(src);
        if (t.shape.size() != 1 || t.shape[0] != n) bad_shape(src, t, shape_text({n}));
        tensor_plan tp{name, dtype::f32, {n}, {}, {}};
        tp.values.resize(n);
        for (uint64_t i = 0; i < n; ++i) tp.values[i] = 1.0f + st_element(t, i);
        plan_.tensors.push_back(std::move(tp));
    }
    /// A norm weight as the family stores it.
    void norm(const std::string& name, const std::string& src, uint64_t n, bool plus_one) {
        if (plus_one) norm_plus_one(name, src, n);
        else vector(name, src, n);
    }

    bool has(const std::string& src) const { return ckpt_.find(src) != nullptr; }

private:
    static dtype small_type(const st_tensor& t) { return t.type == st_dtype::f32 ? dtype::f32 : dtype::f16; }
    [[noreturn]] static void bad_shape(const std::string& src, const st_tensor& t, const std::string& expected) {
        throw error(errc::format,
                    t.file + ": tensor '" + src + "' has shape " + shape_text(t.shape) + ", expected " + expected);
    }

    const safetensors_checkpoint& ckpt_;
    quant_choice quant_;
    mix_shape shape_;
    checkpoint_plan& plan_;
};

checkpoint_plan plan_from_config(const std::string& cfg_path, const safetensors_checkpoint& ckpt,
                                 const quant_choice& quant);

// rope_scaling (rope_parameters in newer configs, which also hold rope_theta): the types
// transformers computes frequencies for that the runtime can express.
// Which layers attend through the window: layer_types (newer configs) or
// sliding_window_pattern, else the family's own (older configs have neither), as every N-th
// layer global and the rest local.
void read_swa_pattern(const config_reader& cfg, const family_info& fam, hparams& hp) {
    uint32_t pattern = cfg.u32("sliding_window_pattern", fam.swa_pattern);
    if (cfg.has("layer_types")) {
        const json& types = cfg.raw("layer_types");
        if (!types.is_array() || types.size() != hp.n_layer) cfg.fail("layer_types", "must list every layer");
        pattern = 0;
        for (uint32_t il = 0; il < types.size() && pattern == 0; ++il) {
            if (types[il] == "full_attention") pattern = il + 1;
        }
        if (pattern == 0) pattern = hp.n_layer + 1; // every layer local
        for (uint32_t il = 0; il < types.size(); ++il) {
            const bool local = (il + 1) % pattern != 0;
            if (types[il] != (local ? "sliding_attention" : "full_attention")) {
                cfg.unsupported("layer_types that do not repeat one local/global pattern are not supported");
            }
        }
    }
    hp.swa_pattern = pattern;
    // Gemma 3's local base (rope_parameters' own in newer configs), the family's by default;
    // Gemma 2 has one base
    hp.rope_theta_swa = cfg.f32("rope_local_base_freq", hp.rope_theta_swa > 0 ? hp.rope_theta_swa : fam.rope_theta_swa);
}

rope_scaling read_rope_scaling(const config_reader& cfg, hparams& hp) {
    rope_scaling rs;
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
        if (!cfg.has(key)) continue;
        const json& all = cfg.raw(key);
        if (!all.is_object()) cfg.fail(key, "is not an object");
        // transformers 5 writes Gemma 3's as a set per layer type: the global layers' scaling
        // and base, the local layers' base
        const bool by_layer_type = all.contains("full_attention") || all.contains("sliding_attention");
        if (by_layer_type && all.contains("sliding_attention")) {
            const json& local = all["sliding_attention"];
            if (!local.is_object()) cfg.fail(std::string(key) + ".sliding_attention", "is not an object");
            if (local.value("rope_type", std::string("default")) != "default")
                cfg.unsupported("scaled RoPE on the sliding-window layers is not supported");
            if (local.contains("rope_theta") && local["rope_theta"].is_number())
                hp.rope_theta_swa = local["rope_theta"].get<float>();
        }
        if (by_layer_type && !(all.contains("full_attention") && all["full_attention"].is_object()))
            cfg.fail(std::string(key) + ".full_attention", "is missing or not an object");
        const json& r = by_layer_type ? all["full_attention"] : all;
        if (r.contains("rope_theta") && r["rope_theta"].is_number()) hp.rope_theta = r["rope_theta"].get<float>();
        const std::string type = r.value("rope_type", r.value("type", std::string("default")));
        if (type == "default") continue;
        auto number = [&](const char* field, std::optional<double> fallback) -> double {
            if (!r.contains(field) || r[field].is_null()) {
                if (!fallback) cfg.fail(std::string(key) + "." + field, "is missing");
                return *fallback;
            }
            if (!r[field].is_number() || !(r[field].get<double>() > 0))
                cfg.fail(std::string(key) + "." + field, "is not a positive number");
            return r[field].get<double>();
        };
        rs.factor = number("factor", std::nullopt);
        if (type == "linear") {
            rs.type = rope_scaling::kind::linear;
        } else if (type == "llama3") {
            rs.type = rope_scaling::kind::llama3;
            rs.low_freq_factor = number("low_freq_factor", std::nullopt);
            rs.high_freq_factor = number("high_freq_factor", std::nullopt);
            rs.original_ctx = number("original_max_position_embeddings", std::nullopt);
            if (!(rs.high_freq_factor > rs.low_freq_factor))
                cfg.fail(std::string(key) + ".high_freq_factor", "must exceed low_freq_factor");
        } else if (type == "yarn") {
            rs.type = rope_scaling::kind::yarn;
            rs.original_ctx = number("original_max_position_embeddings", double(hp.n_ctx));
            rs.beta_fast = number("beta_fast", 32.0);
            rs.beta_slow = number("beta_slow", 1.0);
            if (r.contains("attention_factor") && !r["attention_factor"].is_null())
                rs.attention_factor = number("attention_factor", std::nullopt);
            rs.mscale = r.contains("mscale") && !r["mscale"].is_null() ? number("mscale", std::nullopt) : 0.0;
            rs.mscale_all_dim = r.contains("mscale_all_dim") && !r["mscale_all_dim"].is_null()
                                    ? number("mscale_all_dim", std::nullopt)
                                    : 0.0;
            if (r.contains("truncate") && r["truncate"].is_boolean()) rs.truncate = r["truncate"].get<bool>();
        } else {
            cfg.unsupported(std::string(key) + " of type '" + type + "' is not supported (linear, llama3, yarn)");
        }
    }
    return rs;
}

// DeepSeek's routing: softmax, the top k (from the best groups under group_limited_greedy),
// times routed_scaling_factor; n_shared_experts experts of the routed width, weight 1.
void read_deepseek_moe(const config_reader& cfg, hparams& hp) {
    if (cfg.u32("moe_layer_freq", 1) != 1) cfg.unsupported("moe_layer_freq other than 1 is not supported");
    const json& scoring = cfg.has("scoring_func") ? cfg.raw("scoring_func") : json("softmax");
    if (scoring != "softmax") cfg.unsupported("scoring_func " + scoring.dump() + " is not supported (softmax)");
    const json& method = cfg.has("topk_method") ? cfg.raw("topk_method") : json("greedy");
    if (method == "group_limited_greedy") {
        hp.n_expert_group = cfg.u32("n_group");
        hp.n_group_used = cfg.u32("topk_group");
        if (hp.n_expert_group == 0 || hp.n_expert_group > 64 || hp.n_expert % hp.n_expert_group != 0 ||
            hp.n_group_used == 0 || hp.n_group_used > hp.n_expert_group ||
            uint64_t(hp.n_group_used) * (hp.n_expert / hp.n_expert_group) < hp.n_expert_used) {
            cfg.fail("n_group",
                     "and topk_group must split the experts into at most 64 groups that hold num_experts_per_tok");
        }
        if (hp.n_expert_group == 1) hp.n_expert_group = hp.n_group_used = 0;
    } else if (method != "greedy") {
        cfg.unsupported("topk_method " + method.dump() + " is not supported (greedy, group_limited_greedy)");
    }
    hp.expert_weights_scale = cfg.f32("routed_scaling_factor", 1.0f);
    if (!(hp.expert_weights_scale > 0)) cfg.fail("routed_scaling_factor", "must be positive");
    hp.n_ff_shexp = cfg.u32("n_shared_experts", 0) * hp.n_ff_exp;
}

// Latent attention's projections (DeepSeek-V2): the query's and the latent's rows split into
// their roped and plain parts, kv_b into the per-head k_b (transposed) and v_b.
void plan_latent_attention(planner& p, const hparams& hp, int il, const std::string& attn) {
    auto name = [il](std::string_view s) { return names::layer(il, s); };
    const uint64_t H = hp.n_head, r = hp.rope_dim, nope = hp.head_dim - r, L = hp.kv_lora_rank, v = hp.v_head_dim;
    uint64_t q_in = hp.n_embd;
    std::string q = attn + "q_proj.weight";
    if (hp.q_lora_rank > 0) {
        q_in = hp.q_lora_rank;
        p.matrix(name(names::blk::attn_q_a), attn + "q_a_proj.weight", q_in, hp.n_embd);
        p.vector(name(names::blk::attn_q_a_norm), attn + "q_a_layernorm.weight", q_in);
        q = attn + "q_b_proj.weight";
    }
    p.rows(name(names::blk::attn_q_nope), q, head_rows(H, nope + r, 0, nope, false), q_in);
    p.rows(name(names::blk::attn_q_pe), q, head_rows(H, nope + r, nope, r, true), q_in);
    const std::string kv_a = attn + "kv_a_proj_with_mqa.weight";
    p.rows(name(names::blk::attn_kv_a), kv_a, head_rows(1, L + r, 0, L, false), hp.n_embd);
    p.rows(name(names::blk::attn_k_pe), kv_a, head_rows(1, L + r, L, r, true), hp.n_embd);
    p.vector(name(names::blk::attn_kv_a_norm), attn + "kv_a_layernorm.weight", L);
    p.transposed_heads(name(names::blk::attn_k_b), attn + "kv_b_proj.weight", H, nope, v, L);
    p.rows(name(names::blk::attn_v_b), attn + "kv_b_proj.weight", head_rows(H, nope + v, nope, v, false), L, true);
    p.matrix(name(names::blk::attn_output), attn + "o_proj.weight", hp.n_embd, H * v);
}

} // namespace

checkpoint_plan plan_checkpoint(const std::string& dir, const safetensors_checkpoint& ckpt, const quant_choice& quant) {
    const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
    try {
        return plan_from_config(cfg_path, ckpt, quant);
    } catch (const json::exception& e) { // a field of the wrong JSON type
        throw error(errc::format, cfg_path + ": " + e.what());
    }
}

namespace {

checkpoint_plan plan_from_config(const std::string& cfg_path, const safetensors_checkpoint& ckpt,
                                 const quant_choice& quant) {
    std::ifstream in(cfg_path);
    if (!in) throw error(errc::io, cfg_path + ": cannot open");
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        throw error(errc::format, cfg_path + ": invalid JSON: " + e.what());
    }
    if (!j.is_object()) throw error(errc::format, cfg_path + ": not a JSON object");
    const config_reader cfg(j, cfg_path);

    if (!cfg.has("architectures") || !cfg.raw("architectures").is_array() || cfg.raw("architectures").empty()) {
        cfg.fail("architectures", "is missing");
    }
    const std::string hf_arch = cfg.raw("architectures")[0].get<std::string>();
    const family_info* fam = find_hf_family(hf_arch);
    if (fam == nullptr) {
        cfg.unsupported("architecture " + hf_arch + " is not supported (supported: " + known_hf_architectures() + ")");
    }

    checkpoint_plan plan;
    plan.family = std::string(fam->name());
    hparams& hp = plan.hp;
    hp.arch = static_cast<uint32_t>(fam->arch);
    hp.n_layer = cfg.u32("num_hidden_layers");
    hp.n_embd = cfg.u32("hidden_size");
    hp.n_head = cfg.u32("num_attention_heads");
    hp.n_head_kv = cfg.u32("num_key_value_heads", hp.n_head);
    if (hp.n_head == 0 || hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0) {
        cfg.fail("num_key_value_heads", "must divide num_attention_heads");
    }
    hp.head_dim = cfg.u32("head_dim", hp.n_embd / hp.n_head);
    if (fam->blocks.latent_attention()) { // one cached latent row per position, in the place of n_head_kv heads
        hp.n_head_kv = 1;
        hp.kv_lora_rank = cfg.u32("kv_lora_rank");
        hp.q_lora_rank = cfg.u32("q_lora_rank", 0);
        hp.rope_dim = cfg.u32("qk_rope_head_dim");
        hp.v_head_dim = cfg.u32("v_head_dim");
        hp.head_dim = cfg.u32("qk_nope_head_dim") + hp.rope_dim;
        if (hp.kv_lora_rank == 0 || hp.rope_dim == 0 || hp.rope_dim % 2 != 0 || hp.head_dim == hp.rope_dim ||
            hp.v_head_dim == 0) {
            cfg.fail("kv_lora_rank", "and qk_nope_head_dim, qk_rope_head_dim (even), v_head_dim must be positive");
        }
        if (cfg.boolean("attention_bias", false))
            cfg.unsupported("attention_bias with latent attention is not supported");
    }
    hp.n_vocab = cfg.u32("vocab_size");
    hp.n_ctx = cfg.u32("max_position_embeddings", 4096);
    hp.norm_eps = fam->blocks.layer_norm() ? cfg.f32("norm_epsilon", 1e-5f) : cfg.f32("rms_norm_eps", 1e-6f);
    if (fam->blocks.layer_norm()) hp.flags |= flag_layer_norm;
    // rope_theta moved into rope_parameters in newer configs
    hp.rope_theta = cfg.f32("rope_theta", 10000.0f);
    const rope_scaling rope = read_rope_scaling(cfg, hp);
    // Gemma names it hidden_activation
    const std::string act = j.value("hidden_activation", j.value("hidden_act", std::string("silu")));
    const bool gelu = fam->blocks.ffn == ffn_kind::gelu_mlp, uses_gelu = fam->blocks.ffn != ffn_kind::swiglu;
    if (uses_gelu && act != "gelu_pytorch_tanh")
        cfg.unsupported("hidden_act '" + act + "' is not supported (gelu_pytorch_tanh)");
    if (!uses_gelu && act != "silu") cfg.unsupported("hidden_act '" + act + "' is not supported (silu)");
    if (gelu) hp.flags |= flag_gelu_mlp;
    if (fam->blocks.ffn == ffn_kind::geglu) hp.flags |= flag_geglu;
    if (fam->blocks.sandwich_norm) hp.flags |= flag_sandwich_norm;
    if (cfg.has("attn_logit_softcapping")) { // Gemma 2
        hp.attn_softcap = cfg.f32("attn_logit_softcapping", 0.0f);
        if (!(hp.attn_softcap > 0)) cfg.fail("attn_logit_softcapping", "must be positive");
    }
    if (cfg.has("final_logit_softcapping")) {
        hp.final_softcap = cfg.f32("final_logit_softcapping", 0.0f);
        if (!(hp.final_softcap > 0)) cfg.fail("final_logit_softcapping", "must be positive");
    }
    if (cfg.has("clip_qkv")) cfg.unsupported("clip_qkv is not supported");
    if (cfg.boolean("mlp_bias", false)) cfg.unsupported("mlp_bias is not supported");
    if (fam->sliding_window > 0 || fam->swa_pattern > 0) { // the family's layers (some of them) attend through a window
        hp.sliding_window = cfg.u32("sliding_window", 0);
        if (fam->swa_pattern > 0 && hp.sliding_window > 0) read_swa_pattern(cfg, *fam, hp);
    } else if (fam->hf_window_key) { // Mistral's: a window on every layer unless null
        if (cfg.has("sliding_window") && !cfg.raw("sliding_window").is_null())
            hp.sliding_window = cfg.u32("sliding_window", 0);
    } else if (cfg.boolean("use_sliding_window", false)) {
        // Qwen2 windows the layers from max_window_layers on: none when that covers them all
        if (fam->arch != format::arch::qwen2 || cfg.u32("max_window_layers", 0) < hp.n_layer)
            cfg.unsupported("sliding-window attention is not supported");
    }
    if (cfg.boolean("use_bidirectional_attention", false))
        cfg.unsupported("bidirectional attention (use_bidirectional_attention) is not supported");
    hp.qk_norm = static_cast<uint32_t>(fam->blocks.qk);
    hp.embedding_scale = 1.0f;
    hp.residual_scale = 1.0f;
    hp.logit_scale = 1.0f;
    hp.attention_scale = 0.0f;
    if (fam->embed_scale_sqrt) { // in the embeddings' type, as the reference multiplies
        const float s = std::sqrt(float(hp.n_embd));
        const st_tensor& embd = ckpt.get("model.embed_tokens.weight");
        hp.embedding_scale = embd.type == st_dtype::bf16  ? bf16_to_f32(f32_to_bf16(s))
                             : embd.type == st_dtype::f16 ? f16_to_f32(f32_to_f16(s))
                                                          : s;
    }
    if (cfg.has("query_pre_attn_scalar")) {
        const float q = cfg.f32("query_pre_attn_scalar", 0.0f);
        if (!(q > 0)) cfg.fail("query_pre_attn_scalar", "must be positive");
        hp.attention_scale = 1.0f / std::sqrt(q);
    }
    if (fam->granite_scales) {
        hp.embedding_scale = cfg.f32("embedding_multiplier", 1.0f);
        hp.residual_scale = cfg.f32("residual_multiplier", 1.0f);
        hp.attention_scale = cfg.f32("attention_multiplier", 1.0f / std::sqrt(float(hp.head_dim)));
        const float ls = cfg.f32("logits_scaling", 1.0f);
        if (!(ls > 0)) cfg.fail("logits_scaling", "must be positive");
        hp.logit_scale = 1.0f / ls;
    }
    const hf_moe_names& moe_names = fam->hf_moe;
    if (!fam->moe) {
        hp.n_ff = cfg.u32("intermediate_size");
    } else {
        // newer transformers write num_local_experts where older configs had num_experts
        const std::string_view other = moe_names.n_expert_key == "num_experts" ? "num_local_experts" : "num_experts";
        hp.n_expert =
            cfg.has(moe_names.n_expert_key) || !cfg.has(other) ? cfg.u32(moe_names.n_expert_key) : cfg.u32(other);
        hp.n_expert_used = cfg.u32("num_experts_per_tok");
        hp.n_ff_exp = cfg.u32(moe_names.n_ff_exp_key);
        if (hp.n_expert == 0 || hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert) {
            cfg.fail("num_experts_per_tok", "must be in 1..number of experts");
        }
        bool norm = fam->norm_topk_default;
        if (fam->norm_topk_configurable) norm = cfg.boolean("norm_topk_prob", norm);
        // transformers' DeepSeek-V2 scales the top k by routed_scaling_factor and never
        // renormalises; DeepSeek's own code does one or the other
        if (norm && fam->arch == format::arch::deepseek2)
            cfg.unsupported("norm_topk_prob true with DeepSeek-V2's routed scale is not supported");
        if (norm) hp.flags |= flag_norm_topk_prob;
        if (fam->blocks.shared_experts == shared_experts_kind::gated) {
            hp.n_ff_shexp = cfg.u32("shared_expert_intermediate_size", 0);
            if (hp.n_ff_shexp > 0) hp.flags |= flag_shared_expert_gate;
        }
        if (fam->blocks.shared_experts == shared_experts_kind::ungated) read_deepseek_moe(cfg, hp);
    }

    const bool tied = cfg.boolean("tie_word_embeddings", false) || ckpt.find("lm_head.weight") == nullptr;
    if (tied) hp.flags |= flag_tie_embeddings;
    const bool attn_bias = ckpt.find("model.layers.0.self_attn.q_proj.bias") != nullptr;
    if (attn_bias) hp.flags |= flag_attn_bias;
    // StarCoder2's use_bias: the output projection and the MLP have biases too
    const bool out_bias = ckpt.find("model.layers.0.self_attn.o_proj.bias") != nullptr;
    if (out_bias && !gelu) cfg.unsupported("an output-projection bias (o_proj.bias) is not supported");
    if (out_bias) hp.flags |= flag_out_bias;

    const mix_shape shape{hp.n_layer, hp.n_expert, tied};
    hp.weight_type =
        static_cast<uint32_t>(matmul_storage(quant.matrix_type(names::layer(0, names::blk::attn_q), hp.n_embd, shape),
                                             hp.n_head * hp.head_dim)); // as blk.0.attn_q is stored
    planner p(ckpt, quant, shape, plan);
    const uint64_t q_dim = uint64_t(hp.n_head) * hp.head_dim, kv_dim = uint64_t(hp.n_head_kv) * hp.head_dim;
    p.matrix(std::string(names::token_embd), "model.embed_tokens.weight", hp.n_vocab, hp.n_embd);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const int l = static_cast<int>(il);
        const std::string pre = "model.layers." + std::to_string(il) + ".";
        auto name = [l](std::string_view s) { return names::layer(l, s); };
        const bool plus_one = fam->blocks.norm_plus_one();
        p.norm(name(names::blk::attn_norm), pre + "input_layernorm.weight", hp.n_embd, plus_one);
        if (fam->blocks.layer_norm())
            p.vector(name(names::blk::attn_norm_bias), pre + "input_layernorm.bias", hp.n_embd);
        if (fam->blocks.latent_attention()) {
            plan_latent_attention(p, hp, l, pre + "self_attn.");
        } else {
            p.matrix(name(names::blk::attn_q), pre + "self_attn.q_proj.weight", q_dim, hp.n_embd);
            p.matrix(name(names::blk::attn_k), pre + "self_attn.k_proj.weight", kv_dim, hp.n_embd);
            p.matrix(name(names::blk::attn_v), pre + "self_attn.v_proj.weight", kv_dim, hp.n_embd);
            p.matrix(name(names::blk::attn_output), pre + "self_attn.o_proj.weight", hp.n_embd, q_dim);
        }
        if (out_bias) p.vector(name(names::blk::attn_output_bias), pre + "self_attn.o_proj.bias", hp.n_embd);
        if (attn_bias) {
            p.vector(name(names::blk::attn_q_bias), pre + "self_attn.q_proj.bias", q_dim);
            p.vector(name(names::blk::attn_k_bias), pre + "self_attn.k_proj.bias", kv_dim);
            p.vector(name(names::blk::attn_v_bias), pre + "self_attn.v_proj.bias", kv_dim);
        }
        if (fam->blocks.qk == qk_norm::per_head) {
            p.norm(name(names::blk::attn_q_norm), pre + "self_attn.q_norm.weight", hp.head_dim, plus_one);
            p.norm(name(names::blk::attn_k_norm), pre + "self_attn.k_norm.weight", hp.head_dim, plus_one);
        } else if (fam->blocks.qk == qk_norm::full) {
            p.vector(name(names::blk::attn_q_norm), pre + "self_attn.q_norm.weight", q_dim);
            p.vector(name(names::blk::attn_k_norm), pre + "self_attn.k_norm.weight", kv_dim);
        }
        if (fam->blocks.sandwich_norm) { // Gemma: post_attention_layernorm normalises the attention's output
            p.norm(name(names::blk::attn_post_norm), pre + "post_attention_layernorm.weight", hp.n_embd, plus_one);
            p.norm(name(names::blk::ffn_norm), pre + "pre_feedforward_layernorm.weight", hp.n_embd, plus_one);
            p.norm(name(names::blk::ffn_post_norm), pre + "post_feedforward_layernorm.weight", hp.n_embd, plus_one);
        } else {
            p.vector(name(names::blk::ffn_norm), pre + "post_attention_layernorm.weight", hp.n_embd);
        }
        if (fam->blocks.layer_norm())
            p.vector(name(names::blk::ffn_norm_bias), pre + "post_attention_layernorm.bias", hp.n_embd);

        const std::string moe = pre + std::string(moe_names.prefix) + ".";
        const std::string router = moe + std::string(moe_names.router);
        if (hp.n_expert > 0 && p.has(router)) {
            p.matrix(name(names::blk::ffn_gate_inp), router, hp.n_expert, hp.n_embd, 0, 0, true);
            for (int e = 0; e < static_cast<int>(hp.n_expert); ++e) {
                if (moe_names.expert_gate.empty()) { // input_linear [E, 2*n_ff, n_embd]: gate rows, then up rows
                    p.matrix(names::expert(l, e, names::exp::gate), moe + "input_linear.weight", hp.n_ff_exp, hp.n_embd,
                             e, 0);
                    p.matrix(names::expert(l, e, names::exp::up), moe + "input_linear.weight", hp.n_ff_exp, hp.n_embd,
                             e, hp.n_ff_exp);
                    p.matrix(names::expert(l, e, names::exp::down), moe + "output_linear.weight", hp.n_embd,
                             hp.n_ff_exp, e, 0);
                } else {
                    p.matrix(names::expert(l, e, names::exp::gate), moe + with_expert(moe_names.expert_gate, e),
                             hp.n_ff_exp, hp.n_embd);
                    p.matrix(names::expert(l, e, names::exp::up), moe + with_expert(moe_names.expert_up, e),
                             hp.n_ff_exp, hp.n_embd);
                    p.matrix(names::expert(l, e, names::exp::down), moe + with_expert(moe_names.expert_down, e),
                             hp.n_embd, hp.n_ff_exp);
                }
            }
            if (hp.n_ff_shexp > 0) { // Qwen2-MoE's gated shared_expert, or DeepSeek's shared_experts
                const std::string shared =
                    moe +
                    (fam->blocks.shared_experts == shared_experts_kind::ungated ? "shared_experts." : "shared_expert.");
                p.matrix(name(names::blk::ffn_gate_shexp), shared + "gate_proj.weight", hp.n_ff_shexp, hp.n_embd);
                p.matrix(name(names::blk::ffn_up_shexp), shared + "up_proj.weight", hp.n_ff_shexp, hp.n_embd);
                p.matrix(name(names::blk::ffn_down_shexp), shared + "down_proj.weight", hp.n_embd, hp.n_ff_shexp);
                if (hp.flags & flag_shared_expert_gate) {
                    p.matrix(name(names::blk::ffn_gate_inp_shexp), moe + "shared_expert_gate.weight", 1, hp.n_embd, 0,
                             0, true);
                }
            }
        } else {
            // a dense layer (dense Llama, or an MoE family's mlp_only_layers)
            if (hp.n_ff == 0) hp.n_ff = cfg.u32("intermediate_size");
            const std::string mlp = pre + "mlp.";
            if (!gelu)
                p.matrix(name(names::blk::ffn_gate), mlp + std::string(fam->hf_gate()) + ".weight", hp.n_ff, hp.n_embd);
            p.matrix(name(names::blk::ffn_up), mlp + std::string(fam->hf_up()) + ".weight", hp.n_ff, hp.n_embd);
            p.matrix(name(names::blk::ffn_down), mlp + std::string(fam->hf_down()) + ".weight", hp.n_embd, hp.n_ff);
            if (out_bias) {
                p.vector(name(names::blk::ffn_up_bias), mlp + std::string(fam->hf_up()) + ".bias", hp.n_ff);
                p.vector(name(names::blk::ffn_down_bias), mlp + std::string(fam->hf_down()) + ".bias", hp.n_embd);
            }
        }
    }
    p.norm(std::string(names::output_norm), "model.norm.weight", hp.n_embd, fam->blocks.norm_plus_one());
    if (fam->blocks.layer_norm()) p.vector(std::string(names::output_norm_bias), "model.norm.bias", hp.n_embd);
    if (!tied) p.matrix(std::string(names::output), "lm_head.weight", hp.n_vocab, hp.n_embd);
    if (rope.type != rope_scaling::kind::none) {
        const uint32_t roped = fam->blocks.latent_attention() ? hp.rope_dim : hp.head_dim;
        hp.rope_attn_factor = rope_attn_factor(rope);
        tensor_plan freqs{std::string(names::rope_freqs), dtype::f32, {roped / 2}, {}, {}};
        freqs.values = rope_freq_factors(rope, hp.rope_theta, static_cast<int>(roped));
        plan.tensors.push_back(std::move(freqs));
        // DeepSeek's YaRN also scales the scores by mscale(mscale_all_dim)^2, as its own code and
        // llama.cpp do (transformers' DeepseekV2 leaves it out)
        if (fam->blocks.latent_attention() && rope.type == rope_scaling::kind::yarn && rope.mscale_all_dim > 0) {
            const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
            hp.attention_scale = static_cast<float>(m * m / std::sqrt(double(hp.head_dim)));
        }
    }
    return plan;
}

} // namespace

} // namespace colibri
