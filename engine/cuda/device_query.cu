#include "cuda/device_query.h"

#if defined(COLIBRI_CUDA_EMULATED) // the tests' CPU emulation (tests/engine/cuda_emulation.h)
#include "cuda_emulation.h"
#else
#include <cuda_runtime.h>
#endif

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
