#include "tools/machine_limits.h"

#include "cpu/kernel_table.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "format/row_codec.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <sys/mman.h>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace colibri {

namespace {
using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}
constexpr size_t probe_chunk = size_t(1) << 20;
} // namespace

cpu_signature decode_cpu_signature(unsigned eax) {
    const unsigned base_family = (eax >> 8) & 0xF, base_model = (eax >> 4) & 0xF;
    cpu_signature s{base_family, base_model, eax & 0xF};
    if (base_family == 0xF) s.family += (eax >> 20) & 0xFF;
    if (base_family == 0xF || base_family == 0x6) s.model += ((eax >> 16) & 0xF) << 4;
    return s;
}

std::string amd_core_name(unsigned family, unsigned model) {
    const auto in = [&](unsigned lo, unsigned hi) { return model >= lo && model <= hi; };
    switch (family) {
    case 0x17: return model < 0x30 ? "Zen" : "Zen 2";
    case 0x19: return in(0x10, 0x1F) || in(0x60, 0x7F) || in(0xA0, 0xAF) ? "Zen 4" : "Zen 3";
    case 0x1A: return "Zen 5";
    default: return "";
    }
}

std::string cpu_description() {
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return "an x86-64 CPU";
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    std::string brand;
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) != 0 && a >= 0x80000004) {
        char text[49] = {};
        for (unsigned i = 0; i < 3; ++i) {
            unsigned r[4] = {};
            __get_cpuid(0x80000002 + i, &r[0], &r[1], &r[2], &r[3]);
            std::memcpy(text + 16 * i, r, 16);
        }
        brand = text;
        brand.erase(0, brand.find_first_not_of(' '));
        brand.erase(brand.find_last_not_of(' ') + 1);
    }
    if (brand.empty()) brand = vendor;
    __get_cpuid(1, &a, &b, &c, &d);
    const cpu_signature s = decode_cpu_signature(a);
    const std::string core = std::string(vendor) == "AuthenticAMD" ? amd_core_name(s.family, s.model) : "";
    return brand + " (family " + std::to_string(s.family) + ", model " + std::to_string(s.model) + ", stepping " +
           std::to_string(s.stepping) + (core.empty() ? "" : ": " + core) + ")";
#else
    return "a CPU without CPUID";
#endif
}

read_probe::read_probe(int n_threads, size_t bytes, const kernel_table& kt)
    : kt_(kt), bytes_(0), pool_(std::make_unique<thread_pool>(n_threads)) {
    // Each thread reads its part in chunks of 1 MiB, each chunk as a few streams side by
    // side (measure): streams close together read faster here than streams far apart (the
    // kernels read one matrix at a time the same way).
    const size_t parts = size_t(pool_->size());
    bytes = std::max<size_t>(bytes / (probe_chunk * parts), 1) * probe_chunk * parts;
    // 2 MiB pages, asked for on a 2 MiB boundary: on the Zen 5 host two threads read 1.02x
    // more through them than through 4 KiB pages when the host's bandwidth was below 50 GB/s
    // and 1.05x above 60 GB/s (medians of 1,200 alternations), so without them the probe
    // under-read the machine. The model's weights get them from the page cache (the
    // converter writes its files for that, model_writer).
    constexpr size_t huge = size_t(2) << 20;
    map_bytes_ = bytes + huge;
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        return;
    }
    buf_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(map_) + huge - 1) & ~uintptr_t(huge - 1));
    ::madvise(buf_, bytes, MADV_HUGEPAGE); // a hint: 4 KiB pages where it is refused
    bytes_ = bytes;
    const size_t part = bytes / parts;
    // first touch by the thread that will read it (NUMA placement), and no zero-page tricks
    pool_->run([&](int ith, int) { std::memset(buf_ + part * size_t(ith), ith + 1, part); });
}

