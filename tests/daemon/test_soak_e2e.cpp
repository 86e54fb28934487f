// Soak (label slow): mixed traffic for COLIBRI_SOAK_SECONDS (default an hour) while the
// worker is killed, crashed and hung, and clients cancel, supersede and vanish mid-stream.
// Every request whose client stays gets exactly one final line with the right text or the
// right error, nothing is left in flight, and the daemon's memory stays flat.

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "colibri/protocol/messages.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;
namespace p = colibri::protocol;
using clock_type = std::chrono::steady_clock;

namespace {

struct soak_totals {
    std::mutex mu;
    std::map<std::string, long> outcomes; // final lines by event / finish reason / error code
    std::vector<std::string> failures;
    long requests = 0;

    void count(const std::string& what) {
        std::lock_guard lock(mu);
        ++outcomes[what];
        ++requests;
    }
    void fail(const std::string& what) {
        std::lock_guard lock(mu);
        if (failures.size() < 50) failures.push_back(what);
    }
};

std::string outcome(const json& final_line) {
    if (final_line["event"] == "error") return "error " + final_line["code"].get<std::string>();
    return "done " + final_line["finish_reason"].get<std::string>();
}

// Exactly one final line for `id`, then nothing more for it before the next request.
std::vector<json> finished(client& c, const std::string& id, soak_totals& t) {
    auto events = c.until_final(id, std::chrono::seconds(30));
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        if (events[i]["event"] != "piece") t.fail(id + ": before the final line: " + events[i].dump());
    }
    t.count(outcome(events.back()));
    return events;
}

std::string expected_text(const std::string& prompt, int max_tokens, std::uint64_t seed) {
    p::complete_request cr;
    cr.prompt = prompt;
    cr.max_tokens = max_tokens;
    return make_fake_completion(cr, seed).text();
}

// One editor: completions (checked against the fake generator), cancels, supersedes,
// disconnects mid-stream and short deadlines, with a few milliseconds between requests.
void editor(const std::string& socket, int e, clock_type::time_point end, soak_totals& t) {
    std::mt19937 rng(1000u + static_cast<std::uint32_t>(e));
    auto c = std::make_unique<client>(socket);
    for (long i = 0; clock_type::now() < end; ++i) {
        const int action = static_cast<int>(rng() % 100);
        const int max_tokens = 1 + static_cast<int>(rng() % 24);
        std::string id = "e"; // appended, not added: GCC 12 warns (-Wrestrict) on the sums
        id.append(std::to_string(e)).append("-").append(std::to_string(i));
        const std::string prompt = id + " prompt";
        const auto seed = static_cast<std::uint64_t>(i);
        json req = complete_request(id, prompt, max_tokens, seed);
        req["session"] = "editor-" + std::to_string(e);
        if (action < 60) { // a completion, checked
            c->send(req);
            const auto events = finished(*c, id, t);
            if (events.back()["event"] != "done" || concat_pieces(events) != expected_text(prompt, max_tokens, seed)) {
                t.fail(id + ": " + events.back().dump());
            }
        } else if (action < 72) { // cancelled while streaming
            req["max_tokens"] = 60;
            req["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 2}};
            c->send(req);
            c->send({{"id", "cancel-" + id}, {"op", "cancel"}, {"target", id}});
            finished(*c, id, t);
            const auto ack = c->until_final("cancel-" + id);
            if (ack.size() != 1 || ack[0]["event"] != "cancel") t.fail(id + ": cancel ack " + ack.back().dump());
        } else if (action < 82) { // superseded by the next keystroke's request
            req["max_tokens"] = 60;
            req["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 2}};
            c->send(req);
            const std::string id2 = id + "b";
            json next = complete_request(id2, prompt + "x", max_tokens, seed);
            next["session"] = req["session"];
            c->send(next);
            const auto first = finished(*c, id, t);
            if (first.back()["event"] == "done" && first.back()["finish_reason"] != "cancelled" &&
                first.back()["finish_reason"] != "length") {
                t.fail(id + ": superseded request ended " + first.back().dump());
            }
            finished(*c, id2, t);
        } else if (action < 90) { // gone mid-stream
            req["max_tokens"] = 60;
            req["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 2}};
            c->send(req);
            if (rng() % 2) (void)c->next(std::chrono::seconds(30)); // after its first event, or before any
            c = std::make_unique<client>(socket);
            t.count("abandoned");
        } else if (action < 95) { // a deadline shorter than the request
            req["max_tokens"] = 60;
            req["timeout_ms"] = 20;
            req["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
            c->send(req);
            const auto events = finished(*c, id, t);
            if (events.back()["event"] != "done" || events.back()["finish_reason"] != "timeout") {
                t.fail(id + ": past its deadline: " + events.back().dump());
            }
        } else {
            const auto reply = c->call({{"id", id}, {"op", rng() % 2 ? "status" : "health"}});
            t.count("status or health");
            if (reply["event"] == "error") t.fail(id + ": " + reply.dump());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 20));
    }
    // Nothing may follow a final line: a health round trip flushes the connection.
    c->send({{"id", "flush"}, {"op", "health"}});
    for (;;) {
        auto ev = c->next(std::chrono::seconds(30));
        if (!ev) return t.fail("editor " + std::to_string(e) + ": connection closed");
        if ((*ev)["id"] == "flush") break;
        t.fail("stray event: " + ev->dump());
    }
}

// The faults: every few seconds a request that crashes, kills or hangs the worker.
void chaos(const std::string& socket, clock_type::time_point end, soak_totals& t) {
    std::mt19937 rng(7);
    client c(socket);
    const char* kinds[] = {"crash", "abort", "kill", "exit", "hang"};
    for (long i = 0; clock_type::now() < end; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2000 + rng() % 2000));
        const std::string id = "fault-" + std::to_string(i);
        json req = complete_request(id, "fault", 30, 1);
        req["debug_fault"] = {{"kind", kinds[rng() % 5]}, {"after_tokens", static_cast<int>(rng() % 4)}};
        c.send(req);
        const auto events = finished(c, id, t);
        const auto& last = events.back();
        if (last["event"] != "error" || (last["code"] != "worker_crashed" && last["code"] != "timeout")) {
            t.fail(id + " (" + req["debug_fault"].dump() + "): " + last.dump());
        }
    }
}

} // namespace

