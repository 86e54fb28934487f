// The CUDA backend's construction, its factory and its profile. The class is in
// cuda_backend_impl.cuh; its operations live with their kernels, one file per kind:
// cuda_buffers.cu, cuda_matmul.cu, cuda_norms.cu, cuda_elementwise.cu, cuda_attention.cu,
// cuda_moe.cu, with the expert cache (cuda_expert_cache.cu) and the decode steps' CUDA
// graphs (cuda_step_graphs.cu) apart.
//
// Weights are repacked on the host (device_weights.h) and copied to the device when an
// operation first uses them, or, under a weight budget, routed experts into per-layer
// slots when a token needs them. Each kernel is checked against the CPU backend by the
// `gpu` tests (tests/engine/test_cuda_*.cpp, also run on a CPU emulation of CUDA).
// Host arrays an operation takes (positions, token rows, expert weights) are copied to the
// device with it, in stream order. A session's decode steps run as a CUDA graph.

#include "cuda/cuda_backend_impl.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace colibri {
namespace cuda_detail {

void require_device(int device) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        throw error(errc::unsupported, "device cuda:" + std::to_string(device) + ": " + cudaGetErrorString(e));
    if (device < 0 || device >= count) {
        throw error(errc::unsupported, "device cuda:" + std::to_string(device) + ": " +
                                           (count == 0 ? std::string("no CUDA GPU is present")
                                                       : "only " + std::to_string(count) + " CUDA device(s) present"));
    }
}

cuda_backend::cuda_backend(const cuda_options& o) : device_(o.device) {
    COLIBRI_CUDA(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    COLIBRI_CUDA(cudaGetDeviceProperties(&prop, device_));
    name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
    stream_ = make_stream();
    if (o.weight_budget > 0) expert_cache_.plan(o);
    const char* profile = std::getenv("COLIBRI_CUDA_PROFILE");
    profiling_ = profile != nullptr && *profile != '\0' && std::strcmp(profile, "0") != 0;
}

// The events, graphs, device memory and at last the stream go with the members.
cuda_backend::~cuda_backend() { cudaStreamSynchronize(stream_.get()); }

std::string cuda_backend::profile_report() {
    char line[200];
    std::snprintf(line, sizeof line, "one-token steps: %llu replayed from %llu recordings, %llu not recordable%s%s\n",
                  static_cast<unsigned long long>(steps_replayed_), static_cast<unsigned long long>(steps_recorded_),
                  static_cast<unsigned long long>(steps_not_recorded_), capture_failure_ != nullptr ? ": " : "",
                  capture_failure_ != nullptr ? capture_failure_ : "");
    std::string steps = line;
    if (!profiling_) return steps;
    resolve_timings();
    std::vector<std::pair<std::string, op_total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double all = 0;
    for (const auto& r : rows) all += r.second.ms;
    std::string out = steps + "device time by operation (graphs off while profiling):\n";
    for (const auto& [name, t] : rows) {
        std::snprintf(line, sizeof line, "  %-24s %9llu calls %10.3f ms %9.2f us each %5.1f%%\n", name.c_str(),
                      static_cast<unsigned long long>(t.calls), t.ms,
                      1000.0 * t.ms / double(std::max<uint64_t>(t.calls, 1)), all > 0 ? 100.0 * t.ms / all : 0.0);
        out += line;
    }
    return out;
}

void cuda_backend::resolve_timings() {
    cudaStreamSynchronize(stream_.get());
    for (const timing& t : pending_) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, t.start.get(), t.stop.get()) == cudaSuccess) {
            op_total& total = totals_[t.name];
            ++total.calls;
            total.ms += ms;
        }
    }
    pending_.clear(); // destroys the events
}

} // namespace cuda_detail

std::unique_ptr<backend> make_cuda_backend(const cuda_options& options) {
    cuda_detail::require_device(options.device);
    return std::make_unique<cuda_detail::cuda_backend>(options);
}

std::string cuda_profile_report(backend& be) {
    auto* c = dynamic_cast<cuda_detail::cuda_backend*>(&be);
    return c != nullptr ? c->profile_report() : std::string();
}

} // namespace colibri