read_probe::~read_probe() {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

double read_probe::measure(int passes) {
    if (bytes_ == 0) return 0;
    const size_t part = bytes_ / size_t(pool_->size());
    std::atomic<uint64_t> sink{0};
    double best = 0;
    for (int r = 0; r < passes; ++r) {
        // Passes in turn read each chunk as four, two and eight streams: which reads fastest
        // depends on the machine and its moment. On the Zen 5 host, two threads, against
        // eight streams (what the probe read until then), medians of 200-500 alternations:
        // four 1.073x and two 1.053x when the host's bandwidth was high (above 55 GB/s),
        // 1.020x and 1.023x when it was lower; one 1.03x and 1.00x.
        static constexpr int streams[] = {4, 2, 8};
        const int n_streams = streams[r % 3];
        const auto t0 = clock_type::now();
        pool_->run([&](int ith, int) {
            uint64_t s = 0;
            for (size_t off = 0; off < part; off += probe_chunk) {
                s += kt_.read_sum(buf_ + part * size_t(ith) + off, probe_chunk, n_streams);
            }
            sink += s;
        });
        best = std::max(best, double(bytes_) / seconds_since(t0));
    }
    return sink.load() == 42 ? best + 1e-9 : best; // keep the sums alive
}

dot_peak measure_dot_peak(int n_threads, const kernel_table& kt, format::dtype weights) {
    if (!format::is_quantized(weights)) weights = format::dtype::q8_0; // f32/f16/bf16 models: the q8_0 kernels
    const int64_t n = 4096, rows = 8, iters = 1000;                    // 8 rows of 4096: 34 KiB per thread at q8_0
    thread_pool pool(n_threads);
    // activation vectors: the prefill kernels' batch, four (eight for the interleaved types)
    std::vector<float> x(size_t(x8_prefill_tokens * n));
    for (int64_t i = 0; i < x8_prefill_tokens * n; ++i) x[size_t(i)] = float(i % 7) - 3.0f;
    const format::dtype row_type = format::row_type(weights); // q4_0x8 rows are q4_0 rows, q8_0x8 q8_0
    const bool q8 = row_type == format::dtype::q8_0, x8 = format::is_interleaved(weights);
    const bool k_quant = format::is_k_quant(row_type) || format::is_read_only(row_type); // kernels::dot_row
    const size_t rb = format::row_bytes(row_type, n);
    std::vector<uint8_t> w(size_t(rows) * rb);
    for (int64_t r = 0; r < rows; ++r) {
        if (format::is_read_only(row_type))
            std::memset(w.data() + size_t(r) * rb, 0x11, rb); // no quantiser: any blocks
        else format::row_from_f32(row_type, x.data(), w.data() + size_t(r) * rb, n);
    }
    std::vector<uint8_t> groups(x8 ? w.size() : 0);
    if (x8) format::interleave_x8(weights, w.data(), uint64_t(rows), uint64_t(n), groups.data());
    const auto tile_x8 = x8 ? int8_x8_kernels(kt, weights).tile : nullptr;
    const auto dotx4 = q8 ? kt.dotx4_q8_0_f32 : kt.dotx4_q4_0_f32;
    const auto tile = int8_tile(kt, row_type);
    std::vector<block_q8_x> xq(size_t(x8_prefill_tokens * n / format::qk));
    (superblock_activations(weights) ? kt.quantize_x_k : kt.quantize_x)(x.data(), xq.data(), x8_prefill_tokens * n);
    std::atomic<uint64_t> sink{0};
    // best of three: this machine is shared
    auto best_of = [&](auto&& body, double macs_per_thread) {
        double best = 0;
        for (int rep = 0; rep < 3; ++rep) {
            const auto t0 = clock_type::now();
            pool.run([&](int, int) { sink += body(); });
            best = std::max(best, macs_per_thread * n_threads / seconds_since(t0));
        }
        return best;
    };
    dot_peak p{};
    const int64_t loops = 8000000; // a few ms per pass
    p.machine_int8 = best_of([&] { return kt.madd_loop(loops); }, double(loops) * 256);
    p.f32_act = best_of(
        [&] {
            float s = 0, out[4];
            for (int64_t it = 0; it < iters; ++it) {
                for (int64_t r = 0; r < rows; ++r) {
                    if (k_quant) { // the backend's K-quant rows with f32 activations: kernels::dot_row
                        for (int t = 0; t < 4; ++t)
                            out[t] = kernels::dot_row(row_type, w.data() + size_t(r) * rb, x.data() + t * n, n);
                    } else {
                        dotx4(w.data() + size_t(r) * rb, x.data(), size_t(n), n, out);
                    }
                    s += out[0] + out[3];
                }
            }
            return uint64_t(s);
        },
        double(n) * rows * iters * 4);
    p.int8_act = best_of(
        [&] {
            float s = 0, out[x8_prefill_tokens * 8 * x8_prefill_groups];
            for (int64_t it = 0; it < iters; ++it) {
                if (x8) { // the one group again, as many times as prefill passes groups
                    tile_x8(groups.data(), 0, x8_prefill_groups, xq.data(), size_t(n / format::qk), x8_prefill_tokens,
                            n, false, out);
                    s += out[0] + out[std::size(out) - 1];
                    continue;
                }
                for (int64_t r = 0; r < rows; r += 4) {
                    tile(w.data() + size_t(r) * rb, rb, xq.data(), size_t(n / format::qk), 4, n, out);
                    s += out[0] + out[15];
                }
            }
            return uint64_t(s);
        },
        double(n) * rows * iters * (x8 ? x8_prefill_tokens * x8_prefill_groups : 4));
    return p;
}

} // namespace colibri
