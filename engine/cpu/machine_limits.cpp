#include "cpu/machine_limits.h"

#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "cpu/vec.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace colibri {

namespace {
using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}
} // namespace

double measure_read_bandwidth(int n_threads, size_t bytes, int repeats, const vec_kernels& vk) {
    bytes = bytes / (4096 * size_t(n_threads)) * 4096 * size_t(n_threads);
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), &std::free);
    if (!buf) return 0;
    thread_pool pool(n_threads);
    const size_t part = bytes / size_t(n_threads);
    // first touch by the thread that will read it (NUMA placement), and no zero-page tricks
    pool.run([&](int ith, int) { std::memset(buf.get() + part * size_t(ith), ith + 1, part); });
    std::atomic<uint64_t> sink{0};
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = clock_type::now();
        pool.run([&](int ith, int) { sink += vk.read_sum(buf.get() + part * size_t(ith), part); });
        best = std::max(best, double(bytes) / seconds_since(t0));
    }
    return sink.load() == 42 ? best + 1e-9 : best; // keep the sums alive
}

dot_peak measure_dot_peak(int n_threads, const vec_kernels& vk) {
    const int64_t n = 4096, rows = 8, iters = 2000; // 8 rows of 4096: 34 KiB per thread
    thread_pool pool(n_threads);
    std::vector<float> x(size_t(4 * n)); // four activation vectors (the prefill kernel's batch)
    for (int64_t i = 0; i < 4 * n; ++i) x[size_t(i)] = float(i % 7) - 3.0f;
    std::vector<uint8_t> w(size_t(rows) * format::row_bytes(format::dtype::q8_0, n));
    for (int64_t r = 0; r < rows; ++r) {
        kernels::from_f32_row(format::dtype::q8_0, x.data(), w.data() + size_t(r) * format::row_bytes(format::dtype::q8_0, n), n);
    }
    std::vector<block_q8_x> xq(size_t(n / format::qk));
    vk.quantize_x(x.data(), xq.data(), n);
    std::atomic<float> sink{0};
    auto run = [&](bool int8) {
        const auto t0 = clock_type::now();
        pool.run([&](int, int) {
            float s = 0, out[4];
            for (int64_t it = 0; it < iters; ++it) {
                for (int64_t r = 0; r < rows; ++r) {
                    const uint8_t* row = w.data() + size_t(r) * format::row_bytes(format::dtype::q8_0, n);
                    if (int8) {
                        s += vk.dot_q8_0(row, xq.data(), n);
                    } else {
                        vk.dotx4_q8_0_f32(row, x.data(), size_t(n), n, out);
                        s += out[0] + out[3];
                    }
                }
            }
            sink = sink + s;
        });
        return double(n) * rows * iters * n_threads * (int8 ? 1 : 4) / seconds_since(t0);
    };
    dot_peak p{run(false), run(true)};
    return p;
}

} // namespace colibri
