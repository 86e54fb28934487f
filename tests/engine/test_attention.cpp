// Rope and attention: the kernels and the CPU backend against direct computations.

#include "kernel_test_util.h"

namespace {

// One attention call's random queries, keys and values (seeds seed, seed + 1, seed + 2),
// the keys and values also as f16.
struct attend_inputs {
    std::vector<float> q, k, v;
    std::vector<uint16_t> k16, v16;
    attend_inputs(int n_q, int n, int hd, int seed)
        : q(random_vec(size_t(n_q) * hd, seed)), k(random_vec(size_t(n) * hd, seed + 1)),
          v(random_vec(size_t(n) * hd, seed + 2)), k16(k.size()), v16(v.size()) {
        for (size_t i = 0; i < k.size(); ++i) {
            k16[i] = f32_to_f16(k[i]);
            v16[i] = f32_to_f16(v[i]);
        }
    }
};

// One token's call of kt's attend (f32 keys and values) or attend_f16.
void attend1(const kernel_table* kt, const float* q, int n_q, const float* k, const float* v, int n, int hd,
             float* scores, float* out, const float* next_k = nullptr, int next_n = 0) {
    kt->attend(q, 0, n_q, 1, k, v, &n, hd, 0.3f, scores, out, 0, next_k, next_n);
}
void attend1(const kernel_table* kt, const float* q, int n_q, const uint16_t* k, const uint16_t* v, int n, int hd,
             float* scores, float* out, const uint16_t* next_k = nullptr, int next_n = 0) {
    kt->attend_f16(q, 0, n_q, 1, k, v, &n, hd, 0.3f, scores, out, 0, next_k, next_n);
}

} // namespace

TEST_CASE("rope rotates pairs i and i+d/2 by the position angle") {
    const int d = 16;
    auto x = random_vec(d, 5);
    auto y = x;
    kernels::rope_head(y.data(), d, 7, 10000.0f);
    for (int i = 0; i < d / 2; ++i) {
        const double a = 7.0 * std::pow(10000.0, -2.0 * i / d);
        CHECK(y[i] == doctest::Approx(x[i] * std::cos(a) - x[i + d / 2] * std::sin(a)).epsilon(1e-5));
        CHECK(y[i + d / 2] == doctest::Approx(x[i + d / 2] * std::cos(a) + x[i] * std::sin(a)).epsilon(1e-5));
    }
    // position 0 is the identity
    auto z = x;
    kernels::rope_head(z.data(), d, 0, 10000.0f);
    for (int i = 0; i < d; ++i) CHECK(z[i] == x[i]);
    // scaled RoPE: pair i's frequency divided by its factor, cos and sin times attn_factor
    const std::vector<float> factors = {1, 2, 4, 8, 1, 1, 3, 0.5};
    auto w = x;
    kernels::rope_head(w.data(), d, 7, 10000.0f, factors.data(), 1.5f);
    for (int i = 0; i < d / 2; ++i) {
        const double a = 7.0 * std::pow(10000.0, -2.0 * i / d) / factors[i];
        CHECK(w[i] == doctest::Approx(1.5 * (x[i] * std::cos(a) - x[i + d / 2] * std::sin(a))).epsilon(1e-5));
        CHECK(w[i + d / 2] == doctest::Approx(1.5 * (x[i + d / 2] * std::cos(a) + x[i] * std::sin(a))).epsilon(1e-5));
    }
}

