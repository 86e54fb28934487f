// Every supported family against Hugging Face transformers: logits at every prompt
// position and a 32-token greedy continuation, from fixtures made by
// tests/reference/generate.py (computed in float64 from the stored weights).

#include "api/runtime.h"
#include "conformance_util.h"
#include "convert/convert.h"
#include "core/error.h"
#include "generate/generate.h"
#include "generate/perplexity.h"
#include "model/session.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace colibri;
using test::compare;
using test::error_stats;
using test::load_reference;
using test::reference;
using test::run_greedy;
using test::run_logits;

namespace {

std::unique_ptr<runtime> convert_and_load(const std::string& family, format::dtype q, test::temp_dir& dir,
                                          bool f32_activations = false) {
    const std::string path = dir.file(family + "-" + std::string(format::dtype_name(q)) + ".colibri");
    if (!std::filesystem::exists(path)) convert_checkpoint(test::fixture(family), path, q, {});
    return load_runtime(path, "cpu", 2, f32_activations);
}

const std::vector<std::string> fixture_families = test::conformance_fixtures();

// A copy of a fixture's checkpoint in dir/name with its config.json changed by `edit`.
template <class Edit>
std::string edited_fixture(test::temp_dir& dir, const std::string& family, const std::string& name, Edit edit) {
    const std::string ckpt = dir.file(name);
    std::filesystem::copy(test::fixture(family), ckpt); // the directory's files
    nlohmann::json cfg;
    {
        std::ifstream in(ckpt + "/config.json");
        cfg = nlohmann::json::parse(in);
    }
    edit(cfg);
    std::ofstream(ckpt + "/config.json") << cfg.dump(2);
    return ckpt;
}

// A checkpoint converted (f32) to path and loaded.
std::unique_ptr<runtime> converted(const std::string& ckpt, const std::string& path) {
    convert_checkpoint(ckpt, path, format::dtype::f32, {});
    return load_runtime(path, "cpu", 1);
}

// The converter's refusal of a checkpoint, by its message.
void check_refused(const std::string& ckpt, const std::string& path, const std::string& message) {
    try {
        convert_checkpoint(ckpt, path, format::dtype::f32, {});
        FAIL("accepted: " << ckpt);
    } catch (const colibri::error& e) {
        CHECK(e.code() == errc::unsupported);
        CHECK(std::string(e.what()).find(message) != std::string::npos);
    }
}

// Error budgets of the weight types against the reference, over every family
// (measured values in docs/model-format.md). The fixtures are random networks with large
// weights, which amplify weight error about 15x into the logits; trained models are far
// less sensitive, so these budgets are loose for real models but still catch a broken
// kernel or converter (which gives a KL divergence of several nats).
struct budget {
    format::dtype type;
    bool f32_activations; // q8_0/q4_0 only; other types always use f32 activations
    double min_top1;
    double max_kl;
};
// Measured on these tiny random models (whose nearly flat logits make top-1 fragile): int8
// activations (the default) add to q8_0 about as much error again as its weights (mean KL
// 0.0002-0.008 against 0.0002-0.003 with f32 activations); to q4_0 they add next to nothing.
const budget budgets[] = {
    {format::dtype::f16, false, 1.0, 1e-5},  {format::dtype::bf16, false, 0.95, 5e-4},
    {format::dtype::q8_0, true, 0.85, 6e-3}, {format::dtype::q8_0, false, 0.8, 1.2e-2},
    {format::dtype::q4_0, true, 0.25, 0.6},  {format::dtype::q4_0, false, 0.25, 0.6},
};

} // namespace

TEST_CASE("f32 logits at every position match transformers") {
    for (const std::string& family : fixture_families) {
        CAPTURE(family);
        const reference r = load_reference(family);
        test::temp_dir dir;
        auto rt = convert_and_load(family, format::dtype::f32, dir);
        REQUIRE(rt->mdl->hp().n_vocab == uint32_t(r.n_vocab));
        for (int batch : {1, 7, 32}) {
            CAPTURE(batch);
            const error_stats st = compare(r, run_logits(*rt, r.prompt, batch));
            MESSAGE(family << " f32 batch " << batch << ": max relative logit error " << st.max_rel);
            CHECK(st.max_rel < 1e-5);
            CHECK(st.top1 == 1.0);
        }
    }
}

TEST_CASE("f32 greedy continuation matches transformers token for token") {
    for (const std::string& family : fixture_families) {
        CAPTURE(family);
        const reference r = load_reference(family);
        test::temp_dir dir;
        auto rt = convert_and_load(family, format::dtype::f32, dir);
        CHECK(run_greedy(*rt, r.prompt, static_cast<int>(r.greedy.size())) == r.greedy);
    }
}

