// The CUDA backend against the CPU backend (label gpu): every operation on random inputs,
// then whole models of every family and weight type. The CPU reference keeps its
// activations in f32, as the device does, so the two differ only by the order of their
// sums. Where no GPU is present each test says so and passes.

#include "api/runtime.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_query.h"
#include "cuda/device_weights.h"
#include "device_test_util.h"
#include "model/model.h"
#include "model/session.h"
#include "test_util.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace colibri;

namespace {

bool gpu_present() {
    std::string why;
    const int n = cuda_device_count(why);
    if (n <= 0) {
        MESSAGE("skipped: no CUDA GPU here (" << (n < 0         ? "this build has no CUDA"
                                                  : why.empty() ? "no device"
                                                                : why)
                                              << ")");
    }
    return n > 0;
}

std::unique_ptr<backend> cpu_reference() {
    cpu_options o;
    o.n_threads = 2;
    o.int8_activations = false;
    return make_cpu_backend(o, 16384);
}

// Buffers of one backend, filled from and read back to the host.
class buffers {
public:
    explicit buffers(backend& be) : be_(be) {}
    float* put(const std::vector<float>& v) {
        held_.push_back(be_.alloc(v.size()));
        be_.from_host(v.data(), v.size(), held_.back()->data());
        return held_.back()->data();
    }
    float* zeros(size_t n) {
        held_.push_back(be_.alloc(n));
        return held_.back()->data();
    }
    std::vector<float> get(const float* p, size_t n) {
        std::vector<float> staging;
        const float* h = be_.to_host(p, n, staging);
        return {h, h + n};
    }

private:
    backend& be_;
    std::vector<std::unique_ptr<device_buffer>> held_;
};

// The largest difference, within tol of the reference's largest magnitude (plus one).
void check_close(const std::vector<float>& got, const std::vector<float>& want, float tol) {
    REQUIRE(got.size() == want.size());
    float scale = 0.0f, worst = 0.0f;
    size_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        const float d = std::abs(got[i] - want[i]);
        if (!(d <= worst)) { // NaN included
            worst = d;
            at = i;
        }
    }
    CAPTURE(at);
    CAPTURE(got[at]);
    CAPTURE(want[at]);
    CAPTURE(scale);
    CHECK(worst <= tol * (1.0f + scale));
}

struct attention_shape {
    int n_head, n_head_kv, head_dim, n_ctx;
    bool f16;
    int window = 0;    // sliding window; 0: none
    float softcap = 0; // capped scores; 0: none
};

// Attention of the tokens at positions pos (queries, their keys and values from the host)
// over the caches on be; its outputs.
std::vector<float> attend(backend& be, buffers& b, const attention_shape& s, float* k_cache, float* v_cache,
                          const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                          const std::vector<int32_t>& pos) {
    attention_args a{};
    a.q = b.put(q);
    a.k_new = b.put(k);
    a.v_new = b.put(v);
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.kv_f16 = s.f16;
    a.pos = pos.data();
    a.n = int(pos.size());
    const size_t out = pos.size() * size_t(s.n_head) * size_t(s.head_dim);
    a.out = b.zeros(out);
    a.scratch = b.zeros(size_t(be.n_threads()) * size_t(s.n_head / s.n_head_kv) * size_t(s.n_ctx));
    a.n_ctx = s.n_ctx;
    a.n_head = s.n_head;
    a.n_head_kv = s.n_head_kv;
    a.head_dim = s.head_dim;
    a.scale = 1.0f / std::sqrt(float(s.head_dim));
    a.window = s.window;
    a.softcap = s.softcap;
    be.attention(a);
    return b.get(a.out, out);
}

