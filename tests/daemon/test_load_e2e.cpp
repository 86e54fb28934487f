// Load: many clients, random cancels and disconnects. Every request that keeps its
// client ends with exactly one final line, nothing hangs, and the daemon's memory
// stays flat from one round to the next.

#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "colibri/protocol/messages.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;
namespace p = colibri::protocol;

namespace {

struct round_result {
    std::atomic<int> completed{0};
    std::atomic<int> cancelled{0};
    std::atomic<int> abandoned{0};
    std::atomic<int> wrong{0};
    std::vector<std::string> failures;
    std::mutex mu;

    void fail(const std::string& what) {
        std::lock_guard lock(mu);
        failures.push_back(what);
    }
};

void client_thread(const std::string& socket, int t, int n_requests, std::uint32_t seed, round_result& out) {
    std::mt19937 rng(seed + static_cast<std::uint32_t>(t));
    auto c = std::make_unique<client>(socket);
    for (int i = 0; i < n_requests; ++i) {
        const int action = static_cast<int>(rng() % 100);
        const int max_tokens = 1 + static_cast<int>(rng() % 20);
        std::string id = "t";
        id.append(std::to_string(t)).append("-").append(std::to_string(i));
        const std::string prompt = id + " prompt";
        json req = complete_request(id, prompt, max_tokens, static_cast<std::uint64_t>(i));
        if (action < 70) {
            c->send(req);
            auto events = c->until_final(id);
            p::complete_request cr;
            cr.prompt = prompt;
            cr.max_tokens = max_tokens;
            const auto want = make_fake_completion(cr, static_cast<std::uint64_t>(i)).text();
            if (events.back()["event"] != "done" || concat_pieces(events) != want) {
                ++out.wrong;
                out.fail(id + ": " + events.back().dump());
            } else {
                ++out.completed;
            }
        } else if (action < 85) {
            req["max_tokens"] = 60;
            req["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 1}};
            c->send(req);
            c->send({{"id", "cancel-" + id}, {"op", "cancel"}, {"target", id}});
            auto events = c->until_final(id);
            auto ack = c->until_final("cancel-" + id);
            const auto& last = events.back();
            if (last["event"] != "done" || ack.size() != 1 || ack[0]["event"] != "cancel") {
                ++out.wrong;
                out.fail(id + ": " + last.dump());
            } else {
                ++out.cancelled;
            }
        } else {
            c->send(req);
            c = std::make_unique<client>(socket); // vanish without waiting
            ++out.abandoned;
        }
    }
    // Nothing may follow a final line: a health round trip flushes the connection.
    c->send({{"id", "h"}, {"op", "health"}});
    for (;;) {
        auto ev = c->next();
        if (!ev) {
            out.fail("closed");
            return;
        }
        if ((*ev)["id"] == "h") break;
        ++out.wrong;
        out.fail("stray event: " + ev->dump());
    }
}

void run_round(const daemon_process& d, int n_clients, int n_requests, std::uint32_t seed, round_result& r) {
    std::vector<std::thread> threads;
    for (int t = 0; t < n_clients; ++t)
        threads.emplace_back([&, t] {
            try {
                client_thread(d.socket_path(), t, n_requests, seed, r);
            } catch (const std::exception& e) {
                r.fail(e.what());
            }
        });
    for (auto& th : threads) th.join();
}

} // namespace

TEST_CASE("load: 32 clients x 20 requests with random cancels and disconnects") {
    daemon_process d(daemon_process::options{{"--max-queue", "256"}, {"--log-level", "info"}});
    round_result warmup;
    run_round(d, 32, 20, 1, warmup);
    REQUIRE(warmup.failures.empty());
    client c(d.socket_path());
    const auto rss_before = c.call({{"id", 1}, {"op", "status"}})["memory"]["daemon_rss_bytes"].get<long long>();

    round_result r;
    const auto start = std::chrono::steady_clock::now();
    run_round(d, 32, 20, 2, r);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& f : r.failures) MESSAGE(f);
    CHECK(r.failures.empty());
    CHECK(r.wrong == 0);
    CHECK(r.completed + r.cancelled + r.abandoned == 32 * 20);

    auto status = c.call({{"id", 2}, {"op", "status"}});
    const auto rss_after = status["memory"]["daemon_rss_bytes"].get<long long>();
    MESSAGE("round: " << seconds << " s, completed " << r.completed.load() << ", cancelled " << r.cancelled.load()
                      << ", abandoned " << r.abandoned.load() << ", daemon RSS " << rss_before / 1024 << " KiB -> "
                      << rss_after / 1024 << " KiB");
#if !defined(__SANITIZE_ADDRESS__) // ASan's quarantine keeps freed memory resident
    CHECK(rss_after - rss_before < 2 * 1024 * 1024);
#endif
    CHECK(status["worker"]["restarts"] == 0);
    CHECK(status["connections"] == 1);
    // The abandoned requests may still be draining from the worker; nothing stays queued.
    for (int i = 0; i < 100 && c.call({{"id", 3}, {"op", "status"}})["in_flight"] != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(c.call({{"id", 4}, {"op", "status"}})["in_flight"] == 0);
}