TEST_CASE("mixtral routing matches transformers in layer 0") {
    std::ifstream in(test::fixture("mixtral/routing.json"));
    REQUIRE(in.good());
    const auto j = nlohmann::json::parse(in);
    const reference r = load_reference("mixtral");
    test::temp_dir dir;
    auto rt = convert_and_load("mixtral", format::dtype::f32, dir);
    struct seen_route {
        std::vector<std::vector<int32_t>> ids;
        std::vector<std::vector<float>> weights;
    } seen;
    session s(*rt->mdl, *rt->be, 64, 8);
    s.set_route_observer({[](void* user, int, int layer, const int32_t* e, const float* w, int k) {
                              if (layer != 0) return;
                              auto* sr = static_cast<seen_route*>(user);
                              sr->ids.emplace_back(e, e + k);
                              sr->weights.emplace_back(w, w + k);
                          },
                          &seen});
    for (size_t i = 0; i < r.prompt.size(); i += 8) {
        s.eval(r.prompt.data() + i, static_cast<int>(std::min<size_t>(8, r.prompt.size() - i)));
    }
    REQUIRE(j["layer"].get<int>() == 0);
    const auto& positions = j["positions"];
    REQUIRE(seen.ids.size() == r.prompt.size());
    REQUIRE(positions.size() == r.prompt.size());
    for (size_t t = 0; t < r.prompt.size(); ++t) {
        CAPTURE(t);
        CHECK(seen.ids[t] == positions[t]["experts"].get<std::vector<int32_t>>());
        const auto w = positions[t]["weights"].get<std::vector<double>>();
        for (size_t k = 0; k < w.size(); ++k) CHECK(seen.weights[t][k] == doctest::Approx(w[k]).epsilon(1e-5));
    }
}

TEST_CASE("quantised types stay within their error budgets") {
    for (const std::string& family : test::family_names()) { // the weight types, not the RoPE settings
        const reference r = load_reference(family);
        test::temp_dir dir;
        for (const budget& b : budgets) {
            CAPTURE(family);
            CAPTURE(format::dtype_name(b.type));
            CAPTURE(b.f32_activations);
            auto rt = convert_and_load(family, b.type, dir, b.f32_activations);
            if (format::is_quantized(b.type)) {
                // the matrices are stored interleaved, the token table as rows unless it is the
                // LM head too
                const format::dtype x8 = b.type == format::dtype::q4_0 ? format::dtype::q4_0x8 : format::dtype::q8_0x8;
                const tensor_view* q = rt->mdl->file().find("blk.0.attn_q.weight");
                if (q == nullptr) q = rt->mdl->file().find("blk.0.attn_q_nope.weight"); // latent attention
                REQUIRE(q != nullptr);
                CHECK(q->type == x8);
                const bool tied = rt->mdl->hp().flags & format::flag_tie_embeddings;
                CHECK(rt->mdl->file().find("token_embd.weight")->type == (tied ? x8 : b.type));
            }
            const error_stats st = compare(r, run_logits(*rt, r.prompt, 32));
            MESSAGE(family << " " << format::dtype_name(b.type) << std::string(b.f32_activations ? " f32" : " int8")
                           << " activations: top-1 agreement " << st.top1 << ", mean KL " << st.mean_kl
                           << ", max relative logit error " << st.max_rel);
            CHECK(st.top1 >= b.min_top1);
            CHECK(st.mean_kl <= b.max_kl);
        }
    }
}

TEST_CASE("the converter reads the config spellings of newer transformers releases") {
    // transformers 5 writes rope_parameters instead of rope_theta and num_local_experts
    // instead of num_experts; the same weights must give the same logits
    test::temp_dir dir;
    const std::string ckpt = edited_fixture(dir, "qwen3_moe", "qwen3_moe_v5", [](nlohmann::json& cfg) {
        REQUIRE(cfg.contains("num_experts"));
        REQUIRE(cfg.contains("rope_theta"));
        cfg["num_local_experts"] = cfg["num_experts"];
        cfg.erase("num_experts");
        cfg["rope_parameters"] = {{"rope_theta", cfg["rope_theta"]}, {"rope_type", "default"}};
        cfg.erase("rope_theta");
        cfg.erase("rope_scaling");
    });
    auto rt = converted(ckpt, dir.file("v5.colibri"));
    CHECK(rt->mdl->hp().rope_theta == 1e6f);
    const reference r = load_reference("qwen3_moe");
    CHECK(compare(r, run_logits(*rt, r.prompt, 32)).max_rel < 1e-5);
}