// f() throws colibri::error with `code`, its message naming `says`.
template <class F>
void check_refused(F&& f, errc code, const std::string& says) {
    try {
        f();
        FAIL("accepted");
    } catch (const error& e) {
        CHECK(e.code() == code);
        CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
}

// f(backend, its buffers) on the CPU reference and on the device; the two results close.
void compare(const std::function<std::vector<float>(backend&, buffers&)>& f, float tol = 1e-4f) {
    auto cpu = cpu_reference();
    auto gpu = make_cuda_backend(cuda_options{});
    buffers bc(*cpu), bg(*gpu);
    const std::vector<float> want = f(*cpu, bc);
    const std::vector<float> got = f(*gpu, bg);
    check_close(got, want, tol);
}

} // namespace

TEST_CASE("without a usable GPU the CUDA backend is refused with the reason") {
    std::string why;
    cuda_options o;
    if (cuda_device_count(why) > 0) o.device = 99; // with a GPU: one that is not there
    check_refused([&] { make_cuda_backend(o); }, errc::unsupported, "cuda:" + std::to_string(o.device));
}

TEST_CASE("matrix products of every weight type match the CPU's on the device") {
    if (!gpu_present()) return;
    struct shape {
        int64_t rows, cols;
    };
    for (format::dtype type : test::device_test_types) {
        for (const shape s : {shape{8, 32}, shape{24, 96}, shape{72, 1024}, shape{1024, 2816}}) {
            const test::test_matrix w = test::make_matrix(type, s.rows, s.cols, uint64_t(s.rows + s.cols));
            for (int n : {1, 3, 9, 20, 40}) {
                if (n >= 16 && s.rows > 72) continue; // tensor-core tiles: the smaller shapes (emulation time)
                CAPTURE(format::dtype_name(type));
                CAPTURE(s.rows);
                CAPTURE(s.cols);
                CAPTURE(n);
                const std::vector<float> x = test::random_floats(size_t(n) * size_t(s.cols), 11);
                compare([&](backend& be, buffers& b) {
                    float* y = b.zeros(size_t(n) * size_t(s.rows));
                    be.matmul(w.view, b.put(x), n, y);
                    return b.get(y, size_t(n) * size_t(s.rows));
                });
                // the tokens taken by index from a larger activation buffer
                const std::vector<float> pool = test::random_floats(size_t(n + 5) * size_t(s.cols), 12);
                std::vector<int32_t> rows(static_cast<size_t>(n));
                for (int t = 0; t < n; ++t) rows[size_t(t)] = (t * 7 + 3) % (n + 5);
                compare([&](backend& be, buffers& b) {
                    float* y = b.zeros(size_t(n) * size_t(s.rows));
                    const matmul_job job{&w.view, b.put(pool), n, y, rows.data()};
                    be.matmul_many(&job, 1);
                    return b.get(y, size_t(n) * size_t(s.rows));
                });
            }
        }
    }
    // GGUF's types (super-blocks of 256 for the K and i types)
    for (format::dtype type : test::device_gguf_types) {
        for (const shape s : {shape{8, 256}, shape{40, 768}}) {
            const test::test_matrix w = test::make_matrix(type, s.rows, s.cols, uint64_t(s.rows + s.cols));
            for (int n : {1, 9, 20}) {
                CAPTURE(format::dtype_name(type));
                CAPTURE(s.rows);
                CAPTURE(n);
                const std::vector<float> x = test::random_floats(size_t(n) * size_t(s.cols), 14);
                compare([&](backend& be, buffers& b) {
                    float* y = b.zeros(size_t(n) * size_t(s.rows));
                    be.matmul(w.view, b.put(x), n, y);
                    return b.get(y, size_t(n) * size_t(s.rows));
                });
            }
        }
    }
    // float rows of a length that is not a multiple of 32
    for (format::dtype type : {format::dtype::f32, format::dtype::f16, format::dtype::bf16}) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix w = test::make_matrix(type, 5, 37, 3);
        const int64_t cols = 37;
        for (int n : {1, 4}) {
            const std::vector<float> x = test::random_floats(size_t(n) * cols, 13);
            compare([&](backend& be, buffers& b) {
                float* y = b.zeros(size_t(n) * 5);
                be.matmul(w.view, b.put(x), n, y);
                return b.get(y, size_t(n) * 5);
            });
        }
    }
}

