#pragma once
// A fixed pool of worker threads for data-parallel kernels. One job at a time: run()
// hands a function to every thread (the caller takes part as thread 0) and returns when
// all are done. Dispatch neither allocates nor throws.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace colibri {

class thread_pool {
public:
    explicit thread_pool(int n_threads);
    ~thread_pool();
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    int size() const { return n_threads_; }

    /// Calls f(ith, nth) on every thread, ith in [0, nth).
    template <class F>
    void run(F&& f) {
        auto thunk = [](void* ctx, int ith, int nth) { (*static_cast<std::remove_reference_t<F>*>(ctx))(ith, nth); };
        dispatch(thunk, &f);
    }

    /// Splits [0, n) for threads that may run at different speeds (rows read from memory
    /// that the threads share unevenly): each thread first takes an equal contiguous share
    /// of three quarters of the range (long sequential walks), then the rest is handed out
    /// in chunks of `grain` to whichever thread asks next, so that none waits long for the
    /// others at the end. f(begin, end); a pool of one thread gets [0, n) in one call.
    template <class F>
    void parallel_balanced(int64_t n, int64_t grain, F&& f) {
        if (n <= 0) return;
        grain = std::max<int64_t>(grain, 1);
        if (n_threads_ == 1 || n <= grain) {
            f(int64_t(0), n);
            return;
        }
        const int64_t share = n * 3 / 4 / n_threads_ / grain * grain; // whole chunks
        const int64_t tail = share * n_threads_;
        next_.store(tail, std::memory_order_relaxed); // published by the dispatch
        run([&](int ith, int) {
            if (share > 0) f(share * ith, share * (ith + 1));
            for (int64_t begin; (begin = next_.fetch_add(grain, std::memory_order_relaxed)) < n;) {
                f(begin, std::min(n, begin + grain));
            }
        });
    }

private:
    using job_fn = void (*)(void*, int, int);
    void dispatch(job_fn fn, void* ctx);
    void worker(int ith);

    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    job_fn fn_ = nullptr;
    void* ctx_ = nullptr;
    alignas(64) std::atomic<int64_t> next_{0}; // parallel_balanced: the first item not handed out
};

} // namespace colibri