TEST_CASE("attention kernels give the same bits whatever the next keys they are told of") {
    // the next call's keys are only asked for from memory: never read into a result
    const auto next_f32 = random_vec(400 * 136, 41);
    std::vector<uint16_t> next_f16(next_f32.size());
    for (size_t i = 0; i < next_f32.size(); ++i) next_f16[i] = f32_to_f16(next_f32[i]);
    for (const kernel_table* kt : all_tables())
        for (int hd : {8, 12, 64, 128, 136})
            for (int n_q : {1, 2, 3, 4})
                for (int n : {1, 6, 37, 70, 300}) {
                    const std::string table = kt->name;
                    CAPTURE(table);
                    CAPTURE(hd);
                    CAPTURE(n_q);
                    CAPTURE(n);
                    const attend_inputs in(n_q, n, hd, 42);
                    const auto& [q, k, v, k16, v16] = in;
                    std::vector<float> scores(size_t(n_q) * n), want(size_t(n_q) * hd), got(want.size());
                    attend1(kt, q.data(), n_q, k.data(), v.data(), n, hd, scores.data(), want.data());
                    for (int next_n : {1, 5, 64, 400}) {
                        attend1(kt, q.data(), n_q, k.data(), v.data(), n, hd, scores.data(), got.data(),
                                next_f32.data(), next_n);
                        CHECK(got == want);
                    }
                    attend1(kt, q.data(), n_q, k16.data(), v16.data(), n, hd, scores.data(), want.data());
                    for (int next_n : {1, 5, 64, 400}) {
                        attend1(kt, q.data(), n_q, k16.data(), v16.data(), n, hd, scores.data(), got.data(),
                                next_f16.data(), next_n);
                        CHECK(got == want);
                    }
                }
}

TEST_CASE("attention kernels give each query head the bits it gets alone, whatever heads share its call") {
    // the backend splits a KV head's query heads into calls by its own rule: decode and a
    // batch's tokens must not depend on it
    for (const kernel_table* kt : all_tables())
        for (int hd : {8, 64, 128, 136})
            for (int n_q : {2, 3, 4})
                for (int n : {1, 6, 37, 300}) {
                    const std::string table = kt->name;
                    CAPTURE(table);
                    CAPTURE(hd);
                    CAPTURE(n_q);
                    CAPTURE(n);
                    const attend_inputs in(n_q, n, hd, 45);
                    const auto& [q, k, v, k16, v16] = in;
                    std::vector<float> scores(size_t(n_q) * n), all(size_t(n_q) * hd), alone(all.size());
                    for (bool f16 : {false, true}) {
                        CAPTURE(f16);
                        if (f16) attend1(kt, q.data(), n_q, k16.data(), v16.data(), n, hd, scores.data(), all.data());
                        else attend1(kt, q.data(), n_q, k.data(), v.data(), n, hd, scores.data(), all.data());
                        for (int h = 0; h < n_q; ++h) {
                            const size_t at = size_t(h) * size_t(hd);
                            if (f16)
                                attend1(kt, q.data() + at, 1, k16.data(), v16.data(), n, hd, scores.data(),
                                        alone.data() + at);
                            else
                                attend1(kt, q.data() + at, 1, k.data(), v.data(), n, hd, scores.data(),
                                        alone.data() + at);
                        }
                        CHECK(all == alone);
                    }
                }
}

TEST_CASE("attention kernels give each token the bits it gets alone, whatever tokens share its call") {
    // a verifying step's or a prefill batch's tokens, a position apart or more, across the
    // kernels' splits of the keys into streams (multiples of 16), in one pass or several
    const std::vector<std::vector<int>> key_counts = {{1, 2},
                                                      {5, 6, 7, 8},
                                                      {14, 15, 16, 17},
                                                      {62, 63, 64, 65},
                                                      {63, 64},
                                                      {127, 128, 129},
                                                      {300, 301, 302, 303, 304, 305},
                                                      {1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012},
                                                      {40, 70, 70}};
    for (const kernel_table* kt : all_tables())
        for (int hd : {8, 64, 128, 136})
            for (int n_q : {1, 2, 3, 4})
                for (const auto& n : key_counts) {
                    const std::string table = kt->name;
                    CAPTURE(table);
                    CAPTURE(hd);
                    CAPTURE(n_q);
                    CAPTURE(n.front());
                    const int n_tok = static_cast<int>(n.size()), n_last = n.back();
                    const attend_inputs in(n_q * n_tok, n_last, hd, 46);
                    const auto& [q, k, v, k16, v16] = in;
                    const int64_t stride = int64_t(n_q) * hd;
                    std::vector<float> scores(size_t(n_q * n_tok) * n_last), all(q.size()), alone(q.size());
                    for (bool f16 : {false, true}) {
                        CAPTURE(f16);
                        if (f16)
                            kt->attend_f16(q.data(), stride, n_q, n_tok, k16.data(), v16.data(), n.data(), hd, 0.3f,
                                           scores.data(), all.data(), stride, nullptr, 0);
                        else
                            kt->attend(q.data(), stride, n_q, n_tok, k.data(), v.data(), n.data(), hd, 0.3f,
                                       scores.data(), all.data(), stride, nullptr, 0);
                        for (int t = 0; t < n_tok; ++t) {
                            const size_t at = size_t(t * stride);
                            if (f16)
                                attend1(kt, q.data() + at, n_q, k16.data(), v16.data(), n[size_t(t)], hd, scores.data(),
                                        alone.data() + at);
                            else
                                attend1(kt, q.data() + at, n_q, k.data(), v.data(), n[size_t(t)], hd, scores.data(),
                                        alone.data() + at);
                        }
                        CHECK(all == alone);
                    }
                }
}