TEST_CASE("RMSNorm, RoPE, biases, SwiGLU and the element-wise operations match the CPU's on the device") {
    if (!gpu_present()) return;
    const int n = 5, dim = 96, heads = 6, hd = 16;
    const std::vector<float> x = test::random_floats(size_t(n) * dim, 1, 3.0f);
    const std::vector<float> y = test::random_floats(size_t(n) * dim, 2);
    const test::test_matrix norm = test::make_vector(dim, 3, 1.0f);
    const std::vector<int32_t> pos = {0, 1, 7, 300, 4095};
    SUBCASE("rmsnorm, separate and in place") {
        compare([&](backend& be, buffers& b) {
            float* out = b.zeros(x.size());
            be.rmsnorm(b.put(x), norm.view, n, dim, 1e-6f, out);
            return b.get(out, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rmsnorm(in, norm.view, n * heads, hd, 1e-5f, in); // per head, as Qwen3's q/k norms
            return b.get(in, x.size());
        });
    }
    SUBCASE("layernorm and gelu") {
        const test::test_matrix bias = test::make_vector(dim, 4);
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.layernorm(in, norm.view, bias.view, n, dim, 1e-5f, in);
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.gelu(in, int64_t(x.size()));
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* g = b.put(x);
            be.geglu(g, b.put(y), int64_t(x.size()));
            return b.get(g, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.softcap(in, int64_t(x.size()), 1.5f);
            return b.get(in, x.size());
        });
    }
    SUBCASE("rope") {
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rope(in, n, heads, hd, pos.data(), {10000.0f});
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rope(in, n, 3, 32, pos.data(), {1e6f});
            return b.get(in, x.size());
        });
        const test::test_matrix factors = test::make_vector(16, 9, 4.0f); // scaled RoPE: llama3, YaRN
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.rope(in, n, 3, 32, pos.data(), {5e5f, &factors.view, 1.2f});
            return b.get(in, x.size());
        });
    }
    SUBCASE("bias, swiglu, add_scaled, scale") {
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.add_bias(in, norm.view, n, dim);
            return b.get(in, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* g = b.put(x);
            be.swiglu(g, b.put(y), int64_t(x.size()));
            return b.get(g, x.size());
        });
        compare([&](backend& be, buffers& b) {
            float* in = b.put(x);
            be.add_scaled(in, b.put(y), int64_t(x.size()), 0.7f);
            be.scale(in, int64_t(x.size()), -1.5f);
            return b.get(in, x.size());
        });
    }
    SUBCASE("weighted sums of rows") {
        const int k = 3;
        const std::vector<float> rows = test::random_floats(size_t(8) * dim, 4);
        const std::vector<int32_t> index = {0, 3, 7, 1, 2, 6, 5, 5, 4, 7, 0, 2, 6, 3, 1};
        const std::vector<float> weight = test::random_floats(size_t(n) * k, 5);
        compare([&](backend& be, buffers& b) {
            float* out = b.zeros(size_t(n) * dim);
            be.weighted_sum_rows(out, b.put(rows), index.data(), weight.data(), n, k, dim);
            return b.get(out, size_t(n) * dim);
        });
    }
}

TEST_CASE("per-head products and row copies match the CPU's on the device") {
    if (!gpu_present()) return;
    const int n_head = 4, rows = 24, cols = 72, n = 3;
    const std::vector<float> x = test::random_floats(size_t(n) * n_head * (cols + 8), 7);
    for (format::dtype type : {format::dtype::f32, format::dtype::f16}) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix w = test::make_matrix(type, int64_t(n_head) * rows, cols, 8);
        compare([&](backend& be, buffers& b) {
            float* y = b.zeros(size_t(n) * n_head * (rows + 5));
            be.head_matmul(w.view, n_head, b.put(x), cols + 8, n, y, rows + 5);
            return b.get(y, size_t(n) * n_head * (rows + 5));
        });
    }
    compare([&](backend& be, buffers& b) {
        float* y = b.zeros(size_t(n) * 50);
        be.copy_rows(y + 3, 50, b.put(x), cols, n, 40);
        return b.get(y, size_t(n) * 50);
    });
}

