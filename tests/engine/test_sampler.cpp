#include "core/error.h"
#include "sampling/sampler.h"

#include <cmath>
#include <doctest/doctest.h>
#include <map>
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
    for (int i = 0; i < 4; ++i) CHECK(count[i] / double(draws) == doctest::Approx(std::exp(logits[i] / T) / z).epsilon(0.05));
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

TEST_CASE("repetition penalty demotes recent tokens") {
    sampler s(3);
    auto p = params(0.0f);
    p.repeat_penalty = 2.0f;
    s.set_params(p);
    const float logits[3] = {2.0f, 1.5f, -1.0f};
    const int32_t recent[] = {0};
    CHECK(s.sample(logits, {}) == 0);
    CHECK(s.sample(logits, recent) == 1); // 2.0 / 2 = 1.0 < 1.5
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
