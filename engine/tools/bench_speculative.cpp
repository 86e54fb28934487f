#include "tools/bench_speculative.h"

#include "api/runtime.h"
#include "core/error.h"
#include "generate/generate.h"
#include "model/session.h"
#include "sampling/sampler.h"
#include "tools/bench_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace colibri {

namespace {

struct run {
    std::string text;
    generate_result r;
    double tok_s() const {
        return r.n_generated_tokens > 1 ? (r.n_generated_tokens - 1) * 1000.0 / r.generate_ms : 0.0;
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

} // namespace

int run_speculative(const std::string& model_path, const std::string& prompt_file, int threads, int gen_tokens,
                    int reps, float temperature, bool json, const std::string& json_file) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) throw error(errc::io, prompt_file + ": cannot open");
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string prompt = buf.str();
    auto rt = load_runtime(model_path, "cpu", threads);
    const int n_ctx = static_cast<int>(std::min<uint32_t>(rt->mdl->hp().n_ctx, 8192));
    draft_policy drafts; // across the repetitions, as a daemon's session keeps it across requests
    auto once = [&](bool speculative, uint64_t seed) {
        session s(*rt->mdl, *rt->be, n_ctx); // a fresh cache: the whole prompt each time
        sampler smp(static_cast<int>(rt->mdl->hp().n_vocab));
        generate_request req;
        req.prompt = prompt;
        req.max_tokens = gen_tokens;
        req.sampling.temperature = temperature;
        req.sampling.seed = seed;
        req.speculative = speculative;
        req.drafts = &drafts;
        run out;
        out.r = generate(s, *rt->tok, smp, req, [&](std::string_view p) {
            out.text.append(p);
            return true;
        });
        return out;
    };
    std::vector<double> plain_tok_s, spec_tok_s;
    run plain, spec;
    bool same = true;
    int drafted = 0, accepted = 0, generated = 0;
    for (int rep = 0; rep < reps; ++rep) { // alternating: the host's state moves
        plain = once(false, uint64_t(rep) + 1);
        spec = once(true, uint64_t(rep) + 1);
        plain_tok_s.push_back(plain.tok_s());
        spec_tok_s.push_back(spec.tok_s());
        same = same && plain.text == spec.text;
        drafted += spec.r.n_drafted_tokens;
        accepted += spec.r.n_accepted_tokens;
        generated += spec.r.n_generated_tokens;
    }
    // What verification costs: a pass over n tokens with every row's logits, after the
    // prompt and the completion, against a one-token step (medians, rolled back each time;
    // none for a text shorter than the longest pass)
    std::vector<double> pass_ms;
    std::vector<int32_t> text;
    rt->tok->encode(prompt + spec.text, text);
    if (text.size() > size_t(n_ctx - session::max_draft - 1)) text.resize(size_t(n_ctx - session::max_draft - 1));
    if (text.size() >= size_t(session::max_draft + 1)) {
        session s(*rt->mdl, *rt->be, n_ctx);
        for (size_t i = 0; i < text.size(); i += size_t(s.n_batch()))
            s.eval(text.data() + i, static_cast<int>(std::min(text.size() - i, size_t(s.n_batch()))));
        const int at = s.n_past();
        constexpr int timings = 24;
        std::vector<std::vector<double>> ms(session::max_draft + 1);
        for (int rep = 0; rep < timings; ++rep) { // the sizes alternating: the host's state moves
            for (int n = 1; n <= session::max_draft + 1; ++n) {
                const auto t0 = std::chrono::steady_clock::now();
                s.eval(text.data() + text.size() - size_t(n), n, {}, n);
                ms[size_t(n - 1)].push_back(
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                s.truncate(at);
            }
        }
        for (const auto& m : ms) pass_ms.push_back(median(m));
    }
    const double p = median(plain_tok_s), sp = median(spec_tok_s);
    // each pass gives the tokens it kept and one sampled token
    const int passes = generated - accepted;
    const double per_pass = passes > 0 ? double(generated) / passes : 0.0;
    const double kept = double(accepted) / reps, tried = double(drafted) / reps; // a repetition's
    const nlohmann::json j = {{"model", model_path},
                              {"prompt_file", prompt_file},
                              {"threads", threads},
                              {"prompt_tokens", spec.r.n_prompt_tokens},
                              {"generated_tokens", spec.r.n_generated_tokens},
                              {"temperature", temperature},
                              {"plain_tok_s", p},
                              {"speculative_tok_s", sp},
                              {"speedup", p > 0 ? sp / p : 0.0},
                              {"drafted_tokens", tried},
                              {"accepted_tokens", kept},
                              {"tokens_per_pass", per_pass},
                              {"same_text", same},
                              {"pass_ms", pass_ms}};
    emit_json(j.dump(), json_file, json);
    if (!json) {
        std::printf("speculative decoding, %s: prompt %d tokens, %d generated (%s), %d threads, %d repetitions\n",
                    prompt_file.c_str(), spec.r.n_prompt_tokens, spec.r.n_generated_tokens,
                    temperature > 0 ? ("temperature " + std::to_string(temperature) + ", seeds 1...").c_str()
                                    : "greedy",
                    threads, reps);
        std::printf("  plain        %8.1f tok/s\n", p);
        std::printf(
            "  speculative  %8.1f tok/s   %.2fx, %.4g of %.4g drafted tokens kept (%.0f%%), %.2f tokens a pass\n", sp,
            p > 0 ? sp / p : 0.0, kept, tried, drafted > 0 ? 100.0 * accepted / drafted : 0.0, per_pass);
        std::printf("  text         %s\n", same ? "identical" : "DIFFERS");
        if (pass_ms.empty()) {
            std::printf("  (the text is too short to time passes of up to %d tokens)\n", session::max_draft + 1);
            return same ? 0 : 1;
        }
        std::printf("  a pass of n tokens, against one:");
        for (size_t n = 1; n < pass_ms.size(); ++n) std::printf(" %zu: %.2fx", n + 1, pass_ms[n] / pass_ms[0]);
        std::printf(" (one: %.2f ms)\n", pass_ms[0]);
    }
    return same ? 0 : 1;
}

} // namespace colibri
