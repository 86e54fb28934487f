#pragma once
// Measured limits of this machine, for the roofline in colibri-bench.

#include <cstddef>

namespace colibri {

struct vec_kernels;

/// Memory read bandwidth in bytes/s: n_threads read disjoint parts of a buffer of `bytes`
/// (far larger than the caches); best of `repeats`.
double measure_read_bandwidth(int n_threads, size_t bytes, int repeats, const vec_kernels& vk);

/// Multiply-adds per second of the q8_0 row kernels on cache-resident data, all threads:
/// {f32 activations (the four-token prefill kernel), int8 activations}.
struct dot_peak {
    double f32_act;
    double int8_act;
};
dot_peak measure_dot_peak(int n_threads, const vec_kernels& vk);

} // namespace colibri
