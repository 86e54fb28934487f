#pragma once
// Whether CUDA devices can be used, without any CUDA header in the caller.

#include <string>

namespace colibri {

/// Number of CUDA devices; -1 when this build has no CUDA support. `why` explains a
/// count of 0 or -1 (driver missing, no device, ...).
int cuda_device_count(std::string& why);

} // namespace colibri
