// End-to-end: the wire protocol against a real colibrid (fake worker).

#include <doctest/doctest.h>

#include <sys/socket.h>

#include <string>
#include <thread>
#include <vector>

#include "colibri/protocol/codec.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;
namespace p = colibri::protocol;

namespace {

fake_completion expected(const std::string& prompt, int max_tokens, std::uint64_t seed,
                         std::vector<std::string> stop = {}) {
    p::complete_request req;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    req.stop = std::move(stop);
    return make_fake_completion(req, seed);
}

/// prefix + number, without operator+ (GCC 12 -Wrestrict false positive, PR 105329).
std::string numbered(const char* prefix, int i) {
    std::string s = prefix;
    s.append(std::to_string(i));
    return s;
}

} // namespace

TEST_CASE("hello - health and status") {
    daemon_process d;
    client c(d.socket_path());
    auto hello = c.call({{"id", "h"}, {"op", "hello"}, {"protocol", 1}, {"client", "test"}});
    CHECK(hello["event"] == "hello");
    CHECK(hello["protocol"] == 1);
    CHECK(hello["server"].get<std::string>().find("colibrid") == 0);

    auto bad = c.call({{"id", "h2"}, {"op", "hello"}, {"protocol", 2}});
    CHECK(bad["event"] == "error");
    CHECK(bad["code"] == "unsupported_protocol");

    auto health = c.call({{"id", 1}, {"op", "health"}});
    CHECK(health["event"] == "health");
    CHECK(health["id"] == 1);
    CHECK(health["status"] == "ok");
    CHECK(health["worker"] == "idle");

    auto status = c.call({{"id", 2}, {"op", "status"}});
    CHECK(status["event"] == "status");
    CHECK(status["protocol"] == 1);
    CHECK(status["model"]["architecture"] == "fake");
    CHECK(status["model"]["path"] == d.model_path());
    CHECK(status["backend"] == "cpu");
    CHECK(status["worker"]["restarts"] == 0);
    CHECK(status["worker"]["last_crash_reason"].is_null());
    CHECK(status["worker"]["pid"].get<int>() > 0);
    CHECK(status["queue_depth"] == 0);
    CHECK(status["requests"]["served"] == 0);
    CHECK(status["memory"]["daemon_rss_bytes"].get<long long>() > 0);
    CHECK(status["memory"]["worker_rss_bytes"].get<long long>() > 0);
    CHECK(status["uptime_s"].get<double>() >= 0);
}

TEST_CASE("streamed completion: pieces concatenate to the completion - then done") {
    daemon_process d;
    client c(d.socket_path());
    c.send(complete_request("a", "def fib(n):", 24, 7));
    auto events = c.until_final("a");
    const auto want = expected("def fib(n):", 24, 7);
    REQUIRE(events.size() == want.pieces.size() + 1);
    for (std::size_t i = 0; i < want.pieces.size(); ++i) {
        CHECK(events[i]["event"] == "piece");
        CHECK(events[i]["id"] == "a");
        CHECK(events[i]["text"] == want.pieces[i]);
    }
    CHECK(concat_pieces(events) == want.text());
    const auto& done = events.back();
    CHECK(done["event"] == "done");
    CHECK(done["finish_reason"] == "length");
    CHECK(done["usage"]["completion_tokens"] == 24);
    CHECK(done["usage"]["prompt_tokens"] == 11);
    CHECK(done["usage"]["cached_tokens"] == 0);
    CHECK(done["seed"] == 7);
    CHECK_FALSE(done.contains("text"));
    CHECK(done["timings"]["ttft_ms"].get<double>() > 0);
    CHECK(done["timings"]["queued_ms"].get<double>() >= 0);

    auto status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["requests"]["served"] == 1);
    CHECK(status["tokens"]["generated"] == 24);
}

TEST_CASE("stream:false returns the whole text in done - stop strings end with stop") {
    daemon_process d;
    client c(d.socket_path());
    json req = complete_request(5, "int main() {", 40, 3);
    req["stream"] = false;
    c.send(req);
    auto events = c.until_final(5);
    REQUIRE(events.size() == 1);
    CHECK(events[0]["event"] == "done");
    CHECK(events[0]["text"] == expected("int main() {", 40, 3).text());

    // A stop string taken from the middle of the unstopped output.
    const auto full = expected("int main() {", 40, 3);
    const std::string stop = full.pieces[5];
    const auto want = expected("int main() {", 40, 3, {stop});
    REQUIRE(want.reason == p::finish_reason::stop);
    req = complete_request(6, "int main() {", 40, 3);
    req["stop"] = stop;
    c.send(req);
    events = c.until_final(6);
    CHECK(concat_pieces(events) == want.text());
    CHECK(want.text().find(stop) == std::string::npos);
    CHECK(events.back()["finish_reason"] == "stop");
}

TEST_CASE("several requests in flight on one connection - events name their request") {
    daemon_process d;
    client c(d.socket_path());
    for (int i = 0; i < 5; ++i) c.send(complete_request(numbered("r", i), numbered("p", i), 6, i));
    for (int i = 4; i >= 0; --i) { // collected in any order thanks to the stash
        auto events = c.until_final(numbered("r", i));
        CHECK(concat_pieces(events) == expected(numbered("p", i), 6, i).text());
        CHECK(events.back()["event"] == "done");
    }
}

