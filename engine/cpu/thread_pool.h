#pragma once
// A fixed pool of worker threads for data-parallel kernels. One job at a time: run()
// hands a function to every thread (the caller takes part as thread 0) and returns when
// all are done. Dispatch neither allocates nor throws.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
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

    /// Work in parts, each a range of steps [0, steps(p)) that f(p, k0, k1) runs in
    /// order: one part on the calling thread (serial), else one per thread. Each thread
    /// walks its own part from the start, a few steps per call; a thread out of steps takes
    /// the second half of what another has left (its own range from then on, which others
    /// may take from in turn). The threads finish within a few steps of one another, and
    /// each part is still walked in long runs (for streams of memory that start cold).
    /// Steps per part: fewer than 2^24.
    template <class S, class F>
    void parallel_parts(bool serial, S&& steps, F&& f) {
        if (serial || n_threads_ == 1) {
            f(0, int64_t(0), static_cast<int64_t>(steps(0)));
            return;
        }
        for (int p = 0; p < n_threads_; ++p)
            parts_[size_t(p)].range.store(pack(p, 0, steps(p)), std::memory_order_relaxed);
        run([&](int ith, int nth) { walk_parts(ith, nth, f, false); }); // the dispatch publishes the ranges
    }

    /// parallel_parts after a prologue that is each thread's own: thread ith runs
    /// prologue(ith), then walks part ith; a thread out of steps takes halves of the others'
    /// parts, and waits for a thread still in its prologue rather than leave it its whole
    /// part (a decode's feed-forwards: each thread's experts' gate and up products and
    /// activations, then their down products, which any thread may run). One thread:
    /// prologue(0), then part 0 in one call.
    template <class P, class S, class F>
    void parallel_parts_after(P&& prologue, S&& steps, F&& f) {
        if (n_threads_ == 1) {
            prologue(0);
            f(0, int64_t(0), static_cast<int64_t>(steps(0)));
            return;
        }
        for (int p = 0; p < n_threads_; ++p) parts_[size_t(p)].range.store(pack(p, 0, 0), std::memory_order_relaxed);
        published_.store(0, std::memory_order_relaxed);
        run([&](int ith, int nth) {
            prologue(ith);
            parts_[size_t(ith)].range.store(pack(ith, 0, steps(ith)), std::memory_order_release);
            published_.fetch_add(1, std::memory_order_acq_rel);
            walk_parts(ith, nth, f, true);
        });
    }

private:
    // A thread's walk of the parts: its own range a few steps per claim, then halves taken
    // from the others; with wait_published, until every part was published.
    template <class F>
    void walk_parts(int ith, int nth, F& f, bool wait_published) {
        std::atomic<uint64_t>& own = parts_[size_t(ith)].range;
        for (int spin = 0;;) {
            uint64_t r = own.load(std::memory_order_acquire);
            const int64_t begin = int64_t(r >> 24 & 0xFFFFFF), end = int64_t(r & 0xFFFFFF);
            if (begin < end) {
                const int64_t n = std::clamp<int64_t>((end - begin) / 8, 1, 4);
                if (own.compare_exchange_weak(r, pack(int(r >> 48), begin + n, end), std::memory_order_acq_rel)) {
                    f(int(r >> 48), begin, begin + n);
                }
                continue;
            }
            // read before looking at the others, so that a part published after the look
            // is not missed
            const bool all_published = !wait_published || published_.load(std::memory_order_acquire) == nth;
            if (take_half(ith, nth)) continue;
            if (all_published) return;
            pause(spin++); // a part not yet published: its thread is in its prologue
        }
    }
    static void pause(int spin); // a short pause, a yield after a while
    using job_fn = void (*)(void*, int, int);
    // parallel_parts: part p's steps [begin, end) in one word
    static uint64_t pack(int p, int64_t begin, int64_t end) {
        return uint64_t(p) << 48 | uint64_t(begin) << 24 | uint64_t(end);
    }
    bool take_half(int ith, int nth);
    void dispatch(job_fn fn, void* ctx);
    void worker(int ith);

    int n_threads_;
    std::vector<std::thread> threads_;
    // The job, published by its generation: one cache line, so a worker that sees the new
    // generation reads the function in the same transfer (on a host whose two cores are far
    // apart, each line crossing between them costs a fraction of a microsecond).
    struct alignas(64) job_line {
        std::atomic<uint64_t> generation{0};
        job_fn fn = nullptr;
        void* ctx = nullptr;
    } job_;
    struct alignas(64) done_line {
        std::atomic<uint64_t> generation{0}; // the last generation the worker finished
    };
    std::unique_ptr<done_line[]> done_; // per worker, each on its own line
    // sleeping workers only (past their spin)
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    alignas(64) std::atomic<int64_t> next_{0}; // parallel_balanced: the first item not handed out
    struct alignas(64) part_range {
        std::atomic<uint64_t> range{0};
    };
    std::unique_ptr<part_range[]> parts_;       // parallel_parts: each thread's range of steps
    alignas(64) std::atomic<int> published_{0}; // parallel_parts_after: parts published
};

} // namespace colibri
