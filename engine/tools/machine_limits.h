#pragma once
// Measured limits of this machine, for the roofline in colibri-bench.

#include "format/format.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace colibri {

struct kernel_table;
class thread_pool;

/// A processor's identity from CPUID leaf 1's EAX (family and model with their extended
/// fields, as the vendors define them).
struct cpu_signature {
    unsigned family, model, stepping;
};
cpu_signature decode_cpu_signature(unsigned eax);
/// The core generation of an AMD family and model ("Zen 4"; each has its own 512-bit
/// datapath: Zen 4 runs a 512-bit operation as two 256-bit halves, Zen 5 at once), or "".
std::string amd_core_name(unsigned family, unsigned model);
/// This CPU as a benchmark reports it: "AMD EPYC (family 25, model 17, stepping 1: Zen 4)".
/// The hosts a figure was measured on differ in what their vector units do per cycle.
std::string cpu_description();

/// The memory read bandwidth: n_threads read disjoint parts of a buffer of `bytes` (far
/// larger than the caches), each in 1 MiB chunks of four, two or eight streams side by side
/// (pass after pass in turn). The buffer is in 2 MiB pages where the kernel gives them (they
/// read faster than 4 KiB ones). Its buffer and threads are kept between measurements, to be
/// taken often (colibri-bench measures it between every few decoded tokens); the buffer
/// stays resident.
class read_probe {
public:
    read_probe(int n_threads, size_t bytes, const kernel_table& kt);
    ~read_probe();
    read_probe(const read_probe&) = delete;
    read_probe& operator=(const read_probe&) = delete;

    /// Bytes/s, the best of `passes` reads of the whole buffer.
    double measure(int passes);
    size_t bytes() const { return bytes_; }

private:
    const kernel_table& kt_;
    size_t bytes_;
    void* map_ = nullptr; // the mapping behind buf_
    size_t map_bytes_ = 0;
    uint8_t* buf_ = nullptr;
    std::unique_ptr<thread_pool> pool_;
};

/// Multiply-adds per second, all threads: the machine's int8 peak (the integer dot-product
/// instructions on registers), and the prefill kernels of `weights` (q8_0, q4_0, a K-quant,
/// q4_0x8 or q8_0x8; q8_0 for unquantised weights) on cache-resident data with f32 and with
/// int8 activations (four tokens by eight rows; for the interleaved types the tokens and
/// groups a prefill call takes).
struct dot_peak {
    double machine_int8;
    double f32_act;
    double int8_act;
};
dot_peak measure_dot_peak(int n_threads, const kernel_table& kt, format::dtype weights = format::dtype::q8_0);

} // namespace colibri
