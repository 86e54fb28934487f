#include "cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define COLIBRI_PAUSE() _mm_pause()
#else
#define COLIBRI_PAUSE() ((void)0)
#endif

namespace colibri {

namespace {
// Spins before sleeping: a decode step dispatches hundreds of short jobs back to back.
// Past the spin, waiters yield or sleep so that a busy machine (where a worker may not be
// running at all) does not lose whole time slices to spinning.
constexpr int spin_iterations = 4000;
constexpr int wait_spins = 2000;
} // namespace

thread_pool::thread_pool(int n_threads)
    : n_threads_(std::max(1, n_threads)), done_(std::make_unique<done_line[]>(size_t(n_threads_))),
      parts_(std::make_unique<part_range[]>(size_t(n_threads_))) {
    threads_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

thread_pool::~thread_pool() {
    stop_.store(true, std::memory_order_release);
    job_.generation.fetch_add(1, std::memory_order_seq_cst);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }
    for (auto& t : threads_) t.join();
}

void thread_pool::dispatch(job_fn fn, void* ctx) {
    if (n_threads_ == 1) {
        fn(ctx, 0, 1);
        return;
    }
    // every worker finished the last job before the last dispatch returned: none reads these
    job_.fn = fn;
    job_.ctx = ctx;
    const uint64_t gen = job_.generation.load(std::memory_order_relaxed) + 1;
    job_.generation.store(gen, std::memory_order_seq_cst);
    // a worker going to sleep counts itself before it looks at the generation, and this
    // looks at the count after publishing it: one of the two sees the other (both seq_cst)
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }
    fn(ctx, 0, n_threads_);
    for (int i = 1; i < n_threads_; ++i) {
        for (int spin = 0; done_[size_t(i)].generation.load(std::memory_order_acquire) != gen; ++spin) pause(spin);
    }
}

void thread_pool::pause(int spin) {
    if (spin < wait_spins) COLIBRI_PAUSE();
    else std::this_thread::yield();
}

bool thread_pool::take_half(int ith, int nth) {
    for (int k = 1; k < nth; ++k) {
        std::atomic<uint64_t>& other = parts_[size_t((ith + k) % nth)].range;
        uint64_t r = other.load(std::memory_order_acquire);
        const int64_t begin = int64_t(r >> 24 & 0xFFFFFF), end = int64_t(r & 0xFFFFFF);
        if (end - begin < 2) continue;
        const int p = int(r >> 48);
        const int64_t mid = begin + (end - begin) / 2;
        if (other.compare_exchange_strong(r, pack(p, begin, mid), std::memory_order_acq_rel)) {
            parts_[size_t(ith)].range.store(pack(p, mid, end), std::memory_order_release);
            return true;
        }
        --k; // it changed under us: look at the same thread again
    }
    return false;
}

void thread_pool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = job_.generation.load(std::memory_order_acquire);
        for (int spin = 0; gen == seen && spin < spin_iterations; ++spin) {
            COLIBRI_PAUSE();
            gen = job_.generation.load(std::memory_order_acquire);
        }
        if (gen == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            sleepers_.fetch_add(1, std::memory_order_seq_cst);
            wake_.wait(lock, [&] { return job_.generation.load(std::memory_order_seq_cst) != seen; });
            sleepers_.fetch_sub(1, std::memory_order_relaxed);
            gen = job_.generation.load(std::memory_order_acquire);
        }
        seen = gen;
        if (stop_.load(std::memory_order_acquire)) return;
        job_.fn(job_.ctx, ith, n_threads_);
        done_[size_t(ith)].generation.store(gen, std::memory_order_release);
    }
}

} // namespace colibri
