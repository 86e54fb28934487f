// Builds without CUDA: the factory and the bandwidth probe say so.

#include "cuda/bandwidth_probe.h"
#include "cuda/cuda_backend.h"

#include "core/error.h"

namespace colibri {

std::unique_ptr<backend> make_cuda_backend(const cuda_options& options) {
    throw error(errc::unsupported,
                "device cuda:" + std::to_string(options.device) + ": this build has no CUDA support");
}

std::string cuda_profile_report(backend&) { return {}; }

double measure_device_read_bandwidth(int device, size_t, int) {
    throw error(errc::unsupported, "device cuda:" + std::to_string(device) + ": this build has no CUDA support");
}

} // namespace colibri
