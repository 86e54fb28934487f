#include "core/page_in.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

namespace colibri {

namespace {
// A step of the walk: small enough for a stop to be prompt, large enough that the calls
// cost nothing against the faults.
constexpr size_t step_bytes = size_t(8) << 20;
} // namespace

page_in::page_in(const void* data, size_t size, method how)
    : data_(static_cast<const unsigned char*>(data)), size_(size), thread_([this, how] { walk(how); }) {}

page_in::~page_in() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
}

void page_in::wait() {
    if (thread_.joinable()) thread_.join();
}

void page_in::walk(method how) {
    const auto t0 = std::chrono::steady_clock::now();
    // nice 19 for this thread alone (Linux: a thread id names one thread): the engine's own
    // threads come first
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    // madvise wants a page-aligned start
    const auto first = reinterpret_cast<uintptr_t>(data_) / page * page;
    const auto end = reinterpret_cast<uintptr_t>(data_) + size_;
    size_t covered = 0;
    for (uintptr_t at = first; at < end && !stop_.load(std::memory_order_relaxed);) {
        const size_t n = std::min<size_t>(step_bytes, end - at);
        if (how == method::populate) {
            if (::madvise(reinterpret_cast<void*>(at), n, MADV_POPULATE_READ) != 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                if (errno != EINVAL || at != first) break; // a kernel without it says EINVAL at once
                how = method::touch;
                continue;
            }
        } else {
            unsigned sum = 0;
            for (size_t off = 0; off < n; off += page)
                sum += *reinterpret_cast<const volatile unsigned char*>(at + off);
            (void)sum;
        }
        covered += n;
        at += n;
    }
    bytes_ = std::min(covered, size_);
    elapsed_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    done_.store(true, std::memory_order_release);
}

uint64_t available_memory() {
    std::ifstream f("/proc/meminfo");
    for (std::string key; f >> key;) {
        uint64_t kib = 0;
        if (key == "MemAvailable:" && f >> kib) return kib << 10;
        f.ignore(1 << 10, '\n');
    }
    return 0;
}

} // namespace colibri