TEST_CASE("a Gemma 2 config without layer_types alternates local and global layers, as its model does") {
    test::temp_dir dir;
    const std::string ckpt = edited_fixture(dir, "gemma2", "gemma2_old", [](nlohmann::json& cfg) {
        REQUIRE(cfg.contains("layer_types"));
        cfg.erase("layer_types"); // as configs written before transformers listed them
        cfg.erase("sliding_window_pattern");
    });
    auto rt = converted(ckpt, dir.file("gemma2_old.colibri"));
    CHECK(rt->mdl->hp().swa_pattern == 2);
    const reference r = load_reference("gemma2");
    CHECK(compare(r, run_logits(*rt, r.prompt, 32)).max_rel < 1e-5);
}

TEST_CASE("linear RoPE scaling divides every frequency by its factor; unknown scalings are refused by name") {
    test::temp_dir dir;
    auto with_scaling = [&](const nlohmann::json& scaling, const std::string& name) {
        return edited_fixture(dir, "llama", name, [&](nlohmann::json& cfg) { cfg["rope_scaling"] = scaling; });
    };
    const std::string path = dir.file("linear.colibri");
    convert_checkpoint(with_scaling({{"rope_type", "linear"}, {"factor", 2.0}}, "linear"), path, format::dtype::f32,
                       {});
    auto rt = load_runtime(path, "cpu", 1);
    REQUIRE(rt->mdl->rope_freqs() != nullptr);
    const auto* f = reinterpret_cast<const float*>(rt->mdl->rope_freqs()->data);
    for (uint64_t i = 0; i < rt->mdl->hp().head_dim / 2; ++i) CHECK(f[i] == 2.0f);
    CHECK(rt->mdl->hp().rope_attn_factor == 1.0f);
    const reference r = load_reference("llama");
    CHECK(compare(r, run_logits(*rt, r.prompt, 8)).max_rel > 1e-2); // the positions now turn half as fast

    check_refused(with_scaling({{"rope_type", "dynamic"}, {"factor", 2.0}}, "dynamic"), dir.file("d.colibri"),
                  "rope_scaling of type 'dynamic' is not supported");
}