TEST_CASE("token embeddings of every table type match the CPU's on the device") {
    if (!gpu_present()) return;
    const std::vector<int32_t> ids = {5, 0, 31, 17, 5};
    for (format::dtype type : test::device_test_types) {
        CAPTURE(format::dtype_name(type));
        const test::test_matrix table = test::make_matrix(type, 32, 64, 9);
        for (float scale : {1.0f, 8.0f}) {
            compare([&](backend& be, buffers& b) {
                float* out = b.zeros(ids.size() * 64);
                be.embed(table.view, ids.data(), int(ids.size()), scale, out);
                return b.get(out, ids.size() * 64);
            });
        }
    }
}

TEST_CASE("attention over f16 and f32 caches matches the CPU's on the device") {
    if (!gpu_present()) return;
    for (bool f16 : {true, false}) {
        for (auto [hd, window, softcap] : {std::tuple{64, 0, 0.0f},
                                           {128, 0, 0.0f},
                                           {16, 0, 0.0f},
                                           {64, 20, 0.0f},
                                           {16, 300, 0.0f},
                                           {64, 20, 1.5f}}) {
            CAPTURE(f16);
            CAPTURE(hd);
            CAPTURE(window);
            CAPTURE(softcap);
            const int n_head = 8, n_head_kv = 2, n_ctx = 300, first = 37;
            const size_t q_dim = size_t(n_head) * hd, kv_dim = size_t(n_head_kv) * hd;
            const size_t cache_floats = (size_t(n_head_kv) * n_ctx * hd * (f16 ? 2 : 4) + 3) / 4;
            const std::vector<float> keys = test::random_floats((first + 9) * kv_dim, 21);
            const std::vector<float> values = test::random_floats((first + 9) * kv_dim, 22);
            const std::vector<float> queries = test::random_floats((first + 9) * q_dim, 23);
            compare([&](backend& be, buffers& b) {
                float* k_cache = b.zeros(cache_floats);
                float* v_cache = b.zeros(cache_floats);
                std::vector<float> outs;
                // a batch of `first` positions, then one, then a batch of eight more
                int at = 0;
                for (int len : {first, 1, 8}) {
                    std::vector<int32_t> pos(static_cast<size_t>(len));
                    for (int t = 0; t < len; ++t) pos[size_t(t)] = at + t;
                    const auto rows = [&](const std::vector<float>& v, size_t width) {
                        return std::vector<float>(v.begin() + ptrdiff_t(at * width),
                                                  v.begin() + ptrdiff_t((at + len) * width));
                    };
                    const std::vector<float> o =
                        attend(be, b, {n_head, n_head_kv, hd, n_ctx, f16, window, softcap}, k_cache, v_cache,
                               rows(queries, q_dim), rows(keys, kv_dim), rows(values, kv_dim), pos);
                    outs.insert(outs.end(), o.begin(), o.end());
                    at += len;
                }
                return outs;
            });
        }
    }
}

