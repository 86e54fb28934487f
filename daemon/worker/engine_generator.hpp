#pragma once
/// The generator backed by the engine C API (include/colibri.h): one model and one
/// session, loaded once and kept warm for every job.

#include <memory>

#include "worker_loop.hpp"

namespace colibri::worker {

/// Loads the model; throws std::runtime_error with the engine's message on failure.
std::unique_ptr<generator> make_engine_generator(const worker_options& opts);

} // namespace colibri::worker
