// The CPU backend's expert feed-forwards, their weighted sum, and routing.

#include "kernel_test_util.h"

TEST_CASE("ffn_many gives the bits of its products and swiglu run one job at a time") {
    // decode's experts shared out whole across the threads (eight of one size; two and a
    // larger shared expert) or not (three on two threads), and a prefill's experts taking
    // their tokens by index, for every weight type, int8 and f32 activations, 1-3 threads
    constexpr int64_t dim = 256, n_ff = 96, n_sh = 160;
    const auto x = random_vec(size_t(4 * dim), 130);
    const int32_t picks[] = {2, 0, 3};
    struct set {
        int experts;
        bool shared;
        int n;
    };
    for (dtype t : {dtype::q4_0x8, dtype::q8_0x8, dtype::q8_0, dtype::f32})
        for (const kernel_table* kt : all_tables())
            for (bool int8_act : {true, false})
                for (int threads : {1, 2, 3})
                    for (set st : {set{8, false, 1}, set{2, true, 1}, set{3, false, 1}, set{2, true, 3}}) {
                        const std::string table = kt->name;
                        CAPTURE(format::dtype_name(t));
                        CAPTURE(table);
                        CAPTURE(int8_act);
                        CAPTURE(threads);
                        CAPTURE(st.experts);
                        CAPTURE(st.n);
                        cpu_options o;
                        o.n_threads = threads;
                        o.kernels = kt;
                        o.int8_activations = int8_act;
                        auto be = make_cpu_backend(o, 4096);
                        const int n_jobs = st.experts + (st.shared ? 1 : 0);
                        std::vector<std::vector<uint8_t>> weights;
                        std::vector<tensor_view> views(3 * size_t(n_jobs));
                        for (int j = 0; j < n_jobs; ++j) {
                            const int64_t ff = j == st.experts ? n_sh : n_ff;
                            const int64_t rows[3] = {ff, ff, dim}, cols[3] = {dim, dim, ff};
                            for (int m = 0; m < 3; ++m) {
                                weights.push_back(
                                    stored_matrix(t, random_vec(size_t(rows[m] * cols[m]), 131 + weights.size(), 0.5f),
                                                  rows[m], cols[m]));
                                views[size_t(3 * j + m)] = matrix_view(t, rows[m], cols[m], weights.back());
                            }
                        }
                        // each job's buffers after the one before, as a session lays them out
                        const int64_t ff_all = int64_t(st.n) * (st.experts * n_ff + (st.shared ? n_sh : 0));
                        std::vector<float> g(size_t(ff_all), NAN), u(size_t(ff_all), NAN),
                            y(size_t(n_jobs * st.n * dim), NAN);
                        std::vector<ffn_job> jobs;
                        int64_t at = 0;
                        for (int j = 0; j < n_jobs; ++j) {
                            const int64_t ff = int64_t(views[size_t(3 * j)].rows());
                            jobs.push_back({&views[size_t(3 * j)], &views[size_t(3 * j + 1)], &views[size_t(3 * j + 2)],
                                            x.data(), st.n, st.n > 1 && j < st.experts ? picks : nullptr, g.data() + at,
                                            u.data() + at, y.data() + size_t(j * st.n * dim)});
                            at += st.n * ff;
                        }
                        be->ffn_many(jobs.data(), n_jobs);
                        for (int j = 0; j < n_jobs; ++j) {
                            CAPTURE(j);
                            const ffn_job& f = jobs[size_t(j)];
                            const size_t ff = f.gate->rows() * size_t(st.n);
                            std::vector<float> wg(ff), wu(ff), wy(size_t(st.n * dim));
                            const matmul_job gate_up[2] = {{f.gate, x.data(), st.n, wg.data(), f.x_rows},
                                                           {f.up, x.data(), st.n, wu.data(), f.x_rows}};
                            be->matmul_many(gate_up, 2);
                            be->swiglu(wg.data(), wu.data(), int64_t(ff));
                            be->matmul(*f.down, wg.data(), st.n, wy.data());
                            for (size_t i = 0; i < ff; ++i) REQUIRE(f.g[i] == wg[i]);
                            for (size_t i = 0; i < wy.size(); ++i) REQUIRE(f.y[i] == wy[i]);
                        }
                    }
}

TEST_CASE("backend sums weighted rows in order as add_scaled does") {
    for (int threads : {1, 3}) {
        cpu_options o;
        o.n_threads = threads;
        auto be = make_cpu_backend(o, 256);
        for (auto [n, k, dim] :
             {std::tuple{1, 9, 1024}, std::tuple{7, 2, 33}, std::tuple{300, 8, 512}}) { // the last across the threads
            CAPTURE(threads);
            CAPTURE(n);
            const int n_rows = 2 * n * k + 5;
            const auto rows = random_vec(size_t(n_rows) * dim, 91 + n);
            std::vector<int32_t> index(size_t(n) * k);
            std::vector<float> weight(size_t(n) * k);
            xorshift64s rng(92 + uint64_t(n));
            for (size_t i = 0; i < index.size(); ++i) {
                index[i] = static_cast<int32_t>(rng.uniform() * n_rows) % n_rows;
                weight[i] = 2.0f * rng.uniform() - 1.0f;
            }
            std::vector<float> got(size_t(n) * dim, NAN), want(size_t(n) * dim, 0.0f);
            be->weighted_sum_rows(got.data(), rows.data(), index.data(), weight.data(), n, k, dim);
            for (int t = 0; t < n; ++t) {
                for (int i = 0; i < k; ++i) {
                    be->add_scaled(want.data() + size_t(t) * dim, rows.data() + size_t(index[size_t(t * k + i)]) * dim,
                                   dim, weight[size_t(t * k + i)]);
                }
            }
            CHECK(got == want);
        }
    }
}

TEST_CASE("routing takes the best experts of the best groups, renormalises when asked, then scales") {
    // 8 experts in 4 groups of 2; group scores (their best): g0 0.9, g1 0.8, g2 0.85, g3 0.1 (as logits)
    const std::vector<float> logits = {0.9f, 0.0f, 0.8f, 0.79f, 0.85f, 0.2f, 0.1f, 0.05f};
    std::vector<float> probs(8);
    std::vector<int32_t> ids(3);
    std::vector<float> w(3);
    std::vector<float> p = logits;
    softmax(p.data(), 8);
    routing_rule rule{8, 3};
    route_top_k(logits.data(), rule, probs.data(), ids.data(), w.data());
    CHECK(ids == std::vector<int32_t>{0, 4, 2}); // no groups: the three best
    rule.n_group = 4;
    rule.n_group_used = 2; // groups 0 and 2: experts 0, 1, 4, 5
    rule.scale = 2.5f;
    route_top_k(logits.data(), rule, probs.data(), ids.data(), w.data());
    CHECK(ids == std::vector<int32_t>{0, 4, 5});
    CHECK(w[0] == p[0] * 2.5f);
    CHECK(w[2] == p[5] * 2.5f);
    rule.renorm = true;
    route_top_k(logits.data(), rule, probs.data(), ids.data(), w.data());
    const float sum = p[0] + p[4] + p[5];
    CHECK(w[1] == p[4] / sum * 2.5f);
}
