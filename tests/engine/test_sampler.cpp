#include "core/error.h"
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

using namespace colibri;

namespace {
sampling_params params(float temp, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f, uint64_t seed = 7) {
    sampling_params p;
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    return p;
}
// The sampler's definition, written the plain way: every token sorted by logit (then id),
// softmax with temperature over the top-k (all: every token), top-p, min-p, a draw.
int32_t reference_sample(const std::vector<float>& logits, const sampling_params& p, xorshift64s& rng) {
    const int n_vocab = static_cast<int>(logits.size());
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    const int n = p.top_k > 0 ? std::min(p.top_k, n_vocab) : n_vocab;
    std::vector<float> prob(static_cast<size_t>(n));
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / p.temperature);
    for (float& q : prob) q /= sum;
    int kept = n;
    float cum = 0.0f;
    for (int i = 0; i < n && p.top_p < 1.0f; ++i) {
        if ((cum += prob[i]) >= p.top_p) {
            kept = i + 1;
            break;
        }
    }
    int keep = 1;
    while (p.min_p > 0.0f && keep < kept && prob[keep] >= p.min_p * prob[0]) ++keep;
    if (p.min_p > 0.0f) kept = keep;
    float total = 0.0f;
    for (int i = 0; i < kept; ++i) total += prob[i];
    float r = rng.uniform() * total;
    for (int i = 0; i < kept; ++i) {
        if ((r -= prob[i]) < 0.0f) return idx[i];
    }
    return idx[kept - 1];
}
} // namespace

TEST_CASE("xorshift64s is deterministic per seed and uniform below one") {
    xorshift64s a(42), b(42), c(43), z(0);
    bool differs = false;
    double sum = 0;
    for (int i = 0; i < 10000; ++i) {
        const uint64_t x = a.next();
        CHECK(x == b.next());
        differs |= x != c.next();
        const float u = z.uniform();
        CHECK(u >= 0.0f);
        CHECK(u < 1.0f);
        sum += u;
    }
    CHECK(differs);
    CHECK(sum / 10000 == doctest::Approx(0.5).epsilon(0.02));
}

TEST_CASE("greedy picks the first maximum") {
    sampler s(5);
    s.set_params(params(0.0f));
    const float logits[5] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f};
    CHECK(s.sample(logits, {}) == 1);
}

TEST_CASE("argmax finds the first maximum across chunks and passes over NaNs") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (int n : {1, 15, 16, 17, 1023, 1024, 1025, 5000}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) v[i] = std::sin(i * 0.37f);
        const int32_t plain = static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
        CHECK(argmax(v.data(), n) == plain);
        v[n - 1] = 3.0f; // the last position, in the last partial vector
        CHECK(argmax(v.data(), n) == n - 1);
        v[n / 2] = 3.0f; // an equal value earlier: the first wins
        CHECK(argmax(v.data(), n) == n / 2);
        v[0] = nan; // never the largest
        CHECK(argmax(v.data(), n) == (n == 1 ? 0 : n / 2));
    }
    std::vector<float> v(3000, -inf);
    CHECK(argmax(v.data(), 3000) == 0);
    v[2999] = -1e30f;
    CHECK(argmax(v.data(), 3000) == 2999);
    v[2500] = inf;
    CHECK(argmax(v.data(), 3000) == 2500);
    std::fill(v.begin(), v.end(), nan);
    CHECK(argmax(v.data(), 3000) == 0);
}

TEST_CASE("sampling gives the tokens of the sort-every-token definition") {
    // 5,000 logits with ties (rounded to quarters) and a few -inf; every path: top-k by a
    // heap (1, 40, 4,999), every token (top-k 0 or the whole vocabulary) cut by top-p,
    // min-p or both, and with the repetition penalty
    const int n_vocab = 5000;
    std::vector<float> logits(n_vocab);
    std::mt19937 gen(11);
    std::normal_distribution<float> normal(0.0f, 2.5f);
    for (float& l : logits) l = std::round(normal(gen) * 4.0f) / 4.0f;
    for (int i = 0; i < n_vocab; i += 997) logits[i] = -std::numeric_limits<float>::infinity();
    const std::vector<int32_t> recent = {3, 17, 17, 4242,
                                         int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    struct variant {
        float temp;
        int top_k;
        float top_p, min_p, penalty;
    };
    const variant variants[] = {
        {0.8f, 40, 0.95f, 0.05f, 1.0f},  {1.0f, 1, 1.0f, 0.0f, 1.0f},    {1.5f, 4999, 1.0f, 0.0f, 1.0f},
        {0.7f, 0, 0.9f, 0.0f, 1.0f},     {1.2f, 0, 1.0f, 0.02f, 1.0f},   {0.5f, 0, 0.5f, 0.1f, 1.0f},
        {1.0f, 5000, 0.95f, 0.0f, 1.0f}, {0.9f, 40, 0.95f, 0.05f, 1.3f}, {0.9f, 0, 0.8f, 0.0f, 1.3f}};
    for (const variant& v : variants) {
        CAPTURE(v.temp);
        CAPTURE(v.top_k);
        CAPTURE(v.top_p);
        CAPTURE(v.min_p);
        CAPTURE(v.penalty);
        sampling_params p = params(v.temp, v.top_k, v.top_p, v.min_p, 99);
        p.repeat_penalty = v.penalty;
        sampler s(n_vocab);
        s.set_params(p);
        std::vector<float> penalised = logits;
        for (int32_t id : {3, 17, 4242, recent.back()}) { // each once
            float& l = penalised[id];
            l = l > 0 ? l / v.penalty : l * v.penalty;
        }
        xorshift64s rng;
        rng.reseed(99);
        int same = 0, draws = 300;
        for (int i = 0; i < draws; ++i) same += s.sample(logits.data(), recent) == reference_sample(penalised, p, rng);
        CHECK(same == draws);
    }
}

TEST_CASE("the candidates' radix sort orders as std::sort does") {
    // keys as the sampler makes them: a logit's order in the high half (many equal, or
    // differing in their lowest byte only), the id below, ids increasing
    std::mt19937 gen(3);
    for (int n : {1, 2, 255, 256, 513, 20000}) {
        for (uint32_t spread : {1u, 255u, 70000u, 0xFFFFFFFFu}) {
            CAPTURE(n);
            CAPTURE(spread);
            const auto count = static_cast<size_t>(n);
            std::vector<uint64_t> keys(count), spare(count);
            std::uniform_int_distribution<uint32_t> high(0, spread);
            for (size_t i = 0; i < count; ++i) keys[i] = uint64_t(high(gen)) << 32 | uint32_t(i);
            std::vector<uint64_t> want = keys;
            std::sort(want.begin(), want.end());
            sort_by_high_half(keys.data(), spare.data(), n);
            CHECK(keys == want);
        }
    }
}

TEST_CASE("the same seed gives the same tokens and another seed others") {
    const int n = 50;
    std::vector<float> logits(n);
    for (int i = 0; i < n; ++i) logits[i] = std::sin(i * 1.7f);
    auto run = [&](uint64_t seed) {
        sampler s(n);
        s.set_params(params(1.0f, 0, 1.0f, 0.0f, seed));
        std::vector<int32_t> out;
        for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits.data(), {}));
        return out;
    };
    CHECK(run(1) == run(1));
    CHECK(run(1) != run(2));
}