TEST_CASE("feed-forwards with token rows taken by index match the CPU's on the device") {
    if (!gpu_present()) return;
    for (format::dtype type : {format::dtype::q8_0x8, format::dtype::q4_0x8, format::dtype::f16}) {
        CAPTURE(format::dtype_name(type));
        const int dim = 128, n_ff = 96, n = 6;
        std::vector<test::test_matrix> w;
        for (int i = 0; i < 6; ++i)
            w.push_back(test::make_matrix(type, i % 3 == 2 ? dim : n_ff, i % 3 == 2 ? n_ff : dim, uint64_t(40 + i)));
        const std::vector<float> x = test::random_floats(size_t(n) * dim, 31);
        const std::vector<int32_t> rows_a = {0, 2, 5}, rows_b = {1, 2, 3, 4};
        for (const bool gelu : {false, true}) { // SwiGLU, GeGLU
            CAPTURE(gelu);
            compare([&](backend& be, buffers& b) {
                const float* xs = b.put(x);
                float* g = b.zeros(size_t(7) * n_ff);
                float* u = b.zeros(size_t(7) * n_ff);
                float* y = b.zeros(size_t(7) * dim);
                const ffn_job jobs[2] = {{&w[0].view, &w[1].view, &w[2].view, xs, 3, rows_a.data(), g, u, y, gelu},
                                         {&w[3].view, &w[4].view, &w[5].view, xs, 4, rows_b.data(), g + 3 * n_ff,
                                          u + 3 * n_ff, y + 3 * dim, gelu}};
                be.ffn_many(jobs, 2);
                return b.get(y, size_t(7) * dim);
            });
        }
    }
}

TEST_CASE("whole models of every family give the CPU's logits on the device") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 4, 250};
    for (const std::string& family : test::family_names()) {
        for (format::dtype quant : {format::dtype::f32, format::dtype::q8_0, format::dtype::q4_0}) {
            CAPTURE(family);
            CAPTURE(format::dtype_name(quant));
            const std::string path = dir.file(std::string(family) + ".colibri");
            convert_checkpoint(test::fixture(family), path, quant, {});
            auto cpu = load_runtime(path, "cpu", 2, true);
            auto gpu = load_runtime(path, "cuda:0", 0);
            const int vocab = static_cast<int>(cpu->mdl->hp().n_vocab);
            session sc(*cpu->mdl, *cpu->be, 64), sg(*gpu->mdl, *gpu->be, 64);
            const auto step = [&](const int32_t* tokens, int n) {
                sc.eval(tokens, n);
                sg.eval(tokens, n);
                check_close(std::vector<float>(sg.logits(), sg.logits() + vocab),
                            std::vector<float>(sc.logits(), sc.logits() + vocab), 1e-3f);
            };
            step(prompt.data(), int(prompt.size()));
            for (int32_t t : {7, 8, 9}) step(&t, 1);
            // a cache cut back and extended again
            sc.truncate(4);
            sg.truncate(4);
            step(prompt.data() + 4, 3);
            // a batch of 24: the products of quantised weights on the tensor cores
            std::vector<int32_t> batch(24);
            for (size_t i = 0; i < batch.size(); ++i) batch[i] = int32_t(3 + (i * 37) % 200);
            step(batch.data(), int(batch.size()));
        }
    }
}

TEST_CASE("llama.cpp's files of every GGUF type give the CPU's logits on the device") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 4, 250};
    // tests/reference/generate_gguf_kquants.py: between them every type the converter keeps
    for (const char* name :
         {"q4_k_m", "q5_k_m", "q6_k", "iq4_xs", "iq4_nl", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m"}) {
        CAPTURE(name);
        const std::string path = dir.file(std::string(name) + ".colibri");
        convert_gguf(test::fixture(std::string("gguf/kquant-") + name + ".gguf"), path, std::nullopt, {});
        auto cpu = load_runtime(path, "cpu", 2, true);
        auto gpu = load_runtime(path, "cuda:0", 0);
        const int vocab = static_cast<int>(cpu->mdl->hp().n_vocab);
        session sc(*cpu->mdl, *cpu->be, 64), sg(*gpu->mdl, *gpu->be, 64);
        sc.eval(prompt.data(), int(prompt.size()));
        sg.eval(prompt.data(), int(prompt.size()));
        check_close(std::vector<float>(sg.logits(), sg.logits() + vocab),
                    std::vector<float>(sc.logits(), sc.logits() + vocab), 1e-3f);
        const int32_t t = 9;
        sc.eval(&t, 1);
        sg.eval(&t, 1);
        check_close(std::vector<float>(sg.logits(), sg.logits() + vocab),
                    std::vector<float>(sc.logits(), sc.logits() + vocab), 1e-3f);
    }
}

