#include "cuda/device_query.h"

namespace colibri {

int cuda_device_count(std::string& why) {
    why = "this build has no CUDA backend (configured without nvcc)";
    return -1;
}

} // namespace colibri