TEST_CASE("sampling frequencies follow softmax(logits / T)") {
    const float logits[4] = {1.0f, 0.0f, -1.0f, 0.5f};
    const float T = 0.7f;
    sampler s(4);
    s.set_params(params(T, 0, 1.0f, 0.0f, 3));
    std::vector<int> count(4);
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) ++count[s.sample(logits, {})];
    double z = 0;
    for (float l : logits) z += std::exp(l / T);
    for (int i = 0; i < 4; ++i)
        CHECK(count[i] / double(draws) == doctest::Approx(std::exp(logits[i] / T) / z).epsilon(0.05));
}

TEST_CASE("top-k and top-p and min-p keep only the allowed tokens") {
    const float logits[6] = {3.0f, 2.9f, 2.8f, 0.0f, -5.0f, 1.0f};
    std::map<int, int> seen;
    auto collect = [&](sampling_params p) {
        seen.clear();
        sampler s(6);
        s.set_params(p);
        for (int i = 0; i < 3000; ++i) ++seen[s.sample(logits, {})];
    };
    collect(params(1.0f, 2));
    CHECK(seen.size() == 2);
    CHECK(seen.count(0) == 1);
    CHECK(seen.count(1) == 1);
    collect(params(1.0f, 1));
    CHECK(seen.size() == 1);
    CHECK(seen.count(0) == 1);
    collect(params(1.0f, 0, 0.01f)); // the first token alone carries more than 1%
    CHECK(seen.size() == 1);
    collect(params(1.0f, 0, 1.0f, 0.5f)); // p(3.0)=max; tokens within half of it: 2.9, 2.8
    CHECK(seen.size() == 3);
    CHECK(seen.count(3) == 0);
}

TEST_CASE("top-k breaks ties at its edge by the lower id") {
    const float logits[7] = {1.0f, 3.0f, 2.0f, 2.0f, 2.0f, 0.0f, 2.0f};
    sampler s(7);
    s.set_params(params(1.0f, 2));
    std::map<int, int> seen;
    for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits, {})];
    CHECK(seen.size() == 2);
    CHECK(seen.count(1) == 1);
    CHECK(seen.count(2) == 1);
}

TEST_CASE("repetition penalty demotes recent tokens") {
    sampler s(3);
    auto p = params(0.0f);
    p.repeat_penalty = 2.0f;
    s.set_params(p);
    const float logits[3] = {2.0f, 1.5f, -1.0f};
    const int32_t recent[] = {0};
    CHECK(s.sample(logits, {}) == 0);
    CHECK(s.sample(logits, recent) == 1); // 2.0 / 2 = 1.0 < 1.5
    const float close[3] = {2.0f, 1.5f, 0.9f};
    const int32_t twice[] = {0, 1, 0};
    CHECK(s.sample(close, twice) == 0);   // each once: 1.0 > 0.75, 0.9 (counted twice, 0.5 < 0.9)
    const int32_t outside[] = {-1, 3, 0}; // ids outside the vocabulary are passed over
    CHECK(s.sample(close, outside) == 1);
}

TEST_CASE("bad sampling parameters are refused") {
    sampler s(3);
    CHECK_THROWS_AS(s.set_params(params(-1.0f)), error);
    CHECK_THROWS_AS(s.set_params(params(NAN)), error);
    CHECK_THROWS_AS(s.set_params(params(1.0f, -1)), error);
    CHECK_THROWS_AS(s.set_params(params(1.0f, 0, 0.0f)), error);
    CHECK_THROWS_AS(s.set_params(params(1.0f, 0, 1.5f)), error);
    CHECK_THROWS_AS(s.set_params(params(1.0f, 0, 1.0f, 2.0f)), error);
}