TEST_CASE("under a device weight budget experts are copied in when used - the logits do not change") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::string path = dir.file("qwen2.colibri");
    convert_checkpoint(test::fixture("qwen2_moe"), path, format::dtype::q8_0, {}); // MoE layers of 8 experts, top-2
    auto all = load_runtime(path, "cuda:0", 0);
    // the budget: every weight but the routed experts, and three experts per layer
    uint64_t dense = 0, expert = 0;
    int layers = 0;
    for (const layer_weights& l : all->mdl->layers()) {
        if (!l.is_moe()) continue;
        ++layers;
        expert = packed_bytes(*l.experts[0].gate) + packed_bytes(*l.experts[0].up) + packed_bytes(*l.experts[0].down);
    }
    uint64_t experts_total = 0;
    for (const layer_weights& l : all->mdl->layers()) {
        for (const expert_weights& e : l.experts)
            experts_total += packed_bytes(*e.gate) + packed_bytes(*e.up) + packed_bytes(*e.down);
    }
    for (const tensor_view& t : all->mdl->file().tensors()) dense += packed_bytes(t);
    dense -= experts_total;
    REQUIRE(layers >= 2);
    auto few = load_runtime(path, "cuda:0", 0, false, dense + 3 * uint64_t(layers) * expert + expert / 2);
    CHECK(few->be->expert_cache_usage().slots_per_layer == 3);
    CHECK(all->be->expert_cache_usage().slots_per_layer == 0);

    const int vocab = static_cast<int>(all->mdl->hp().n_vocab);
    session sa(*all->mdl, *all->be, 64), sf(*few->mdl, *few->be, 64);
    // both route on the host (an observer needs the routing there): the same arithmetic
    const route_observer quiet{[](void*, int, int, const int32_t*, const float*, int) {}, nullptr};
    sa.set_route_observer(quiet);
    sf.set_route_observer(quiet);
    const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 4, 250, 31, 8};
    const auto same = [&] { CHECK(std::memcmp(sa.logits(), sf.logits(), sizeof(float) * size_t(vocab)) == 0); };
    sa.eval(prompt.data(), int(prompt.size()));
    sf.eval(prompt.data(), int(prompt.size()));
    same();
    for (int32_t t : {7, 8, 9, 10, 11, 12}) {
        sa.eval(&t, 1);
        sf.eval(&t, 1);
        same();
    }
    const expert_cache_stats st = few->be->expert_cache_usage();
    CHECK(st.misses > 0);
    CHECK(st.hits > 0);
    CHECK(st.bytes_copied == st.misses * expert);
    // every token uses two experts in each MoE layer
    CHECK(st.hits + st.misses >= uint64_t(2 * layers * (1 + 6)));
    CHECK(all->be->expert_cache_usage().misses == 0);

    // a budget that does not hold the rest of the model is refused, saying how much it needs
    check_refused([&] { load_runtime(path, "cuda:0", 0, false, dense / 2); }, errc::out_of_memory, "budget");
}

