// The CUDA backend against the CPU backend (label gpu; the same file on the CUDA emulation):
// experts' feed-forwards, routing on the device, and the expert cache under a weight budget.

#include "api/runtime.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda/device_weights.h"
#include "cuda_test_util.h"
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
using namespace colibri::test;

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
