#pragma once
// A model ready to run: the validated file, its backend and its tokenizer.

#include "core/page_in.h"
#include "model/model.h"
#include "ops/backend.h"
#include "tokenizer/tokenizer.h"

#include <memory>
#include <string>

namespace colibri {

struct device_spec {
    enum class kind { cpu, cuda } type = kind::cpu;
    int index = 0;
};

/// Parses "cpu" or "cuda:N"; throws colibri::error (invalid_argument) otherwise.
device_spec parse_device(const std::string& text);

/// parse_device, then for a CUDA device whether it can be used: throws colibri::error
/// (unsupported) with the reason (no CUDA in this build, no GPU, no such device).
device_spec usable_device(const std::string& text);

struct runtime {
    std::unique_ptr<model> mdl;
    std::unique_ptr<backend> be;
    std::unique_ptr<tokenizer> tok;
    std::string device; ///< "cpu" or "cuda:N"
    /// The weights' pages mapped in on a background thread (start_page_in); stopped and
    /// joined first when the runtime goes (the last member).
    std::unique_ptr<page_in> paging;
};

/// Starts mapping the model file's pages into the process on a background thread of the
/// lowest priority, so that the first request does not pay for the page faults (a server
/// that loads a model, then waits for requests). Not when the file is larger than
/// `available` bytes of memory (0: unknown, no limit): it would push out the rest of the
/// page cache, then its own first pages. Returns whether it started.
bool start_page_in(runtime& rt, uint64_t available = available_memory());

/// Loads and validates `path` for `device` with n_threads (0: the CPUs this process may use).
/// f32_activations keeps activations in f32 for q8_0/q4_0 weights (slower, see cpu_options).
/// Throws colibri::error; a CUDA device is refused with the reason (no CUDA in this build,
/// no GPU present). On a CUDA device n_threads and f32_activations do not apply (the
/// device computes with f32 activations), and device_weight_budget (bytes, 0: no limit)
/// bounds the device memory its weights take: the routed experts that do not fit are
/// copied in when used (cuda_options::weight_budget).
std::unique_ptr<runtime> load_runtime(const std::string& path, const std::string& device, int n_threads,
                                      bool f32_activations = false, size_t device_weight_budget = 0);

} // namespace colibri