TEST_CASE("attention kernels match a direct computation") {
    // a query's scores by each table's order of sums: the same softmax and values, to f32 rounding
    for (const kernel_table* kt : all_tables())
        for (int hd : {8, 64, 128, 136})
            for (int n : {1, 15, 16, 17, 70, 300}) {
                const std::string table = kt->name;
                CAPTURE(table);
                CAPTURE(hd);
                CAPTURE(n);
                const int n_q = 3;
                const attend_inputs in(n_q, n, hd, 47);
                std::vector<float> scores(size_t(n_q) * n), out(size_t(n_q) * hd);
                for (bool f16 : {false, true}) {
                    CAPTURE(f16);
                    if (f16)
                        attend1(kt, in.q.data(), n_q, in.k16.data(), in.v16.data(), n, hd, scores.data(), out.data());
                    else attend1(kt, in.q.data(), n_q, in.k.data(), in.v.data(), n, hd, scores.data(), out.data());
                    const auto key = [&](int j, int d) {
                        const size_t i = size_t(j) * hd + size_t(d);
                        return f16 ? double(f16_to_f32(in.k16[i])) : double(in.k[i]);
                    };
                    const auto value = [&](int j, int d) {
                        const size_t i = size_t(j) * hd + size_t(d);
                        return f16 ? double(f16_to_f32(in.v16[i])) : double(in.v[i]);
                    };
                    for (int g = 0; g < n_q; ++g) {
                        std::vector<double> s(static_cast<size_t>(n));
                        double mx = -1e300, sum = 0;
                        for (int j = 0; j < n; ++j) {
                            double d = 0;
                            for (int i = 0; i < hd; ++i) d += double(in.q[size_t(g * hd + i)]) * key(j, i);
                            s[size_t(j)] = 0.3 * d;
                            mx = std::max(mx, s[size_t(j)]);
                        }
                        for (double& x : s) sum += (x = std::exp(x - mx));
                        for (int i = 0; i < hd; ++i) {
                            double ref = 0;
                            for (int j = 0; j < n; ++j) ref += s[size_t(j)] / sum * value(j, i);
                            CHECK(out[size_t(g * hd + i)] == doctest::Approx(ref).epsilon(1e-5));
                        }
                    }
                }
            }
}

