#pragma once
// The device's memory read bandwidth, colibri-bench's ceiling for decode on a GPU.

#include <cstddef>

namespace colibri {

/// The device's memory read bandwidth in bytes/s: every thread of a full grid reads 16 bytes
/// at a time through a buffer of `bytes` in device memory, best of `passes`. Throws
/// colibri::error: unsupported when this build has no CUDA or the device cannot be used.
double measure_device_read_bandwidth(int device, size_t bytes, int passes);

} // namespace colibri
