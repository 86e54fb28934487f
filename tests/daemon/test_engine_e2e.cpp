// End-to-end with the real engine: colibrid + colibri-worker on a small converted
// fixture model, compared with the engine run in-process through the C API.

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "colibri.h"
#include "harness.hpp"

using namespace colibri::test;

namespace {

struct reference_params {
    std::string prompt;
    std::string suffix;
    int max_tokens = 16;
    float temperature = 0.0f;
    int top_k = 40;
    float top_p = 0.95f;
    float min_p = 0.05f;
    float repeat_penalty = 1.0f;
    std::uint64_t seed = 1;
    std::vector<std::string> stop;
};

/// The completion the engine produces in-process for the same request.
std::string in_process(const reference_params& rp, int* n_tokens = nullptr) {
    colibri_model* model = nullptr;
    REQUIRE(colibri_model_load(COLIBRI_DAEMON_TEST_MODEL, nullptr, &model) == COLIBRI_OK);
    colibri_session* session = nullptr;
    REQUIRE(colibri_session_create(model, nullptr, &session) == COLIBRI_OK);
    colibri_generate_params gp;
    colibri_generate_params_init(&gp);
    gp.max_tokens = rp.max_tokens;
    gp.temperature = rp.temperature;
    gp.top_k = rp.top_k;
    gp.top_p = rp.top_p;
    gp.min_p = rp.min_p;
    gp.repeat_penalty = rp.repeat_penalty;
    gp.seed = rp.seed;
    std::vector<const char*> stop;
    for (const auto& s : rp.stop) stop.push_back(s.c_str());
    gp.stop = stop.empty() ? nullptr : stop.data();
    gp.n_stop = stop.size();
    if (!rp.suffix.empty()) {
        gp.suffix = rp.suffix.data();
        gp.suffix_len = rp.suffix.size();
    }
    std::string text;
    colibri_generate_result r{};
    REQUIRE(colibri_generate(
                session, rp.prompt.data(), rp.prompt.size(), &gp,
                [](void* user, const char* piece, size_t len) -> int {
                    static_cast<std::string*>(user)->append(piece, len);
                    return 0;
                },
                &text, &r) == COLIBRI_OK);
    if (n_tokens) *n_tokens = r.n_generated_tokens;
    colibri_session_free(session);
    colibri_model_free(model);
    return text;
}

json request_for(const json& id, const reference_params& rp) {
    json j = {{"id", id},          {"op", "complete"},         {"prompt", rp.prompt},
              {"max_tokens", rp.max_tokens}, {"temperature", rp.temperature}, {"top_k", rp.top_k},
              {"top_p", rp.top_p}, {"min_p", rp.min_p},        {"seed", rp.seed},
              {"repeat_penalty", rp.repeat_penalty}};
    if (!rp.stop.empty()) j["stop"] = rp.stop;
    if (!rp.suffix.empty()) j["suffix"] = rp.suffix;
    return j;
}

daemon_process::options engine_daemon() {
    return {{"--model", COLIBRI_DAEMON_TEST_MODEL}, {"--worker-exe", COLIBRI_WORKER_EXE}, {"--threads", "1"}};
}

} // namespace

TEST_CASE("engine: status describes the real model") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    auto status = c.call({{"id", 1}, {"op", "status"}});
    CHECK(status["model"]["architecture"] == "llama");
    CHECK(status["model"]["n_layer"] == 2);
    CHECK(status["model"]["quant"] == "f32");
    CHECK(status["backend"] == "cpu");
    CHECK(status["model"]["path"] == COLIBRI_DAEMON_TEST_MODEL);
}

TEST_CASE("engine: streamed completion equals the in-process engine's (greedy and sampled)") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    reference_params greedy;
    greedy.prompt = "def add(a, b):";
    greedy.max_tokens = 24;
    reference_params sampled = greedy;
    sampled.temperature = 0.9f;
    sampled.seed = 1234;
    sampled.top_k = 20;
    sampled.repeat_penalty = 1.3f;
    int n_tokens = 0;
    for (const auto* rp : {&greedy, &sampled}) {
        const std::string want = in_process(*rp, &n_tokens);
        REQUIRE_FALSE(want.empty());
        c.send(request_for("g", *rp));
        auto events = c.until_final("g", std::chrono::seconds(20));
        CHECK(events.back()["event"] == "done");
        CHECK(concat_pieces(events) == want);
        CHECK(events.back()["usage"]["completion_tokens"] == n_tokens);
        CHECK(events.back()["usage"]["prompt_tokens"].get<int>() > 0);
        CHECK(events.back()["seed"] == rp->seed);
    }
    // Non-streamed: the same text in the done event.
    json req = request_for("n", sampled);
    req["stream"] = false;
    c.send(req);
    auto events = c.until_final("n", std::chrono::seconds(20));
    REQUIRE(events.size() == 1);
    CHECK(events[0]["text"] == in_process(sampled));
}