TEST_CASE("backend attention stores the batch and matches a direct computation with grouped heads") {
    struct variant {
        int window;
        float softcap;
    };
    for (const kernel_table* kt : all_tables())
        for (bool f16 : {false, true})
            for (int hd : {8, 12, 64, 128, 136})
                for (auto [n_head, n_head_kv] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{3, 1}})
                    for (float scale : {0.35f, 40.0f}) // 40: score differences past e^-87, where weights vanish
                        for (const variant var : {variant{0, 0.0f}, variant{21, 0.0f}, variant{0, 2.5f}}) {
                            const std::string table = kt->name;
                            CAPTURE(table);
                            CAPTURE(f16);
                            CAPTURE(hd);
                            CAPTURE(n_head_kv);
                            CAPTURE(scale);
                            CAPTURE(var.window);
                            CAPTURE(var.softcap);
                            // a batch of every position of the context: token t attends to 0..t
                            const int n_ctx = 70, n = n_ctx;
                            cpu_options o;
                            o.n_threads = 2;
                            o.kernels = kt;
                            auto be = make_cpu_backend(o, 256);
                            auto kn = random_vec(n * n_head_kv * hd, 31), vn = random_vec(n * n_head_kv * hd, 32);
                            auto q = random_vec(n * n_head * hd, 33);
                            std::vector<float> out(n * n_head * hd),
                                scratch(2 * attention_scratch_rows(n_head / n_head_kv) * n_ctx);
                            std::vector<float> kc(n_head_kv * n_ctx * hd), vc(n_head_kv * n_ctx * hd); // f16 uses half
                            std::vector<int32_t> pos(n);
                            for (int t = 0; t < n; ++t) pos[t] = t;
                            attention_args a{q.data(),   kn.data(),  vn.data(),      kc.data(), vc.data(), f16,
                                             pos.data(), out.data(), scratch.data(), n,         n_ctx,     n_head,
                                             n_head_kv,  hd,         scale};
                            a.window = var.window;
                            a.softcap = var.softcap;
                            be->attention(a);
                            // tokens again on their own (decode), their cache rows wiped first: each
                            // stores them again, and gets the same bits
                            const std::vector<float> kc_batch = kc, vc_batch = vc;
                            const size_t row_floats = f16 ? size_t(hd) / 2 : size_t(hd);
                            for (int t : {0, 3, 30, 31, 32, 35, 68, n - 1}) {
                                CAPTURE(t);
                                for (int h = 0; h < n_head_kv; ++h) {
                                    const size_t at = (size_t(h) * n_ctx + size_t(t)) * row_floats;
                                    std::fill_n(kc.begin() + at, row_floats, 0.0f);
                                    std::fill_n(vc.begin() + at, row_floats, 0.0f);
                                }
                                std::vector<float> out1(n_head * hd);
                                attention_args a1 = a;
                                a1.q += t * n_head * hd;
                                a1.k_new += t * n_head_kv * hd;
                                a1.v_new += t * n_head_kv * hd;
                                a1.pos = pos.data() + t;
                                a1.out = out1.data();
                                a1.n = 1;
                                be->attention(a1);
                                REQUIRE(std::memcmp(kc.data(), kc_batch.data(), kc.size() * sizeof(float)) == 0);
                                REQUIRE(std::memcmp(vc.data(), vc_batch.data(), vc.size() * sizeof(float)) == 0);
                                for (int i = 0; i < n_head * hd; ++i) REQUIRE(out1[i] == out[t * n_head * hd + i]);
                            }
                            const auto stored = [&](const std::vector<float>& x, size_t i) {
                                return f16 ? f16_to_f32(f32_to_f16(x[i])) : x[i];
                            };
                            for (int t : {0, 4, 31, 32, 40, 69}) { // across the kernels' chunks of keys
                                const int j0 = var.window > 0 ? std::max(0, t - var.window + 1) : 0;
                                for (int h = 0; h < n_head; ++h) {
                                    const int kvh = h / (n_head / n_head_kv);
                                    std::vector<double> s(t + 1);
                                    double mx = -1e300, sum = 0;
                                    for (int j = j0; j <= t; ++j) {
                                        double d = 0;
                                        for (int i = 0; i < hd; ++i)
                                            d += double(q[(t * n_head + h) * hd + i]) *
                                                 stored(kn, size_t((j * n_head_kv + kvh) * hd + i));
                                        s[j] = d * double(scale);
                                        if (var.softcap > 0) s[j] = var.softcap * std::tanh(s[j] / var.softcap);
                                        mx = std::max(mx, s[j]);
                                    }
                                    for (int j = j0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
                                    for (int i = 0; i < hd; ++i) {
                                        double ref = 0;
                                        for (int j = j0; j <= t; ++j)
                                            ref += s[j] / sum * stored(vn, size_t((j * n_head_kv + kvh) * hd + i));
                                        // f32 rounding only: an exponential off by 1e-5 fails at the small
                                        // scale; at 40 the scores' own rounding is amplified forty times
                                        CHECK(out[(t * n_head + h) * hd + i] ==
                                              doctest::Approx(ref).epsilon(scale < 1 ? 1e-6 : 1e-4));
                                    }
                                }
                            }
                        }
}