TEST_CASE("routing on the device picks the experts and weights the session picks on the host") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    for (const std::string& family : test::family_names(true)) {
        for (format::dtype quant : {format::dtype::f32, format::dtype::q8_0}) {
            CAPTURE(family);
            CAPTURE(format::dtype_name(quant));
            const std::string path = dir.file(std::string(family) + ".colibri");
            convert_checkpoint(test::fixture(family), path, quant, {});
            auto rt = load_runtime(path, "cuda:0", 0);
            const int vocab = static_cast<int>(rt->mdl->hp().n_vocab);
            session device(*rt->mdl, *rt->be, 64), host(*rt->mdl, *rt->be, 64);
            std::vector<int> routed; // experts the host chose
            host.set_route_observer({[](void* user, int, int, const int32_t* ids, const float*, int k) {
                                         auto* v = static_cast<std::vector<int>*>(user);
                                         v->insert(v->end(), ids, ids + k);
                                     },
                                     &routed});
            const std::vector<int32_t> prompt = {1, 15, 27, 3, 99};
            device.eval(prompt.data(), int(prompt.size()));
            host.eval(prompt.data(), int(prompt.size()));
            for (int32_t t : {7, 8, 9, 250}) {
                device.eval(&t, 1);
                host.eval(&t, 1);
                const std::vector<float> d(device.logits(), device.logits() + vocab),
                    h(host.logits(), host.logits() + vocab);
#if defined(COLIBRI_CUDA_EMULATED)
                CHECK(d == h); // the same expf on both sides: the same bits
#else
                check_close(d, h, 1e-5f);
#endif
            }
            CHECK(!routed.empty());
            // an observer set once steps replay from a graph still sees every layer's routing
            std::vector<int> late;
            device.set_route_observer({[](void* user, int, int, const int32_t* ids, const float*, int k) {
                                           auto* v = static_cast<std::vector<int>*>(user);
                                           v->insert(v->end(), ids, ids + k);
                                       },
                                       &late});
            const int32_t t = 11;
            device.eval(&t, 1);
            int moe_layers = 0;
            for (const layer_weights& l : rt->mdl->layers()) moe_layers += l.is_moe() ? 1 : 0;
            CHECK(late.size() == size_t(moe_layers) * rt->mdl->hp().n_expert_used);
        }
    }
}

TEST_CASE("a MoE step on the device breaks routing ties to the lower expert and renormalises when asked") {
    if (!gpu_present()) return;
    const int dim = 64, n_ff = 32, n_expert = 6, k = 2;
    // a router of zeros: every expert equally likely, so experts 0 and 1 are chosen
    const test::test_matrix router = [] {
        test::test_matrix m = test::make_matrix(format::dtype::f32, n_expert, dim, 1);
        std::fill(m.bytes.begin(), m.bytes.end(), uint8_t(0));
        return m;
    }();
    std::vector<test::test_matrix> mats;
    for (int e = 0; e < n_expert; ++e) {
        mats.push_back(test::make_matrix(format::dtype::q8_0x8, n_ff, dim, uint64_t(100 + 3 * e)));
        mats.push_back(test::make_matrix(format::dtype::q8_0x8, n_ff, dim, uint64_t(101 + 3 * e)));
        mats.push_back(test::make_matrix(format::dtype::q8_0x8, dim, n_ff, uint64_t(102 + 3 * e)));
    }
    std::vector<expert_weights> experts(n_expert);
    for (int e = 0; e < n_expert; ++e)
        experts[size_t(e)] = {&mats[size_t(3 * e)].view, &mats[size_t(3 * e + 1)].view, &mats[size_t(3 * e + 2)].view};
    const std::vector<float> x = test::random_floats(dim, 5);
    for (bool renorm : {false, true}) {
        CAPTURE(renorm);
        // the reference: experts 0 and 1 with weight 1/6 each (1/2 renormalised), in order
        auto cpu = cpu_reference();
        buffers bc(*cpu);
        const float* xc = bc.put(x);
        float* g = bc.zeros(size_t(k) * n_ff);
        float* u = bc.zeros(size_t(k) * n_ff);
        float* y = bc.zeros(size_t(k) * dim);
        const ffn_job jobs[2] = {
            {experts[0].gate, experts[0].up, experts[0].down, xc, 1, nullptr, g, u, y},
            {experts[1].gate, experts[1].up, experts[1].down, xc, 1, nullptr, g + n_ff, u + n_ff, y + dim}};
        cpu->ffn_many(jobs, 2);
        const float w = renorm ? 0.5f : 1.0f / n_expert;
        const std::vector<int32_t> index = {0, 1};
        const std::vector<float> weight = {w, w};
        float* want = bc.zeros(dim);
        cpu->weighted_sum_rows(want, y, index.data(), weight.data(), 1, k, dim);

        auto gpu = make_cuda_backend(cuda_options{});
        buffers bg(*gpu);
        float* got = bg.zeros(dim);
        const moe_step step{&router.view, experts.data(), n_expert, k,         renorm, 1, 1,
                            1.0f,         nullptr,        nullptr,  bg.put(x), got};
        REQUIRE(gpu->moe_one(step));
        check_close(bg.get(got, dim), bc.get(want, dim), 1e-5f);
    }
}

