#pragma once
// Reference fixtures and the comparisons the conformance tests make against them.

#include "api/runtime.h"
#include "model/session.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <fstream>
#include <nlohmann/json.hpp>

namespace colibri::test {

struct reference {
    std::string family;       // the fixture's name
    std::string architecture; // its Hugging Face class
    std::vector<int32_t> prompt, greedy;
    int n_vocab = 0;
    std::vector<float> logits; // [n_prompt][n_vocab]
};

inline reference load_reference(const std::string& family) {
    std::ifstream in(fixture(family + "/expected.json"));
    REQUIRE_MESSAGE(in.good(), "missing fixture " << family);
    const auto j = nlohmann::json::parse(in);
    reference r;
    r.family = family;
    r.architecture = j["architecture"].get<std::string>();
    r.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
    r.greedy = j["greedy_ids"].get<std::vector<int32_t>>();
    r.n_vocab = j["n_vocab"].get<int>();
    r.logits = read_array<float>(fixture(family + "/" + j["logits_file"].get<std::string>()));
    REQUIRE(r.logits.size() == r.prompt.size() * size_t(r.n_vocab));
    return r;
}

// Logits at every prompt position, evaluated in batches of `batch` tokens.
inline std::vector<float> run_logits(runtime& rt, const std::vector<int32_t>& ids, int batch) {
    const int n_vocab = static_cast<int>(rt.mdl->hp().n_vocab);
    session s(*rt.mdl, *rt.be, static_cast<int>(ids.size()) + 1, batch, true);
    std::vector<float> out;
    for (size_t i = 0; i < ids.size(); i += size_t(batch)) {
        const int n = static_cast<int>(std::min(ids.size() - i, size_t(batch)));
        s.eval(ids.data() + i, n);
        out.insert(out.end(), s.logits(), s.logits() + size_t(n) * n_vocab);
    }
    return out;
}

inline std::vector<int32_t> run_greedy(runtime& rt, const std::vector<int32_t>& prompt, int n) {
    const int n_vocab = static_cast<int>(rt.mdl->hp().n_vocab);
    session s(*rt.mdl, *rt.be, static_cast<int>(prompt.size()) + n + 1, 16);
    for (size_t i = 0; i < prompt.size(); i += 16) {
        s.eval(prompt.data() + i, static_cast<int>(std::min<size_t>(16, prompt.size() - i)));
    }
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) {
        const float* l = s.logits();
        const int32_t id = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
        out.push_back(id);
        s.eval(&id, 1);
    }
    return out;
}

struct error_stats {
    double max_rel = 0; // max |ours - ref| / max |ref|, over all positions
    double top1 = 0;    // fraction of positions with the same arg-max
    double mean_kl = 0; // mean KL(ref || ours) over positions
    double tie_gap = 0; // where the arg-maxes differ, the most ref's top logit exceeds ref's logit
                        // of our arg-max, over max |ref| (0: no position differs)
};

inline error_stats compare(const reference& r, const std::vector<float>& ours) {
    error_stats st;
    const size_t n = r.prompt.size(), V = size_t(r.n_vocab);
    double max_ref = 0;
    size_t same = 0;
    for (float v : r.logits) max_ref = std::max(max_ref, std::fabs(double(v)));
    for (size_t t = 0; t < n; ++t) {
        const float* a = &r.logits[t * V];
        const float* b = &ours[t * V];
        double ma = -1e300, mb = -1e300, sa = 0, sb = 0;
        for (size_t i = 0; i < V; ++i) {
            st.max_rel = std::max(st.max_rel, std::fabs(double(a[i]) - b[i]) / max_ref);
            ma = std::max(ma, double(a[i]));
            mb = std::max(mb, double(b[i]));
        }
        for (size_t i = 0; i < V; ++i) {
            sa += std::exp(a[i] - ma);
            sb += std::exp(b[i] - mb);
        }
        double kl = 0;
        for (size_t i = 0; i < V; ++i) {
            const double lpa = a[i] - ma - std::log(sa), lpb = b[i] - mb - std::log(sb);
            kl += std::exp(lpa) * (lpa - lpb);
        }
        st.mean_kl += kl / double(n);
        const size_t ta = size_t(std::max_element(a, a + V) - a), tb = size_t(std::max_element(b, b + V) - b);
        same += ta == tb;
        st.tie_gap = std::max(st.tie_gap, (double(a[ta]) - a[tb]) / max_ref);
    }
    st.top1 = double(same) / double(n);
    return st;
}

} // namespace colibri::test