TEST_CASE("engine: cancel mid-stream and a crashed worker - then the next request matches again") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    reference_params rp;
    rp.prompt = "int main() {";
    rp.max_tokens = 200;
    json slow = request_for("s", rp);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 5}};
    c.send(slow);
    auto first = c.next(std::chrono::seconds(20));
    REQUIRE(first.has_value());
    CHECK((*first)["event"] == "piece");
    c.send({{"id", "c"}, {"op", "cancel"}, {"target", "s"}});
    CHECK(c.until_final("s").back()["finish_reason"] == "cancelled");

    json crash = request_for("x", rp);
    crash["debug_fault"] = {{"kind", "crash"}, {"after_tokens", 2}};
    c.send(crash);
    auto crashed = c.until_final("x", std::chrono::seconds(20));
    CHECK(crashed.back()["code"] == "worker_crashed");

    rp.max_tokens = 12;
    c.send(request_for("after", rp));
    auto events = c.until_final("after", std::chrono::seconds(20));
    CHECK(events.back()["event"] == "done");
    CHECK(concat_pieces(events) == in_process(rp));
}

TEST_CASE("engine: a suffix (fill-in-the-middle) gives what the engine gives in-process") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    reference_params rp;
    rp.prompt = "def f(";
    rp.suffix = "):\n    return x\n";
    rp.max_tokens = 8;
    json req = request_for(1, rp);
    c.send(req);
    auto events = c.until_final(1, std::chrono::seconds(20));
    CHECK(events.back()["event"] == "done");
    CHECK(concat_pieces(events) == in_process(rp));
}

TEST_CASE("engine: a prompt that extends the previous one reuses the cached prefix") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    reference_params rp;
    rp.prompt = "def add(a, b):\n    return a";
    rp.max_tokens = 2;
    c.send(request_for("first", rp));
    auto first = c.until_final("first", std::chrono::seconds(20));
    CHECK(first.back()["usage"]["cached_tokens"] == 0);
    rp.prompt += " + b";
    c.send(request_for("second", rp));
    auto second = c.until_final("second", std::chrono::seconds(20));
    const int cached = second.back()["usage"]["cached_tokens"].get<int>();
    CHECK(cached > 0);
    CHECK(cached < second.back()["usage"]["prompt_tokens"].get<int>());
    CHECK(concat_pieces(second) == in_process(rp));
}

TEST_CASE("engine: colibri-client prints exactly what colibri prints for the same request") {
    daemon_process d(engine_daemon());
    const std::vector<std::string> common = {"--max_tokens", "20", "--temperature", "0.7", "--seed", "99",
                                             "--top_k", "30", "--prompt", "for i in range("};
    std::vector<std::string> cli = {COLIBRI_CLI_EXE, "--model", COLIBRI_DAEMON_TEST_MODEL, "--threads", "1"};
    cli.insert(cli.end(), common.begin(), common.end());
    std::vector<std::string> client_args = {COLIBRI_CLIENT_EXE, "--socket", d.socket_path()};
    client_args.insert(client_args.end(), common.begin(), common.end());
    auto want = run_command(cli, std::chrono::seconds(30));
    auto got = run_command(client_args, std::chrono::seconds(30));
    CHECK(WEXITSTATUS(want.status) == 0);
    CHECK(WEXITSTATUS(got.status) == 0);
    CHECK_FALSE(want.out.empty());
    CHECK(got.out == want.out);
}

TEST_CASE("engine: daemon and worker serve with writable+executable memory refused (MemoryDenyWriteExecute)") {
    // What colibrid.service's MemoryDenyWriteExecute=yes enforces, applied by the kernel
    // (PR_SET_MDWE) to colibrid and, inherited, to its worker.
    const auto probe = run_command({COLIBRI_MDWE_EXEC_EXE, "/bin/true"}, std::chrono::seconds(10));
    if (WIFEXITED(probe.status) && WEXITSTATUS(probe.status) == 77) {
        MESSAGE("skipped: this kernel has no PR_SET_MDWE (" << probe.err << ")");
        return;
    }
    REQUIRE(WIFEXITED(probe.status));
    REQUIRE(WEXITSTATUS(probe.status) == 0);
    daemon_process d(engine_daemon(), true, "", -1, {{}, {COLIBRI_MDWE_EXEC_EXE}});
    client c(d.socket_path());
    reference_params greedy;
    greedy.prompt = "def add(a, b):";
    greedy.max_tokens = 16;
    c.send(request_for("w", greedy));
    auto events = c.until_final("w", std::chrono::seconds(20));
    CHECK(events.back()["event"] == "done");
    CHECK(concat_pieces(events) == in_process(greedy));
    CHECK(c.call({{"id", "s2"}, {"op", "status"}})["worker"]["restarts"] == 0);
}