TEST_CASE("concurrent clients each get their own completion") {
    daemon_process d;
    std::vector<std::thread> threads;
    std::vector<int> ok(6, 0);
    std::vector<std::string> failures(6);
    for (int t = 0; t < 6; ++t) {
        threads.emplace_back([&, t] {
            try {
                client c(d.socket_path());
                for (int i = 0; i < 4; ++i) {
                    const std::string prompt = numbered(numbered("client ", t).append(" req ").c_str(), i);
                    c.send(complete_request(i, prompt, 10, 100 + t));
                    auto events = c.until_final(i);
                    if (concat_pieces(events) == expected(prompt, 10, 100 + t).text() &&
                        events.back()["event"] == "done")
                        ++ok[t];
                }
            } catch (const std::exception& e) {
                failures[t] = e.what();
            }
        });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 6; ++t) {
        CAPTURE(t);
        CHECK(failures[t] == "");
        CHECK(ok[t] == 4);
    }
    if (!failures[0].empty() || !failures[1].empty()) MESSAGE(d.log());
}

TEST_CASE("bad requests get stable error codes and the connection stays usable") {
    daemon_process d;
    client c(d.socket_path());
    struct bad_case {
        std::string line;
        std::string code;
        json id;
    };
    const std::vector<bad_case> cases = {
        {"{\"id\":1,\"op\":", "invalid_json", nullptr},
        {std::string("\x00\x01\xff\xfe garbage \x80", 15), "invalid_json", nullptr},
        {"[1,2,3]", "invalid_request", nullptr},
        {R"({"op":"health"})", "invalid_request", nullptr},
        {R"({"id":"u","op":"explode"})", "unknown_op", "u"},
        {R"({"id":"t","op":"complete","prompt":42})", "invalid_request", "t"},
        {R"({"id":"m","op":"complete","prompt":"x","max_tokens":"many"})", "invalid_request", "m"},
        {R"({"id":"k","op":"complete","prompt":"x","max_tokens":100000})", "invalid_request", "k"},
        {R"({"id":"f","op":"complete","prompt":"x","colour":"red"})", "invalid_request", "f"},
    };
    for (const auto& bc : cases) {
        CAPTURE(bc.line);
        c.send_raw(bc.line + "\n");
        auto ev = c.next();
        REQUIRE(ev.has_value());
        CHECK((*ev)["event"] == "error");
        CHECK((*ev)["code"] == bc.code);
        CHECK((*ev)["id"] == bc.id);
        CHECK_FALSE((*ev)["message"].get<std::string>().empty());
    }
    c.send(complete_request("after", "still works", 4, 1));
    CHECK(concat_pieces(c.until_final("after")) == expected("still works", 4, 1).text());
}

TEST_CASE("a duplicate in-flight id is refused without disturbing the first") {
    daemon_process d;
    client c(d.socket_path());
    json slow = complete_request("dup", "slow one", 5, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 20}};
    c.send(slow);
    c.send(complete_request("dup", "second", 5, 1));
    auto events = c.until_final("dup");
    // The error for the duplicate arrives first (the slow job is still running).
    CHECK(events.size() == 1);
    CHECK(events[0]["event"] == "error");
    CHECK(events[0]["code"] == "invalid_request");
    events = c.until_final("dup");
    CHECK(events.back()["event"] == "done");
    CHECK(concat_pieces(events) == expected("slow one", 5, 1).text());
}

TEST_CASE("an over-long line gets too_large and only that connection closes") {
    daemon_process d(daemon_process::options{{"--max-line-bytes", "4096"}});
    client c(d.socket_path());
    client other(d.socket_path());
    c.send_raw(std::string(10000, 'x'));
    auto ev = c.next();
    REQUIRE(ev.has_value());
    CHECK((*ev)["code"] == "too_large");
    CHECK(c.wait_closed());
    // A line just under the limit is fine.
    json req = complete_request("big", std::string(3900, 'a'), 3, 1);
    other.send(req);
    CHECK(concat_pieces(other.until_final("big")) == expected(std::string(3900, 'a'), 3, 1).text());
}

TEST_CASE("a partial line then disconnect - and a vanished client mid-stream - leave the daemon serving") {
    daemon_process d;
    {
        client c(d.socket_path());
        c.send_raw(R"({"id":1,"op":"comp)");
    }
    {
        client c(d.socket_path());
        json slow = complete_request("s", "long", 200, 1);
        slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
        c.send(slow);
        auto first = c.next();
        REQUIRE(first.has_value());
        CHECK((*first)["event"] == "piece");
    } // disconnect mid-stream
    client c(d.socket_path());
    c.send(complete_request("next", "after the vanished client", 5, 2));
    auto events = c.until_final("next", std::chrono::seconds(3));
    CHECK(events.back()["event"] == "done");
    CHECK(concat_pieces(events) == expected("after the vanished client", 5, 2).text());
    auto status = c.call({{"id", "st"}, {"op", "status"}});
    CHECK(status["requests"]["cancelled"] == 1);
    CHECK(status["worker"]["restarts"] == 0);
}