TEST_CASE("soak: mixed traffic with worker crashes, hangs, cancels, supersedes and vanishing clients") {
    const char* env = std::getenv("COLIBRI_SOAK_SECONDS");
    const int seconds = env != nullptr ? std::atoi(env) : 3600;
    REQUIRE(seconds > 0);
    daemon_process d(daemon_process::options{{"--max-queue", "256"},
                                             {"--log-level", "warn"},
                                             {"--progress-timeout-ms", "1000"},
                                             {"--crash-loop-threshold", "100"}});
    client c(d.socket_path());
    const auto status0 = c.call({{"id", 1}, {"op", "status"}});
    const auto rss0 = status0["memory"]["daemon_rss_bytes"].get<long long>();

    soak_totals t;
    const auto start = clock_type::now();
    const auto end = start + std::chrono::seconds(seconds);
    std::vector<std::thread> threads;
    const auto guarded = [&t](auto&& f) {
        return [&t, f] {
            try {
                f();
            } catch (const std::exception& e) {
                t.fail(e.what());
            }
        };
    };
    for (int e = 0; e < 8; ++e) threads.emplace_back(guarded([&, e] { editor(d.socket_path(), e, end, t); }));
    threads.emplace_back(guarded([&] { chaos(d.socket_path(), end, t); }));
    for (auto& th : threads) th.join();

    for (int i = 0; i < 500 && c.call({{"id", 2}, {"op", "status"}})["in_flight"] != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto status = c.call({{"id", 3}, {"op", "status"}});
    const auto rss1 = status["memory"]["daemon_rss_bytes"].get<long long>();
    MESSAGE("soak: " << std::chrono::duration<double>(clock_type::now() - start).count() << " s, " << t.requests
                     << " requests, worker restarts " << status["worker"]["restarts"] << ", daemon RSS " << rss0 / 1024
                     << " KiB -> " << rss1 / 1024 << " KiB");
    for (const auto& [what, n] : t.outcomes) MESSAGE("  " << what << ": " << n);
    MESSAGE("  daemon's counts: " << status["requests"].dump());
    for (const auto& f : t.failures) MESSAGE(f);
    CHECK(t.failures.empty());
    CHECK(status["in_flight"] == 0);
    CHECK(status["worker"]["restarts"].get<long>() > 0);
    CHECK(status["requests"]["superseded"].get<long>() > 0);
#if !defined(__SANITIZE_ADDRESS__) // ASan's quarantine keeps freed memory resident
    CHECK(rss1 - rss0 < 4 * 1024 * 1024);
#endif
}