TEST_CASE("a Gemma 3 config as transformers 5 writes it, RoPE per layer type, gives the same logits") {
    test::temp_dir dir;
    const std::string ckpt = edited_fixture(dir, "gemma3", "gemma3_v5", [](nlohmann::json& cfg) {
        REQUIRE(cfg["rope_theta"] != cfg["rope_local_base_freq"]); // or the test would not tell them apart
        REQUIRE(cfg["rope_scaling"].is_object());
        nlohmann::json global = cfg["rope_scaling"];
        global["rope_theta"] = cfg["rope_theta"];
        cfg["rope_parameters"] = {
            {"full_attention", global},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", cfg["rope_local_base_freq"]}}}};
        cfg.erase("rope_theta");
        cfg.erase("rope_local_base_freq");
        cfg.erase("rope_scaling");
    });
    auto rt = converted(ckpt, dir.file("gemma3_v5.colibri"));
    CHECK(rt->mdl->hp().rope_theta == 1e6f);
    CHECK(rt->mdl->hp().rope_theta_swa == 1e4f);
    const reference r = load_reference("gemma3");
    CHECK(compare(r, run_logits(*rt, r.prompt, 32)).max_rel < 1e-5);
}

TEST_CASE("sliding windows and routing the converter cannot express are refused; the ones it can are kept") {
    test::temp_dir dir;
    // Mistral's window on every layer: kept (the fixture has none, so the logits move)
    const std::string windowed =
        edited_fixture(dir, "mixtral", "mixtral_window", [](nlohmann::json& cfg) { cfg["sliding_window"] = 4; });
    auto rt = converted(windowed, dir.file("w.colibri"));
    CHECK(rt->mdl->hp().sliding_window == 4);
    CHECK(rt->mdl->hp().swa_pattern == 0);
    const reference r = load_reference("mixtral");
    REQUIRE(r.prompt.size() > 4);
    CHECK(compare(r, run_logits(*rt, r.prompt, 32)).max_rel > 1e-2);
    // Qwen2's use_sliding_window windows no layer when max_window_layers covers them all
    const std::string all_full = edited_fixture(dir, "qwen2", "qwen2_full", [](nlohmann::json& cfg) {
        cfg["use_sliding_window"] = true;
        cfg["sliding_window"] = 4;
        cfg["max_window_layers"] = cfg["num_hidden_layers"];
    });
    auto q = converted(all_full, dir.file("q.colibri"));
    CHECK(q->mdl->hp().sliding_window == 0);
    const reference rq = load_reference("qwen2");
    CHECK(compare(rq, run_logits(*q, rq.prompt, 32)).max_rel < 1e-5);
    check_refused(edited_fixture(dir, "qwen2", "qwen2_window",
                                 [](nlohmann::json& cfg) {
                                     cfg["use_sliding_window"] = true;
                                     cfg["sliding_window"] = 4;
                                     cfg["max_window_layers"] = 1;
                                 }),
                  dir.file("q2.colibri"), "sliding-window attention is not supported");
    check_refused(edited_fixture(dir, "gemma3", "gemma3_bidirectional",
                                 [](nlohmann::json& cfg) { cfg["use_bidirectional_attention"] = true; }),
                  dir.file("g.colibri"), "use_bidirectional_attention");
    check_refused(
        edited_fixture(dir, "deepseek2", "deepseek2_norm", [](nlohmann::json& cfg) { cfg["norm_topk_prob"] = true; }),
        dir.file("d.colibri"), "norm_topk_prob true");
}

TEST_CASE("the shipped default model loads and fills in the middle with its StarCoder tokens") {
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 2);
    CHECK(detect_fim(*rt->tok).kind == fim_kind::starcoder);
    CHECK_FALSE(rt->tok->add_bos());
    CHECK(rt->tok->fim_suffix_first()); // trained with suffix-first prompts
    session s(*rt->mdl, *rt->be, 512, 32);
    sampler smp(static_cast<int>(rt->mdl->hp().n_vocab));
    generate_request req;
    req.prompt = "def add(a, b):\n";
    req.suffix = "\n\nprint(add(1, 2))\n";
    req.max_tokens = 24;
    req.sampling.temperature = 0.0f;
    auto run = [&](std::string& text) {
        return generate(s, *rt->tok, smp, req, [&](std::string_view p) {
            text.append(p);
            return true;
        });
    };
    std::string first, second, third, fourth;
    const generate_result r = run(first);
    CHECK(r.fim == fim_kind::starcoder);
    CHECK(r.n_generated_tokens > 0);
    CHECK_FALSE(first.empty());
    CHECK(first.find("<fim_") == std::string::npos); // special tokens end generation, never print
    // greedy is deterministic, and the second run reuses the whole prompt from the cache
    const generate_result r2 = run(second);
    CHECK(second == first);
    CHECK(r2.n_cached_tokens == r2.n_prompt_tokens - 1);
    // the order the file records is suffix first: asking for it explicitly changes nothing,
    // prefix first shares only the leading <fim_prefix> with the cached prompt
    req.order = fim_order::spm;
    const generate_result r3 = run(third);
    CHECK(third == first);
    CHECK(r3.n_cached_tokens == r3.n_prompt_tokens - 1);
    req.order = fim_order::psm;
    const generate_result r4 = run(fourth);
    CHECK(r4.n_cached_tokens == 1);
}

TEST_CASE("perplexity scores every token once and matches the reference log-likelihood") {
    const reference r = load_reference("llama");
    test::temp_dir dir;
    auto rt = convert_and_load("llama", format::dtype::f32, dir);
    // the reference's mean negative log-likelihood of tokens 1..n-1, in double precision
    const size_t n = r.prompt.size(), V = size_t(r.n_vocab);
    double nll = 0;
    for (size_t t = 0; t + 1 < n; ++t) {
        const float* l = &r.logits[t * V];
        const double mx = *std::max_element(l, l + V);
        double sum = 0;
        for (size_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
        nll += std::log(sum) + mx - l[r.prompt[t + 1]];
    }
    nll /= double(n - 1);
    const perplexity_result one = perplexity(*rt->mdl, *rt->be, r.prompt, 32);
    CHECK(one.n_windows == 1);
    CHECK(one.n_scored == int64_t(n - 1));
    CHECK(one.mean_nll == doctest::Approx(nll).epsilon(1e-5));
    // short windows: every token still scored exactly once, with less context
    const perplexity_result many = perplexity(*rt->mdl, *rt->be, r.prompt, 8);
    CHECK(many.n_windows == 5);
    CHECK(many.n_scored == int64_t(n - 1));
    CHECK(many.perplexity > 1.0);
    CHECK(many.mean_nll != doctest::Approx(nll).epsilon(1e-5)); // less context, another score
}
