// The CUDA backend against the CPU backend (label gpu; the same file on the CUDA emulation):
// attention over f16 and f32 caches, for batches and for one token split across the context.

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

namespace {

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

} // namespace

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
