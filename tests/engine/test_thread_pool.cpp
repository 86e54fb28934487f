// The thread pool's splits: every item and step exactly once, whatever the threads do.

#include "kernel_test_util.h"

namespace {

// A part whose first call waits (at most 10 s) until another thread has run one of its
// steps, however long the machine's load keeps that thread off; nobody else to wait for
// with one thread or one part.
struct slow_first_call {
    std::atomic<bool> taken{false};
    void step(int64_t k0, bool others_can_take) {
        if (k0 > 0) taken.store(true);
        if (k0 > 0 || !others_can_take) return;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!taken.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
};

} // namespace

TEST_CASE("thread pool balanced split hands out every item exactly once") {
    for (int threads : {1, 2, 3}) {
        thread_pool pool(threads);
        for (int64_t n : {0, 1, 5, 1000, 4099}) {
            for (int64_t grain : {0, 1, 3, 64, 5000}) {
                CAPTURE(threads);
                CAPTURE(n);
                CAPTURE(grain);
                std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
                std::atomic<int> calls{0}, empty{0};
                std::atomic<int64_t> small{0};                               // items in calls of at most grain items
                pool.parallel_balanced(n, grain, [&](int64_t b, int64_t e) { // runs on the pool's threads
                    if (b >= e) empty.fetch_add(1);
                    if (e - b <= std::max<int64_t>(grain, 1)) small.fetch_add(e - b);
                    for (int64_t i = b; i < e; ++i) seen[size_t(i)].fetch_add(1);
                    calls.fetch_add(1);
                });
                CHECK(empty.load() == 0);
                for (int64_t i = 0; i < n; ++i) REQUIRE(seen[size_t(i)].load() == 1);
                if (threads == 1 || n <= std::max<int64_t>(grain, 1)) {
                    CHECK(calls.load() == (n > 0 ? 1 : 0)); // all of it at once
                } else {
                    // one equal share per thread of three quarters, the rest in chunks
                    CHECK(small.load() >= n / 4);
                    CHECK(calls.load() <=
                          threads + (n / 4 + threads * std::max<int64_t>(grain, 1)) / std::max<int64_t>(grain, 1) + 1);
                }
            }
        }
    }
}

TEST_CASE("thread pool parts run every step once and idle threads take halves of the rest") {
    for (int threads : {1, 2, 3}) {
        thread_pool pool(threads);
        for (bool serial : {false, true}) {
            for (bool slow_first : {false, true}) {
                CAPTURE(threads);
                CAPTURE(serial);
                CAPTURE(slow_first);
                const int parts = serial ? 1 : threads;
                const auto steps = [&](int p) { return int64_t(p == 1 ? 0 : 500 + 37 * p); }; // part 1 is empty
                std::vector<std::vector<std::atomic<int>>> seen;
                for (int p = 0; p < parts; ++p) seen.emplace_back(size_t(steps(p)));
                std::vector<std::thread::id> by(size_t(steps(0))); // the thread of each step of part 0
                std::atomic<int> bad{0};                           // calls out of range
                slow_first_call first;
                pool.parallel_parts(serial, steps, [&](int p, int64_t k0, int64_t k1) {
                    if (p < 0 || p >= parts || k0 < 0 || k0 >= k1 || k1 > steps(p)) {
                        bad.fetch_add(1);
                        return;
                    }
                    if (p == 0 && slow_first) first.step(k0, parts > 1);
                    for (int64_t k = k0; k < k1; ++k) {
                        seen[size_t(p)][size_t(k)].fetch_add(1);
                        if (p == 0) by[size_t(k)] = std::this_thread::get_id();
                    }
                });
                CHECK(bad.load() == 0);
                for (int p = 0; p < parts; ++p) {
                    for (int64_t k = 0; k < steps(p); ++k) REQUIRE(seen[size_t(p)][size_t(k)].load() == 1);
                }
                // while part 0's first call waits, the other threads run out and take from it
                const auto others = std::count_if(by.begin(), by.end(), [&](std::thread::id t) { return t != by[0]; });
                if (slow_first && parts > 1) CHECK(others > 0);
                if (parts == 1) CHECK(others == 0);
            }
        }
    }
}

TEST_CASE("thread pool parts after prologues run no step before its part's prologue and share the rest") {
    for (int threads : {1, 2, 3}) {
        thread_pool pool(threads);
        for (int slow : {-1, 0, 1}) { // a thread whose prologue sleeps (none, the caller, a worker)
            CAPTURE(threads);
            CAPTURE(slow);
            const auto steps = [&](int p) { return int64_t(p == 1 ? 0 : 400 + 29 * p); }; // part 1 is empty
            const size_t nt = static_cast<size_t>(threads);
            std::vector<std::atomic<int>> prologues(nt);
            std::vector<std::vector<std::atomic<int>>> seen;
            for (int p = 0; p < threads; ++p) seen.emplace_back(size_t(steps(p)));
            std::vector<std::vector<std::thread::id>> by(nt);
            for (int p = 0; p < threads; ++p) by[size_t(p)].resize(size_t(steps(p)));
            std::atomic<int> bad{0}; // calls out of range or before their part's prologue ended
            slow_first_call first;
            pool.parallel_parts_after(
                [&](int p) {
                    if (p == slow) std::this_thread::sleep_for(std::chrono::milliseconds(40));
                    prologues[size_t(p)].fetch_add(1);
                },
                steps,
                [&](int p, int64_t k0, int64_t k1) {
                    if (p < 0 || p >= threads || k0 < 0 || k0 >= k1 || k1 > steps(p) ||
                        prologues[size_t(p)].load() != 1) {
                        bad.fetch_add(1);
                        return;
                    }
                    if (p == slow) first.step(k0, threads > 1);
                    for (int64_t k = k0; k < k1; ++k) {
                        seen[size_t(p)][size_t(k)].fetch_add(1);
                        by[size_t(p)][size_t(k)] = std::this_thread::get_id();
                    }
                });
            CHECK(bad.load() == 0);
            for (int p = 0; p < threads; ++p) {
                CHECK(prologues[size_t(p)].load() == 1);
                for (int64_t k = 0; k < steps(p); ++k) REQUIRE(seen[size_t(p)][size_t(k)].load() == 1);
            }
            // the others wait out the slow prologue, then take from its part
            if (slow >= 0 && slow < threads && steps(slow) > 0) {
                const auto& b = by[size_t(slow)];
                const auto others =
                    std::count_if(b.begin(), b.end(), [&](std::thread::id t) { return t != b.front(); });
                if (threads > 1) CHECK(others > 0);
                else CHECK(others == 0);
            }
        }
    }
}
