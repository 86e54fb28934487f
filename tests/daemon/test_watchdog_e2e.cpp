// End-to-end: the supervisor and its watchdog, with faults injected into the worker.

#include <doctest/doctest.h>

#include <signal.h>

#include <thread>

#include "colibri/protocol/messages.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;

namespace {

json faulty(const json& id, const std::string& kind, int after_tokens) {
    json req = complete_request(id, "faulty " + kind, 50, 1);
    req["debug_fault"] = {{"kind", kind}, {"after_tokens", after_tokens}};
    return req;
}

/// Polls health until it reports `want` (recovery is time-based by design).
bool wait_health(client& c, const std::string& want, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int i = 0;; ++i) {
        if (c.call({{"id", i}, {"op", "health"}})["status"] == want) return true;
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

} // namespace

TEST_CASE("worker SIGSEGV mid-stream: error event - restart - the next request succeeds") {
    daemon_process d;
    client c(d.socket_path());
    c.send(faulty("x", "crash", 3));
    auto events = c.until_final("x");
    REQUIRE(events.size() == 4); // three pieces, then the error
    CHECK(events[2]["event"] == "piece");
    const auto& err = events.back();
    CHECK(err["event"] == "error");
    CHECK(err["code"] == "worker_crashed");
    CHECK(err["finish_reason"] == "error");
    CHECK(err["message"].get<std::string>().find("SIGSEGV") != std::string::npos);

    c.send(complete_request("after", "recovered", 6, 2));
    auto next = c.until_final("after", std::chrono::seconds(5));
    CHECK(next.back()["event"] == "done");
    CHECK(concat_pieces(next) == fake_text("recovered", 6, 2));

    auto status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["worker"]["restarts"] == 1);
    CHECK(status["worker"]["last_crash_reason"].get<std::string>().find("SIGSEGV") != std::string::npos);
    CHECK(status["requests"]["failed"] == 1);
}

TEST_CASE("worker killed from outside (SIGKILL) mid-stream") {
    daemon_process d;
    client c(d.socket_path());
    const int pid = c.call({{"id", "s"}, {"op", "status"}})["worker"]["pid"].get<int>();
    json slow = complete_request("k", "to be killed", 1000, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
    c.send(slow);
    REQUIRE(c.next().has_value());
    REQUIRE(::kill(pid, SIGKILL) == 0);
    auto events = c.until_final("k");
    CHECK(events.back()["event"] == "error");
    CHECK(events.back()["code"] == "worker_crashed");
    CHECK(events.back()["message"].get<std::string>().find("SIGKILL") != std::string::npos);
    c.send(complete_request("after", "recovered", 6, 2));
    CHECK(concat_pieces(c.until_final("after", std::chrono::seconds(5))) == fake_text("recovered", 6, 2));
    auto status = c.call({{"id", "s2"}, {"op", "status"}});
    CHECK(status["worker"]["pid"].get<int>() != pid);
}

TEST_CASE("abort and exit faults are reported with their cause") {
    daemon_process d;
    client c(d.socket_path());
    c.send(faulty("a", "abort", 0));
    auto events = c.until_final("a");
    REQUIRE(events.size() == 1);
    CHECK(events[0]["code"] == "worker_crashed");
    CHECK(events[0]["message"].get<std::string>().find("SIGABRT") != std::string::npos);
    c.send(faulty("e", "exit", 1));
    events = c.until_final("e", std::chrono::seconds(5));
    REQUIRE(events.size() == 2);
    CHECK(events[1]["code"] == "worker_crashed");
    CHECK(events[1]["message"].get<std::string>().find("exited with status 3") != std::string::npos);
    auto status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["worker"]["restarts"] == 2);
}

TEST_CASE("a device failure ends the request with its reason and restarts the worker - queued requests wait for it") {
    daemon_process d;
    client c(d.socket_path());
    client waiter(d.socket_path());
    c.send(faulty("g", "device_error", 2));
    auto first = c.next(); // g is running: q queues behind it, and so runs on the next worker
    REQUIRE(first.has_value());
    CHECK((*first)["event"] == "piece");
    waiter.send(complete_request("q", "queued", 5, 1));
    auto events = c.until_final("g", std::chrono::seconds(5));
    REQUIRE(events.size() == 2); // the second piece, then the error
    CHECK(events[0]["event"] == "piece");
    CHECK(events.back()["event"] == "error");
    CHECK(events.back()["code"] == "worker_crashed");
    CHECK(events.back()["message"].get<std::string>().find("the device failed: injected device error") !=
          std::string::npos);
    auto q = waiter.until_final("q", std::chrono::seconds(5));
    CHECK(q.back()["event"] == "done");
    CHECK(concat_pieces(q) == fake_text("queued", 5, 1));
    auto status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["worker"]["restarts"] == 1);
    const std::string reason = status["worker"]["last_crash_reason"].get<std::string>();
    CHECK(reason.find("the device failed") != std::string::npos);
    CHECK(reason.find("exited with status 4") != std::string::npos);
    CHECK(status["requests"]["failed"] == 1);
}

