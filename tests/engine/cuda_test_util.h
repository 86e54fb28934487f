#pragma once
// What the CUDA backend's tests share (test_cuda_*.cpp, label gpu, and the same files on the
// CUDA emulation): the CPU reference, buffers on either backend, and the comparison. The CPU
// reference keeps its activations in f32, as the device does, so the two differ only by
// the order of their sums. Where no GPU is present each test says so and passes.

#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_query.h"
#include "ops/backend.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace colibri::test {

inline bool gpu_present() {
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

inline std::unique_ptr<backend> cpu_reference() {
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
inline void check_close(const std::vector<float>& got, const std::vector<float>& want, float tol) {
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
inline void compare(const std::function<std::vector<float>(backend&, buffers&)>& f, float tol = 1e-4f) {
    auto cpu = cpu_reference();
    auto gpu = make_cuda_backend(cuda_options{});
    buffers bc(*cpu), bg(*gpu);
    const std::vector<float> want = f(*cpu, bc);
    const std::vector<float> got = f(*gpu, bg);
    check_close(got, want, tol);
}

} // namespace colibri::test