TEST_CASE("cancel mid-stream ends the request with cancelled - the next one runs") {
    daemon_process d;
    client c(d.socket_path());
    json slow = complete_request("long", "cancel me", 500, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
    c.send(slow);
    auto first = c.next();
    REQUIRE(first.has_value());
    CHECK((*first)["event"] == "piece");
    c.send({{"id", "c"}, {"op", "cancel"}, {"target", "long"}});
    auto events = c.until_final("long");
    CHECK(events.back()["event"] == "done");
    CHECK(events.back()["finish_reason"] == "cancelled");
    const int streamed = static_cast<int>(events.size()) - 1 + 1; // + the first piece
    CHECK(streamed < 500);
    auto ack = c.until_final("c");
    CHECK(ack.back()["event"] == "cancel");
    CHECK(ack.back()["found"] == true);
    // Cancelling something unknown is not an error.
    auto unknown = c.call({{"id", "c2"}, {"op", "cancel"}, {"target", "nope"}});
    CHECK(unknown["found"] == false);
    c.send(complete_request("n", "next", 3, 9));
    CHECK(concat_pieces(c.until_final("n")) == expected("next", 3, 9).text());
}

TEST_CASE("deadline: timeout_ms ends a running request with finish_reason timeout") {
    daemon_process d;
    client c(d.socket_path());
    json slow = complete_request("t", "too slow", 1000, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 10}};
    slow["timeout_ms"] = 100;
    c.send(slow);
    auto events = c.until_final("t", std::chrono::seconds(3));
    CHECK(events.back()["event"] == "done");
    CHECK(events.back()["finish_reason"] == "timeout");
    CHECK(events.size() < 100);
    c.send(complete_request("n", "next", 3, 9));
    CHECK(concat_pieces(c.until_final("n")) == expected("next", 3, 9).text());
}

TEST_CASE("queue limit answers busy - queued requests still complete") {
    daemon_process d(daemon_process::options{{"--max-queue", "2"}});
    client c(d.socket_path());
    json slow = complete_request("run", "occupy the worker", 40, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 10}};
    c.send(slow);
    auto first = c.next();
    REQUIRE(first.has_value()); // the slow one is running now
    c.send(complete_request("q1", "a", 2, 1));
    c.send(complete_request("q2", "b", 2, 1));
    c.send(complete_request("q3", "c", 2, 1));
    auto rejected = c.until_final("q3");
    CHECK(rejected.back()["event"] == "error");
    CHECK(rejected.back()["code"] == "busy");
    CHECK(c.until_final("q1").back()["event"] == "done");
    CHECK(c.until_final("q2").back()["event"] == "done");
    CHECK(c.until_final("run").back()["event"] == "done");
}

TEST_CASE("an error from the engine ends the request with an error event - the worker stays") {
    daemon_process d;
    client c(d.socket_path());
    auto ev = c.call(complete_request("r", "reject me", 4, 1));
    CHECK(ev["event"] == "error");
    CHECK(ev["code"] == "invalid_request");
    CHECK(ev["finish_reason"] == "error");
    auto status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["worker"]["restarts"] == 0);
}

TEST_CASE("debug_fault is refused unless fault injection is enabled") {
    daemon_process d(daemon_process::options{{"--enable-fault-injection", "<remove>"}});
    client c(d.socket_path());
    json req = complete_request("f", "x", 2, 1);
    req["debug_fault"] = {{"kind", "crash"}};
    auto ev = c.call(req);
    CHECK(ev["event"] == "error");
    CHECK(ev["code"] == "invalid_request");
    CHECK(ev["message"].get<std::string>().find("debug_fault") != std::string::npos);
}

TEST_CASE("a client that half-closes after its request (nc -N) still gets the whole answer") {
    daemon_process d;
    client c(d.socket_path());
    json slow = complete_request("h", "half closed", 10, 4);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
    c.send(slow);
    REQUIRE(::shutdown(c.fd(), SHUT_WR) == 0);
    auto events = c.until_final("h");
    CHECK(events.back()["event"] == "done");
    CHECK(concat_pieces(events) == expected("half closed", 10, 4).text());
    CHECK(c.wait_closed());
}

TEST_CASE("a request whose client left while it was queued never runs") {
    daemon_process d;
    client a(d.socket_path());
    json slow = complete_request("busy", "occupy", 20, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
    a.send(slow);
    REQUIRE(a.next().has_value()); // the worker is busy with it
    {
        client b(d.socket_path());
        b.send(complete_request("left", "never runs", 30, 1));
        // Make sure the daemon has queued it before b goes away.
        CHECK(b.call({{"id", "q"}, {"op", "status"}})["queue_depth"] == 1);
    }
    CHECK(a.until_final("busy").back()["event"] == "done");
    auto status = a.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["requests"]["served"] == 1);
    CHECK(status["requests"]["cancelled"] == 1);
    CHECK(status["tokens"]["generated"] == 20); // only the first request's tokens
    CHECK(status["queue_depth"] == 0);
}