TEST_CASE("queued requests continue on the restarted worker") {
    daemon_process d;
    client crasher(d.socket_path());
    client waiter(d.socket_path());
    json slow_crash = complete_request("x", "crash later", 50, 1);
    slow_crash["debug_fault"] = {{"kind", "crash"}, {"after_tokens", 5}};
    crasher.send(slow_crash);
    REQUIRE(crasher.next().has_value()); // running
    waiter.send(complete_request("q1", "queued one", 5, 1));
    waiter.send(complete_request("q2", "queued two", 5, 2));
    CHECK(crasher.until_final("x").back()["code"] == "worker_crashed");
    auto q1 = waiter.until_final("q1", std::chrono::seconds(5));
    auto q2 = waiter.until_final("q2", std::chrono::seconds(5));
    CHECK(q1.back()["event"] == "done");
    CHECK(q2.back()["event"] == "done");
    CHECK(concat_pieces(q1) == fake_text("queued one", 5, 1));
    CHECK(concat_pieces(q2) == fake_text("queued two", 5, 2));
}

TEST_CASE("a hung worker is killed after the progress timeout - the request ends with timeout") {
    daemon_process d(daemon_process::options{{"--progress-timeout-ms", "300"}});
    client c(d.socket_path());
    c.send(faulty("h", "hang", 2));
    auto events = c.until_final("h", std::chrono::seconds(5));
    CHECK(concat_pieces(events).size() > 0);
    const auto& err = events.back();
    CHECK(err["event"] == "error");
    CHECK(err["code"] == "timeout");
    CHECK(err["finish_reason"] == "timeout");
    CHECK(err["message"].get<std::string>().find("no progress for 300 ms") != std::string::npos);
    c.send(complete_request("after", "recovered", 6, 2));
    CHECK(concat_pieces(c.until_final("after", std::chrono::seconds(5))) == fake_text("recovered", 6, 2));
    CHECK(c.call({{"id", "s"}, {"op", "status"}})["worker"]["restarts"] == 1);
}

TEST_CASE("a frozen worker (SIGSTOP) fails the liveness probe and is replaced") {
    daemon_process d(daemon_process::options{{"--liveness-timeout-ms", "300"}});
    client c(d.socket_path());
    const int pid = c.call({{"id", "s"}, {"op", "status"}})["worker"]["pid"].get<int>();
    REQUIRE(::kill(pid, SIGSTOP) == 0);
    c.send(complete_request("f", "frozen", 5, 1));
    auto events = c.until_final("f", std::chrono::seconds(5));
    CHECK(events.back()["event"] == "error");
    CHECK(events.back()["code"] == "timeout");
    CHECK(events.back()["message"].get<std::string>().find("liveness") != std::string::npos);
    c.send(complete_request("after", "recovered", 6, 2));
    CHECK(concat_pieces(c.until_final("after", std::chrono::seconds(5))) == fake_text("recovered", 6, 2));
}

TEST_CASE("crash loop: unavailable in health and errors - then recovery") {
    daemon_process d(daemon_process::options{
        {"--crash-loop-threshold", "2"}, {"--crash-loop-window-ms", "60000"}, {"--crash-loop-retry-ms", "400"}});
    client c(d.socket_path());
    c.send(faulty("x1", "crash", 0));
    CHECK(c.until_final("x1").back()["code"] == "worker_crashed");
    c.send(faulty("x2", "crash", 0));
    CHECK(c.until_final("x2", std::chrono::seconds(5)).back()["code"] == "worker_crashed");
    // Two crashes within the window: unavailable, immediately and with the reason.
    auto health = c.call({{"id", "h"}, {"op", "health"}});
    CHECK(health["status"] == "unavailable");
    CHECK(health["message"].get<std::string>().find("SIGSEGV") != std::string::npos);
    auto ev = c.call(complete_request("r", "x", 3, 1));
    CHECK(ev["event"] == "error");
    CHECK(ev["code"] == "unavailable");
    // After the retry delay a fresh worker serves again.
    REQUIRE(wait_health(c, "ok", std::chrono::seconds(5)));
    c.send(complete_request("after", "recovered", 6, 2));
    CHECK(concat_pieces(c.until_final("after", std::chrono::seconds(5))) == fake_text("recovered", 6, 2));
}

TEST_CASE("a worker that cannot load its model: unavailable with the reason - daemon stays up") {
    daemon_process d(daemon_process::options{{"--crash-loop-threshold", "2"}, {"--crash-loop-retry-ms", "60000"}}, true,
                     "fail: corrupt\n");
    client c(d.socket_path());
    REQUIRE(wait_health(c, "unavailable", std::chrono::seconds(5)));
    auto health = c.call({{"id", "h"}, {"op", "health"}});
    CHECK(health["message"].get<std::string>().find("corrupt") != std::string::npos);
    auto ev = c.call(complete_request("r", "x", 3, 1));
    CHECK(ev["event"] == "error");
    CHECK(ev["code"] == "unavailable");
}
