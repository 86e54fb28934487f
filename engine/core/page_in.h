#pragma once
// Maps a read-only file mapping's pages into the process on a background thread, so that
// the first request after a model loads does not pay for its page faults (this walk over a
// 727 MB model: 5 ms in 2 MiB pages, 55-65 ms in 4 KiB pages, 0.35-0.42 s when the pages
// had to come from disk).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace colibri {

class page_in {
public:
    enum class method {
        populate, ///< madvise(MADV_POPULATE_READ), Linux 5.14 and later; else touch
        touch,    ///< a read of one byte per page
    };

    /// Starts walking [data, data + size) on a thread of the lowest priority, a few
    /// megabytes at a time. Errors end the walk quietly: it is only ahead of the reads the
    /// model's own use makes.
    page_in(const void* data, size_t size, method how = method::populate);
    /// Stops the walk at its next step and waits for the thread.
    ~page_in();
    page_in(const page_in&) = delete;
    page_in& operator=(const page_in&) = delete;

    /// Waits until the walk has ended.
    void wait();
    /// Whether the walk has ended; then its time (milliseconds) and the bytes it covered.
    bool done() const { return done_.load(std::memory_order_acquire); }
    double elapsed_ms() const { return elapsed_ms_; }
    size_t bytes() const { return bytes_; }

private:
    void walk(method how);

    const unsigned char* data_;
    size_t size_;
    std::atomic<bool> stop_{false};
    std::atomic<bool> done_{false};
    double elapsed_ms_ = 0; // written before done_
    size_t bytes_ = 0;      // written before done_
    std::thread thread_;
};

/// MemAvailable of /proc/meminfo in bytes (memory the kernel can hand out without swapping,
/// reclaimable page cache included); 0 when unknown.
uint64_t available_memory();

} // namespace colibri
