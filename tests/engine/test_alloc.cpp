// The per-token path allocates nothing: count every operator new during decode steps.

#include "api/runtime.h"
#include "convert/convert.h"
#include "model/session.h"
#include "sampling/sampler.h"
#include "test_util.h"

#include <atomic>
#include <cstdlib>
#include <doctest/doctest.h>
#include <new>

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
} // namespace

// Not inlined into the test, nor the operator deletes below: GCC would then see free() on
// what operator new returned, or the other way round, and warn of a mismatch
// (-Wmismatched-new-delete), as it does in the ThreadSanitizer build.
[[gnu::noinline]] void* operator new(size_t n) {
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept { std::free(p); }

using namespace colibri;

TEST_CASE("decode steps and sampling allocate nothing") {
    test::temp_dir dir;
    random_model_options o = test::small_random_model();
    o.n_ff_exp = 64;
    o.n_ff_shexp = 32; // a shared expert too
    const std::string path = dir.file("m.colibri");
    write_random_model(o, path, format::dtype::q8_0, {});
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        auto rt = load_runtime(path, "cpu", threads);
        session s(*rt->mdl, *rt->be, 128, 16);
        sampler smp(512);
        sampling_params p;
        p.temperature = 0.9f;
        p.top_k = 0; // every token a candidate: the most work the sampler can do
        p.repeat_penalty = 1.1f;
        smp.set_params(p);
        std::vector<int32_t> tokens = {1, 10, 20, 30, 40};
        tokens.reserve(64);
        s.eval(tokens.data(), static_cast<int>(tokens.size()));
        allocations = 0;
        counting = true;
        for (int i = 0; i < 32; ++i) {
            const int32_t id = smp.sample(s.logits(), tokens);
            tokens.push_back(id);
            s.eval(&id, 1);
        }
        counting = false;
        CHECK(allocations.load() == 0);
        CHECK(s.n_past() == 37);
    }
}
