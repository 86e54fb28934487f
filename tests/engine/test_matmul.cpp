// The CPU backend's products against the scalar kernels: every weight type, odd and large
// shapes, 1 and 3 threads, decode's streams and prefill's tiles.

#include "kernel_test_util.h"

TEST_CASE("decode walks every product of a dispatch across matrices and threads as each alone") {
    // one token per job: streamed q4_0x8 and q8_0x8 jobs of two widths, a plain q8_0 job
    // among them, and f32 activations (nothing streamed); every output once, and each the
    // bits of the job alone on the reference kernels
    struct spec {
        dtype t;
        int64_t rows, cols;
    } specs[] = {{dtype::q4_0x8, 64, 352}, {dtype::q4_0x8, 2000, 352}, {dtype::q8_0, 12, 352},
                 {dtype::q8_0x8, 24, 352}, {dtype::q4_0x8, 8, 64},     {dtype::q8_0x8, 136, 64},
                 {dtype::q4_0x8, 512, 352}};
    std::vector<std::vector<uint8_t>> weights;
    std::vector<tensor_view> views;
    std::vector<std::vector<float>> xs;
    for (const spec& sp : specs) {
        weights.push_back(
            stored_matrix(sp.t, random_vec(size_t(sp.rows * sp.cols), 61 + weights.size()), sp.rows, sp.cols));
        // jobs 0 and 1 read the same activations (an expert's gate and up, or every expert's in decode)
        xs.push_back(weights.size() == 2 ? xs[0] : random_vec(size_t(sp.cols), 71 + weights.size()));
    }
    for (size_t i = 0; i < weights.size(); ++i)
        views.push_back(matrix_view(specs[i].t, specs[i].rows, specs[i].cols, weights[i]));
    for (bool int8_act : {true, false}) {
        cpu_options ro;
        ro.kernels = &scalar_kernel_table();
        ro.int8_activations = int8_act;
        auto ref = make_cpu_backend(ro, 4096);
        std::vector<std::vector<float>> want;
        for (size_t i = 0; i < views.size(); ++i) {
            want.emplace_back(size_t(specs[i].rows));
            ref->matmul(views[i], xs[i].data(), 1, want.back().data());
        }
        for (const kernel_table* kt : all_tables()) {
            for (int threads : {1, 2, 3}) {
                const std::string table = kt->name;
                CAPTURE(table);
                CAPTURE(threads);
                CAPTURE(int8_act);
                cpu_options o;
                o.n_threads = threads;
                o.kernels = kt;
                o.int8_activations = int8_act;
                auto be = make_cpu_backend(o, 4096);
                for (int rep = 0; rep < 3; ++rep) {
                    std::vector<std::vector<float>> got;
                    std::vector<matmul_job> jobs;
                    for (size_t i = 0; i < views.size(); ++i) got.emplace_back(size_t(specs[i].rows), NAN);
                    for (size_t i = 0; i < views.size(); ++i)
                        jobs.push_back({&views[i], xs[i].data(), 1, got[i].data()});
                    be->matmul_many(jobs.data(), int(jobs.size()));
                    for (size_t i = 0; i < views.size(); ++i) {
                        CAPTURE(i);
                        for (int64_t r = 0; r < specs[i].rows; ++r) {
                            CAPTURE(r);
                            if (int8_act) REQUIRE(got[i][size_t(r)] == want[i][size_t(r)]);
                            else
                                REQUIRE(std::fabs(got[i][size_t(r)] - want[i][size_t(r)]) <=
                                        1e-4f * (1.0f + std::fabs(want[i][size_t(r)])));
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("backend matmul matches the reference on odd and large shapes") {
    struct shape {
        int64_t rows, cols;
        int n;
    } shapes[] = {{1, 32, 1},    {7, 64, 3},     {257, 96, 1}, {33, 1024, 5}, {1000, 352, 2}, {37, 64, 70},
                  {8, 32, 1},    {24, 1024, 3},  {264, 96, 1}, {136, 352, 4}, {40, 64, 70},   {7, 256, 3},
                  {37, 512, 70}, {1000, 256, 2}, {48, 256, 6}, {16, 352, 8}};
    for (const kernel_table* kt : all_tables())
        for (bool int8_act : {false, true})
            for (int threads : {1, 3}) {
                cpu_options o;
                o.n_threads = threads;
                o.kernels = kt;
                o.int8_activations = int8_act;
                auto be = make_cpu_backend(o, 4096);
                for (auto s : shapes) {
                    for (dtype t :
                         {dtype::f32,    dtype::f16,    dtype::bf16,   dtype::q8_0,     dtype::q4_0,   dtype::q4_0x8,
                          dtype::q8_0x8, dtype::q4_k,   dtype::q5_k,   dtype::q6_k,     dtype::q4_1,   dtype::q5_0,
                          dtype::q5_1,   dtype::iq4_nl, dtype::iq4_xs, dtype::q2_k,     dtype::q3_k,   dtype::iq4_xsx8,
                          dtype::q4_1x8, dtype::q5_0x8, dtype::q5_1x8, dtype::iq4_nlx8, dtype::q2_kx8, dtype::q3_kx8}) {
                        if (format::is_interleaved(t) && s.rows % 8 != 0) continue;
                        if (format::row_bytes(t, uint64_t(s.cols)) == 0) continue;
                        const std::string table = kt->name;
                        CAPTURE(table);
                        CAPTURE(int8_act);
                        CAPTURE(threads);
                        CAPTURE(format::dtype_name(t));
                        CAPTURE(s.rows);
                        CAPTURE(s.n);
                        auto w = random_vec(size_t(s.rows * s.cols), 21);
                        const auto q = stored_matrix(t, w, s.rows, s.cols);
                        auto x = random_vec(size_t(s.n * s.cols), 22);
                        const tensor_view tv = matrix_view(t, s.rows, s.cols, q);
                        std::vector<float> y(size_t(s.n * s.rows));
                        be->matmul(tv, x.data(), s.n, y.data());
                        // with int8 activations the reference sees the same quantised activations
                        const bool quant_x = int8_act && format::is_quantized(t);
                        std::vector<float> xs = x;
                        if (quant_x) {
                            std::vector<block_q8_x> xq(size_t(s.cols / 32));
                            for (int tok = 0; tok < s.n; ++tok) {
                                (superblock_activations(t)
                                     ? scalar_kernel_table().quantize_x_k
                                     : scalar_kernel_table().quantize_x)(x.data() + tok * s.cols, xq.data(), s.cols);
                                for (int64_t c = 0; c < s.cols; ++c)
                                    xs[tok * s.cols + c] = xq[c / 32].d * xq[c / 32].qs[c % 32];
                            }
                        }
                        const uint64_t rb = format::row_bytes(t, s.cols);
                        std::vector<float> row(s.cols);
                        for (int tok = 0; tok < s.n; ++tok) {
                            for (int64_t r = 0; r < s.rows; ++r) {
                                if (format::is_interleaved(t)) {
                                    std::vector<uint8_t> plain(rb);
                                    format::x8_row(t, q.data(), uint64_t(s.cols), uint64_t(r), plain.data());
                                    format::row_to_f32(t, plain.data(), row.data(), s.cols);
                                } else {
                                    format::row_to_f32(t, q.data() + r * rb, row.data(), s.cols);
                                }
                                double ref = 0;
                                for (int64_t c = 0; c < s.cols; ++c) ref += double(row[c]) * xs[tok * s.cols + c];
                                REQUIRE(std::fabs(y[tok * s.rows + r] - ref) <=
                                        dot_tolerance(row.data(), xs.data() + tok * s.cols, s.cols, 1e-5));
                            }
                        }
                        // batching never changes a result: each token alone gives the same bits
                        std::vector<float> y1(size_t(s.rows));
                        for (int tok = 0; tok < s.n; ++tok) {
                            be->matmul(tv, x.data() + tok * s.cols, 1, y1.data());
                            for (int64_t r = 0; r < s.rows; ++r) REQUIRE(y1[size_t(r)] == y[size_t(tok * s.rows + r)]);
                        }
                    }
                }
            }
}

TEST_CASE("interleaved products split at any row give the results of the product alone and embed reads its rows") {
    // a q4_0x8 or q8_0x8 job after one of 12 rows starts mid-way through a chunk of the
    // split: each group must still be computed once, by the range that holds its first row
    const int64_t cols = 352;
    for (const dtype x8 : {dtype::q4_0x8, dtype::q8_0x8}) {
        const dtype plain_type = format::row_type(x8);
        CAPTURE(format::dtype_name(x8));
        auto make = [&](dtype t, int64_t rows, uint64_t seed) {
            return stored_matrix(t, random_vec(size_t(rows * cols), seed), rows, cols);
        };
        auto view = [&](dtype t, int64_t rows, const std::vector<uint8_t>& q) { return matrix_view(t, rows, cols, q); };
        const auto small = make(plain_type, 12, 31), big = make(x8, 2000, 32), big_plain = make(plain_type, 2000, 32);
        const tensor_view ts = view(plain_type, 12, small), tb = view(x8, 2000, big),
                          tp = view(plain_type, 2000, big_plain);
        for (const kernel_table* kt : all_tables()) {
            for (int threads : {1, 2, 3}) {
                for (int n : {1, 2, 3, 9}) {
                    const std::string table = kt->name;
                    CAPTURE(table);
                    CAPTURE(threads);
                    CAPTURE(n);
                    cpu_options o;
                    o.n_threads = threads;
                    o.kernels = kt;
                    auto be = make_cpu_backend(o, 4096);
                    const auto x = random_vec(size_t(n * cols), 33);
                    std::vector<float> y_small(size_t(n * 12)), y_big(size_t(n * 2000), NAN), y_alone(size_t(n * 2000));
                    const matmul_job jobs[2] = {{&ts, x.data(), n, y_small.data()}, {&tb, x.data(), n, y_big.data()}};
                    be->matmul_many(jobs, 2);
                    be->matmul(tb, x.data(), n, y_alone.data());
                    for (size_t i = 0; i < y_big.size(); ++i) REQUIRE(y_big[i] == y_alone[i]);
                    // the same rows stored plainly: equal within the f32 rounding of the sums
                    std::vector<float> y_plain(size_t(n * 2000));
                    be->matmul(tp, x.data(), n, y_plain.data());
                    for (size_t i = 0; i < y_big.size(); ++i)
                        REQUIRE(std::fabs(y_big[i] - y_plain[i]) <= 1e-4f * (1.0f + std::fabs(y_plain[i])));
                }
            }
        }
        auto be = make_cpu_backend(cpu_options{}, 4096);
        const int32_t ids[3] = {1999, 0, 77};
        std::vector<float> e8(3 * cols), e0(3 * cols);
        be->embed(tb, ids, 3, 0.5f, e8.data());
        be->embed(tp, ids, 3, 0.5f, e0.data());
        CHECK(e8 == e0);
    }
}

TEST_CASE("jobs that take their activations by row index give the bits of the rows copied out") {
    // a prefill's experts: gate and up pairs that share their row indices, some rows taken
    // by several jobs and some by none, two experts with as many tokens but other rows, a job
    // on all rows in order among them, for every weight type, int8 and f32 activations, one
    // and three threads
    constexpr int64_t cols = 352;
    constexpr int n_rows = 40;
    const auto x = random_vec(size_t(n_rows * cols), 95);
    const std::vector<std::vector<int32_t>> picks = {
        {3, 3, 17, 39}, {0}, {5, 9, 11, 12, 20, 21, 22, 23, 30, 31, 38}, {39, 0, 7}, {1, 2, 5, 8}};
    for (dtype t : {dtype::q4_0x8, dtype::q8_0x8, dtype::q8_0, dtype::q4_0, dtype::f32})
        for (bool int8_act : {false, true})
            for (int threads : {1, 3}) {
                CAPTURE(format::dtype_name(t));
                CAPTURE(int8_act);
                CAPTURE(threads);
                cpu_options o;
                o.n_threads = threads;
                o.int8_activations = int8_act;
                auto be = make_cpu_backend(o, 4096);
                const int64_t rows = 48;
                std::vector<std::vector<uint8_t>> weights;
                std::vector<tensor_view> views(2 * picks.size() + 1);
                for (size_t i = 0; i < views.size(); ++i) {
                    weights.push_back(stored_matrix(t, random_vec(size_t(rows * cols), 96 + i), rows, cols));
                    views[i] = matrix_view(t, rows, cols, weights.back());
                }
                std::vector<std::vector<float>> copied, got(views.size()), want(views.size());
                std::vector<matmul_job> by_index, by_copy;
                for (size_t p = 0; p < picks.size(); ++p) {
                    std::vector<float> c;
                    for (int32_t r : picks[p]) c.insert(c.end(), x.begin() + r * cols, x.begin() + (r + 1) * cols);
                    copied.push_back(std::move(c));
                }
                for (size_t p = 0; p < picks.size(); ++p) {
                    const int n = static_cast<int>(picks[p].size());
                    for (size_t h = 0; h < 2; ++h) { // gate and up
                        const size_t v = 2 * p + h;
                        got[v].assign(size_t(n * rows), NAN);
                        want[v].assign(size_t(n * rows), NAN);
                        by_index.push_back({&views[v], x.data(), n, got[v].data(), picks[p].data()});
                        by_copy.push_back({&views[v], copied[p].data(), n, want[v].data()});
                    }
                }
                const size_t all = views.size() - 1; // every row in order
                got[all].assign(size_t(n_rows * rows), NAN);
                want[all].assign(size_t(n_rows * rows), NAN);
                by_index.push_back({&views[all], x.data(), n_rows, got[all].data()});
                by_copy.push_back({&views[all], x.data(), n_rows, want[all].data()});
                be->matmul_many(by_index.data(), static_cast<int>(by_index.size()));
                be->matmul_many(by_copy.data(), static_cast<int>(by_copy.size()));
                for (size_t v = 0; v < views.size(); ++v) {
                    CAPTURE(v);
                    for (size_t i = 0; i < got[v].size(); ++i) REQUIRE(got[v][i] == want[v][i]);
                }
            }
}

TEST_CASE("per-head products and row copies match a direct computation") {
    const int n_head = 3, rows = 5, cols = 40, n = 4;
    const int64_t x_stride = cols + 3, y_stride = rows + 2; // gaps between the vectors stay untouched
    const auto x = random_vec(size_t(n) * n_head * x_stride, 31);
    for (format::dtype type : {format::dtype::f32, format::dtype::f16}) {
        for (int threads : {1, 3}) {
            CAPTURE(format::dtype_name(type));
            CAPTURE(threads);
            cpu_options o;
            o.n_threads = threads;
            auto be = make_cpu_backend(o, 256);
            const test::test_matrix w = test::make_matrix(type, int64_t(n_head) * rows, cols, 32);
            std::vector<float> got(size_t(n) * n_head * y_stride, -7.0f), want = got, row(cols);
            be->head_matmul(w.view, n_head, x.data(), x_stride, n, got.data(), y_stride);
            for (int i = 0; i < n * n_head; ++i) {
                for (int r = 0; r < rows; ++r) {
                    format::row_to_f32(type,
                                       w.view.data + size_t((i % n_head) * rows + r) * format::row_bytes(type, cols),
                                       row.data(), cols);
                    double dot = 0;
                    for (int c = 0; c < cols; ++c) dot += double(row[size_t(c)]) * x[size_t(i * x_stride + c)];
                    want[size_t(i * y_stride + r)] = float(dot);
                }
            }
            for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
        }
    }
    auto be = make_cpu_backend(cpu_options{}, 256);
    std::vector<float> dst(4 * 10, -1.0f);
    be->copy_rows(dst.data() + 2, 10, x.data() + 1, 7, 4, 5);
    for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < 10; ++c)
            CHECK(dst[size_t(r * 10 + c)] == (c >= 2 && c < 7 ? x[size_t(r * 7 + 1 + c - 2)] : -1.0f));
    }
}
