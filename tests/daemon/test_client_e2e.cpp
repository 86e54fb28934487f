// End-to-end: colibri-client as a user runs it, against a real colibrid (fake worker).

#include <doctest/doctest.h>

#include <sys/wait.h>

#include "colibri/protocol/messages.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;

namespace {

run_result client_run(const daemon_process& d, std::vector<std::string> args, const std::string& input = "") {
    args.insert(args.begin(), {COLIBRI_CLIENT_EXE, "--socket", d.socket_path()});
    return run_command(args, std::chrono::seconds(10), input);
}

int exit_code(const run_result& r) { return WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1; }

} // namespace

TEST_CASE("client: stdout carries exactly the completion") {
    daemon_process d;
    auto r = client_run(d, {"--max_tokens", "12", "--seed", "5", "def f(x):"});
    CHECK(exit_code(r) == 0);
    CHECK(r.out == fake_text("def f(x):", 12, 5));
    auto dashed = client_run(d, {"--max-tokens=12", "--seed=5", "--no-stream", "--prompt", "def f(x):"});
    CHECK(exit_code(dashed) == 0);
    CHECK(dashed.out == r.out);
}

TEST_CASE("client: the prompt from standard input") {
    daemon_process d;
    const std::string prompt = "line one\nline \xc3\xa9 two\n";
    auto r = client_run(d, {"--max_tokens", "9", "--seed", "3"}, prompt);
    CHECK(exit_code(r) == 0);
    CHECK(r.out == fake_text(prompt, 9, 3));
}

TEST_CASE("client: --json prints the daemon's events") {
    daemon_process d;
    auto r = client_run(d, {"--json", "--max_tokens", "4", "--seed", "1", "x"});
    CHECK(exit_code(r) == 0);
    std::vector<json> events;
    std::size_t start = 0;
    for (std::size_t nl; (nl = r.out.find('\n', start)) != std::string::npos; start = nl + 1)
        events.push_back(json::parse(r.out.substr(start, nl - start)));
    REQUIRE(events.size() == 5);
    CHECK(events[0]["event"] == "piece");
    CHECK(events[4]["event"] == "done");
    CHECK(events[4]["usage"]["completion_tokens"] == 4);
}

TEST_CASE("client: health and status") {
    daemon_process d;
    auto h = client_run(d, {"health"});
    CHECK(exit_code(h) == 0);
    CHECK(h.out == "ok\n");
    auto s = client_run(d, {"status"});
    CHECK(exit_code(s) == 0);
    CHECK(json::parse(s.out)["model"]["architecture"] == "fake");
}

TEST_CASE("client: errors go to stderr with a non-zero status") {
    daemon_process d;
    auto bad = client_run(d, {"--max_tokens", "-1", "x"});
    CHECK(exit_code(bad) == 1);
    CHECK(bad.out.empty());
    CHECK(bad.err.find("invalid_request") != std::string::npos);
    CHECK(bad.err.find("max_tokens") != std::string::npos);

    auto usage = client_run(d, {"--temperature", "warm", "x"});
    CHECK(exit_code(usage) == 2);
    CHECK(usage.err.find("--temperature") != std::string::npos);

    auto nobody =
        run_command({COLIBRI_CLIENT_EXE, "--socket", d.dir() + "/nobody.sock", "x"}, std::chrono::seconds(10));
    CHECK(exit_code(nobody) == 1);
    CHECK(nobody.err.find("cannot connect") != std::string::npos);
    CHECK(nobody.out.empty());
}
