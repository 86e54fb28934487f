#pragma once
// The CPU backend's buffers.

#include "core/error.h"
#include "ops/backend.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace colibri {

// Anonymous mappings: zero pages that cost memory only once touched (a long KV cache
// holds no RSS for positions never reached).
class host_buffer final : public device_buffer {
public:
    explicit host_buffer(size_t n) : n_(n), bytes_(std::max<size_t>(n * sizeof(float), 1)) {
        if (n > SIZE_MAX / (2 * sizeof(float))) throw error(errc::out_of_memory, "buffer size overflows");
        void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            throw error(errc::out_of_memory, "cannot allocate " + std::to_string(bytes_ >> 20) + " MiB of buffers");
        }
        data_ = static_cast<float*>(p);
    }
    ~host_buffer() override { ::munmap(data_, bytes_); }
    float* data() override { return data_; }
    size_t size() const override { return n_; }
    void discard(size_t first, size_t count) override {
        // Whole pages inside the range only; they come back as zero pages when touched.
        static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
        const auto begin = reinterpret_cast<uintptr_t>(data_ + std::min(first, n_));
        const auto end = reinterpret_cast<uintptr_t>(data_ + std::min(first + count, n_));
        const uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;
        if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
    }

private:
    float* data_ = nullptr;
    size_t n_;
    size_t bytes_;
};

} // namespace colibri
