#include "cuda/device_query.h"

#include <cuda_runtime.h>

namespace colibri {

int cuda_device_count(std::string& why) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        why = cudaGetErrorString(err);
        return 0;
    }
    return count;
}

} // namespace colibri