TEST_CASE("one token attends over a long cache split across the sequence as the CPU does") {
    if (!gpu_present()) return;
    for (bool f16 : {true, false}) {
        for (int hd : {64, 128}) {
            for (int at : {0, 255, 256, 600, 767}) {
                CAPTURE(f16);
                CAPTURE(hd);
                CAPTURE(at);
                const int n_head = 8, n_head_kv = 2, n_ctx = 768;
                // the cache's earlier rows as stored ([kv head][position][dim], f16 or f32)
                const std::vector<float> rows = test::random_floats(size_t(n_head_kv) * n_ctx * hd, uint64_t(at + hd));
                std::vector<float> cache((rows.size() * (f16 ? 2 : 4) + 3) / 4);
                if (f16) {
                    std::vector<uint16_t> h(rows.size());
                    for (size_t i = 0; i < rows.size(); ++i) h[i] = f32_to_f16(rows[i]);
                    std::memcpy(cache.data(), h.data(), h.size() * 2);
                } else {
                    cache = rows;
                }
                const std::vector<float> q = test::random_floats(size_t(n_head) * hd, 7, 0.5f);
                const std::vector<float> k = test::random_floats(size_t(n_head_kv) * hd, 8);
                const std::vector<float> v = test::random_floats(size_t(n_head_kv) * hd, 9);
                const std::vector<int32_t> pos = {at};
                compare([&](backend& be, buffers& b) {
                    return attend(be, b, {n_head, n_head_kv, hd, n_ctx, f16}, b.put(cache), b.put(cache), q, k, v, pos);
                });
            }
        }
    }
}

TEST_CASE("the backend reports its recorded steps, and with COLIBRI_CUDA_PROFILE set each operation's device time") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::string path = dir.file("qwen2.colibri");
    convert_checkpoint(test::fixture("qwen2_moe"), path, format::dtype::q8_0, {});
    auto plain = load_runtime(path, "cuda:0", 0);
    CHECK(cuda_profile_report(*plain->be) == "one-token steps: 0 replayed from 0 recordings, 0 not recordable\n");
    ::setenv("COLIBRI_CUDA_PROFILE", "1", 1);
    auto profiled = load_runtime(path, "cuda:0", 0);
    ::unsetenv("COLIBRI_CUDA_PROFILE");
    const int vocab = static_cast<int>(plain->mdl->hp().n_vocab);
    session sp(*plain->mdl, *plain->be, 32), sq(*profiled->mdl, *profiled->be, 32);
    const std::vector<int32_t> prompt = {1, 15, 27, 3};
    sp.eval(prompt.data(), 4);
    sq.eval(prompt.data(), 4);
    for (int32_t t : {7, 8, 9}) { // plain steps while profiling: no graph, the same logits
        sp.eval(&t, 1);
        sq.eval(&t, 1);
        CHECK(std::vector<float>(sp.logits(), sp.logits() + vocab) ==
              std::vector<float>(sq.logits(), sq.logits() + vocab));
    }
    const std::string report = cuda_profile_report(*profiled->be);
    INFO(report);
    for (const char* op : {"product q8 batch", "product q8 1 token", "attention", "rmsnorm", "moe_one", "embed"}) {
        CHECK(report.find(op) != std::string::npos);
    }
    CHECK(report.starts_with("one-token steps: 0 replayed from 0 recordings, 0 not recordable\n"));
    // without profiling: the first step plain, the second recorded, the third replayed
    CHECK(cuda_profile_report(*plain->be) == "one-token steps: 1 replayed from 1 recordings, 0 not recordable\n");
}
