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
    : n_threads_(std::max(1, n_threads)), parts_(std::make_unique<part_range[]>(size_t(n_threads_))) {
    threads_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

thread_pool::~thread_pool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_acq_rel);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
}

void thread_pool::dispatch(job_fn fn, void* ctx) {
    if (n_threads_ == 1) {
        fn(ctx, 0, 1);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fn_ = fn;
        ctx_ = ctx;
        pending_.store(n_threads_ - 1, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_acq_rel);
    }
    wake_.notify_all();
    fn(ctx, 0, n_threads_);
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
        if (spin < wait_spins) COLIBRI_PAUSE();
        else std::this_thread::yield();
    }
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
        uint64_t gen = generation_.load(std::memory_order_acquire);
        for (int spin = 0; gen == seen && spin < spin_iterations; ++spin) {
            COLIBRI_PAUSE();
            gen = generation_.load(std::memory_order_acquire);
        }
        if (gen == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
            gen = generation_.load(std::memory_order_acquire);
        }
        seen = gen;
        if (stop_.load(std::memory_order_acquire)) return;
        job_fn fn;
        void* ctx;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            fn = fn_;
            ctx = ctx_;
        }
        fn(ctx, ith, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

} // namespace colibri
