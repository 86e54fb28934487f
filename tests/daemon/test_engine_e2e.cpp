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
    std::string model = COLIBRI_DAEMON_TEST_MODEL;
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
    int max_lines = 0;
    bool stop_on_dedent = false;
    int fim_spm = -1; // -1: the model file's FIM order
    bool parse_special = false;
    int min_indent = 0;
    std::vector<std::pair<std::string, std::string>> context; ///< name, text
};

/// The completion the engine produces in-process for the same request.
std::string in_process(const reference_params& rp, int* n_tokens = nullptr, int* n_prompt_tokens = nullptr) {
    colibri_model* model = nullptr;
    REQUIRE(colibri_model_load(rp.model.c_str(), nullptr, &model) == COLIBRI_OK);
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
    gp.max_lines = rp.max_lines;
    gp.stop_on_dedent = rp.stop_on_dedent ? 1 : 0;
    gp.fim_spm = rp.fim_spm;
    gp.parse_special = rp.parse_special ? 1 : 0;
    gp.min_indent = rp.min_indent;
    std::vector<colibri_context_file> context;
    for (const auto& [name, text] : rp.context) context.push_back({name.data(), name.size(), text.data(), text.size()});
    gp.context = context.empty() ? nullptr : context.data();
    gp.n_context = context.size();
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
    if (n_prompt_tokens) *n_prompt_tokens = r.n_prompt_tokens;
    colibri_session_free(session);
    colibri_model_free(model);
    return text;
}

json request_for(const json& id, const reference_params& rp) {
    json j = {{"id", id},
              {"op", "complete"},
              {"prompt", rp.prompt},
              {"max_tokens", rp.max_tokens},
              {"temperature", rp.temperature},
              {"top_k", rp.top_k},
              {"top_p", rp.top_p},
              {"min_p", rp.min_p},
              {"seed", rp.seed},
              {"repeat_penalty", rp.repeat_penalty}};
    if (!rp.stop.empty()) j["stop"] = rp.stop;
    if (!rp.suffix.empty()) j["suffix"] = rp.suffix;
    if (rp.max_lines != 0) j["max_lines"] = rp.max_lines;
    if (rp.stop_on_dedent) j["stop_on_dedent"] = true;
    return j;
}

daemon_process::options engine_daemon(const std::string& model = COLIBRI_DAEMON_TEST_MODEL) {
    return {{"--model", model}, {"--worker-exe", COLIBRI_WORKER_EXE}, {"--threads", "1"}};
}

/// Runs one request to its final event; returns that event with the streamed text under "text".
json complete(client& c, const json& id, const reference_params& rp, json extra = json::object()) {
    json req = request_for(id, rp);
    req.update(extra);
    c.send(req);
    auto events = c.until_final(id, std::chrono::seconds(30));
    json last = events.back();
    last["text"] = concat_pieces(events);
    return last;
}

/// Source files of some length: distinct code on every line.
std::string source_file(const std::string& name, int lines) {
    std::string s;
    for (int i = 0; i < lines; ++i)
        s += "def " + name + "_" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n";
    return s;
}

} // namespace

TEST_CASE("engine: status describes the real model") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    auto status = c.call({{"id", 1}, {"op", "status"}});
    CHECK(status["model"]["architecture"] == "llama");
    CHECK(status["model"]["n_layer"] == 2);
    CHECK(status["model"]["quant"] == "f32");
    CHECK(status["model"]["n_ctx"] == 256); // a cache slot's: the model's, as it is under 4096
    CHECK(status["model"]["n_ctx_train"] == 256);
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

TEST_CASE("engine: a prompt and suffix that spell control tokens are completed as text") {
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = "END = '</s>'\nFIM = ('<fim_prefix>', '<fim_suffix>', \"";
    rp.suffix = "<fim_middle>\")\n";
    rp.max_tokens = 8;
    daemon_process d(engine_daemon(COLIBRI_DEFAULT_MODEL));
    client c(d.socket_path());
    const json done = complete(c, "fim", rp);
    REQUIRE(done["event"] == "done");
    int as_text = 0, parsed = 0;
    CHECK(done["text"] == in_process(rp, nullptr, &as_text));
    CHECK(done["usage"]["prompt_tokens"].get<int>() == as_text);
    rp.parse_special = true; // what the old behaviour read: five control tokens in the user's text
    in_process(rp, nullptr, &parsed);
    CHECK(as_text > parsed + 20);
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
    const std::vector<std::string> common = {
        "--max_tokens", "20", "--temperature", "0.7", "--seed", "99", "--top_k", "30", "--prompt", "for i in range("};
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

TEST_CASE("engine: each file keeps its own cache slot - evicted or restarted means cold - never wrong") {
    auto opts = engine_daemon(COLIBRI_DEFAULT_MODEL);
    opts["--cache-slots"] = "2";
    opts["--fim-order"] = "psm";
    daemon_process d(opts);
    client c(d.socket_path());
    auto fim = [](const std::string& name, const std::string& typed) {
        reference_params rp;
        rp.model = COLIBRI_DEFAULT_MODEL;
        rp.prompt = source_file(name, 4) + "def " + name + "_total(items):\n    " + typed;
        rp.suffix = "\n    return total\n";
        rp.max_tokens = 8;
        rp.fim_spm = 0;
        return rp;
    };
    // Prefix first, every prompt here starts with the same two tokens (<fim_prefix> and
    // "def"): a slot holding another file shares exactly those, and a replaced slot reuses
    // only them.
    auto run = [&](const reference_params& rp, int want_cached, const char* what) {
        CAPTURE(what);
        const json done = complete(c, what, rp);
        REQUIRE(done["event"] == "done");
        if (want_cached >= 0) CHECK(done["usage"]["cached_tokens"] == want_cached);
        CHECK(done["text"] == in_process(rp));
        return done["usage"]["cached_tokens"].get<int>();
    };
    run(fim("alpha", "t"), 0, "alpha");
    run(fim("beta", "t"), 0, "beta: a fresh slot, not alpha's");
    CHECK(run(fim("alpha", "to"), -1, "alpha typed on") > 40);
    CHECK(run(fim("beta", "to"), -1, "beta typed on") > 40);
    run(fim("gamma", "t"), 2, "gamma replaces alpha, the least recently used");
    run(fim("alpha", "tot"), 2, "alpha again: cold, it replaces beta");
    json status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["cache"]["slots"] == 2);
    CHECK(status["cache"]["slots_used"] == 2);
    CHECK(status["cache"]["requests"] == 6);
    CHECK(status["cache"]["hits"] == 4);
    CHECK(status["cache"]["evictions"] == 2);
    CHECK(status["cache"]["memory_bytes"].get<std::int64_t>() ==
          (status["cache"]["slot_tokens"][0].get<std::int64_t>() +
           status["cache"]["slot_tokens"][1].get<std::int64_t>()) *
              status["cache"]["token_bytes"].get<std::int64_t>());
    CHECK(status["cache"]["hit_rate"].get<double>() > 0.3);

    // A crashed worker comes back with an empty cache: the next request is cold, not wrong.
    json crash = request_for("crash", fim("alpha", "tot"));
    crash["debug_fault"] = {{"kind", "crash"}, {"after_tokens", 1}};
    c.send(crash);
    CHECK(c.until_final("crash", std::chrono::seconds(20)).back()["code"] == "worker_crashed");
    run(fim("alpha", "tota"), 0, "after the restart");
    status = c.call({{"id", "s2"}, {"op", "status"}});
    CHECK(status["cache"]["requests"] == 1);
    CHECK(status["worker"]["restarts"] == 1);
}

TEST_CASE("engine: the memory cap empties the least recently used slot") {
    auto opts = engine_daemon(COLIBRI_DEFAULT_MODEL);
    opts["--cache-memory-mb"] = "1";
    daemon_process d(opts);
    client c(d.socket_path());
    reference_params a, b;
    a.model = b.model = COLIBRI_DEFAULT_MODEL;
    a.prompt = source_file("first", 32);
    b.prompt = source_file("second", 32);
    a.max_tokens = b.max_tokens = 4;
    const json da = complete(c, "a", a);
    const json cache = c.call({{"id", "s0"}, {"op", "status"}})["cache"];
    const std::int64_t one =
        (da["usage"]["prompt_tokens"].get<std::int64_t>() + 4) * cache["token_bytes"].get<std::int64_t>();
    REQUIRE(one <= cache["memory_cap_bytes"].get<std::int64_t>());    // one such prompt fits
    REQUIRE(2 * one > cache["memory_cap_bytes"].get<std::int64_t>()); // two exceed the cap
    CHECK(complete(c, "b", b)["usage"]["cached_tokens"] == 0);
    a.prompt += "def";
    const json again = complete(c, "a2", a);
    CHECK(again["usage"]["cached_tokens"] == 0); // emptied to make room for b
    CHECK(again["text"] == in_process(a));
    const json status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["cache"]["evictions"].get<int>() >= 2);
    CHECK(status["cache"]["slots_used"] == 1);
    CHECK(status["cache"]["memory_bytes"].get<std::int64_t>() <=
          status["cache"]["memory_cap_bytes"].get<std::int64_t>());
}

TEST_CASE("engine: a newer request in the same session cancels the older one at once") {
    daemon_process d(engine_daemon());
    client c(d.socket_path());
    reference_params rp;
    rp.prompt = "int main() {";
    rp.max_tokens = 200;
    json slow = request_for("old", rp);
    slow["session"] = "buffer-7";
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 20}};
    c.send(slow);
    auto first = c.next(std::chrono::seconds(20));
    REQUIRE(first.has_value());
    CHECK((*first)["event"] == "piece");
    // Another session does not touch it; the same session supersedes it.
    rp.max_tokens = 4;
    json other = request_for("other", rp);
    other["session"] = "buffer-8";
    c.send(other);
    json newer = request_for("new", rp);
    newer["session"] = "buffer-7";
    c.send(newer);
    const auto old_events = c.until_final("old", std::chrono::seconds(20));
    CHECK(old_events.back()["finish_reason"] == "cancelled");
    CHECK(old_events.size() < 50);
    const auto other_events = c.until_final("other", std::chrono::seconds(20));
    CHECK(other_events.back()["event"] == "done");
    CHECK(other_events.back()["finish_reason"] != "cancelled");
    const auto new_events = c.until_final("new", std::chrono::seconds(20));
    CHECK(new_events.back()["event"] == "done");
    CHECK(concat_pieces(new_events) == in_process(rp));
    const json status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["requests"]["superseded"] == 1);
    CHECK(status["requests"]["cancelled"] == 1);
}

TEST_CASE("engine: a warm-up request fills a slot that the next request reuses") {
    daemon_process d(engine_daemon(COLIBRI_DEFAULT_MODEL));
    client c(d.socket_path());
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = source_file("warm", 3);
    rp.max_tokens = 0;
    c.send(request_for("w", rp));
    const auto warm = c.until_final("w", std::chrono::seconds(20));
    REQUIRE(warm.size() == 1); // no pieces
    CHECK(warm.back()["event"] == "done");
    CHECK(warm.back()["usage"]["completion_tokens"] == 0);
    const int warmed = warm.back()["usage"]["prompt_tokens"].get<int>();
    rp.prompt += "def";
    rp.max_tokens = 6;
    const json done = complete(c, "real", rp);
    CHECK(done["usage"]["cached_tokens"].get<int>() >= warmed - 1);
    CHECK(done["text"] == in_process(rp));
}

TEST_CASE("engine: line limits through the daemon cut where the engine cuts") {
    daemon_process d(engine_daemon(COLIBRI_DEFAULT_MODEL));
    client c(d.socket_path());
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = "class Stack:\n    def push(self, item):\n        ";
    rp.max_tokens = 48;
    const json full = complete(c, "full", rp);
    REQUIRE(full["text"].get<std::string>().find('\n') != std::string::npos);
    rp.max_lines = 1;
    const json one = complete(c, "one", rp);
    CHECK(one["text"].get<std::string>().find('\n') == std::string::npos);
    CHECK(one["finish_reason"] == "stop");
    CHECK(one["text"] == in_process(rp));
    rp.max_lines = 0;
    rp.stop_on_dedent = true;
    CHECK(complete(c, "dedent", rp)["text"] == in_process(rp));
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

TEST_CASE("engine: without --fim-order the daemon uses the FIM order the model file records") {
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = "def total(items):\n    t";
    rp.suffix = "\n    return t\n";
    rp.max_tokens = 8;
    daemon_process d(engine_daemon(COLIBRI_DEFAULT_MODEL));
    client c(d.socket_path());
    CHECK(c.call({{"id", "s"}, {"op", "status"}})["model"]["fim_order"] == "spm"); // the default model's
    const json done = complete(c, "auto", rp);
    reference_params spm = rp;
    spm.fim_spm = 1;
    CHECK(done["text"] == in_process(spm));
}

TEST_CASE("engine: --prompt-batch sets how many prompt tokens the sessions take at once and leaves the text alone") {
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = source_file("batch", 2) + "def total(items):\n    t";
    rp.max_tokens = 6;
    rp.fim_spm = 1;
    for (const char* batch : {"", "3"}) {
        CAPTURE(batch);
        auto opts = engine_daemon(COLIBRI_DEFAULT_MODEL);
        if (*batch) opts["--prompt-batch"] = batch;
        daemon_process d(opts);
        client c(d.socket_path());
        CHECK(c.call({{"id", "s"}, {"op", "status"}})["model"]["prompt_batch"] == (*batch ? 3 : 128));
        const json done = complete(c, "b", rp);
        CHECK(done["usage"]["prompt_tokens"].get<int>() > 30); // several batches of 3
        CHECK(done["text"] == in_process(rp));
    }
}

TEST_CASE("engine: suffix-first FIM keeps the cache valid up to the cursor as the user types") {
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = source_file("psm", 2) + "def total(items):\n    t";
    rp.suffix = "\n    return t\n\n" + source_file("after", 3);
    rp.max_tokens = 6;
    int cached[2] = {0, 0};
    for (const bool spm : {false, true}) {
        CAPTURE(spm);
        auto opts = engine_daemon(COLIBRI_DEFAULT_MODEL);
        opts["--fim-order"] = spm ? "spm" : "psm";
        daemon_process d(opts);
        client c(d.socket_path());
        CHECK(c.call({{"id", "s"}, {"op", "status"}})["model"]["fim_order"] == (spm ? "spm" : "psm"));
        reference_params typed = rp;
        typed.fim_spm = spm ? 1 : 0;
        complete(c, "first", typed);
        typed.prompt += "o";
        const json done = complete(c, "typed", typed);
        cached[spm] = done["usage"]["cached_tokens"].get<int>();
        CHECK(done["text"] == in_process(typed));
        if (spm) CHECK(cached[1] >= done["usage"]["prompt_tokens"].get<int>() - 3); // all but the typed end
    }
    // prefix-suffix-middle recomputes the whole suffix after the cursor
    CHECK(cached[0] < cached[1] - 30);
}

TEST_CASE("engine: a copy-heavy completion is drafted from its context, with the text of plain decoding, counted in "
          "usage and status") {
    // a prompt whose completion by the default model repeats itself (drafts pay there: on
    // text they would not, the engine drafts nothing)
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = "class Stack:\n    def push(self, item):\n        self.items.append(item)\n"
                "        self.size += 1\n        return self\n\n\nclass Queue:\n    def push(self, item):\n";
    rp.max_tokens = 48;
    const std::string plain = in_process(rp);
    {
        daemon_process d(engine_daemon(COLIBRI_DEFAULT_MODEL));
        client c(d.socket_path());
        const json spec = complete(c, "spec", rp);
        REQUIRE(spec["event"] == "done");
        CHECK(spec["text"] == plain);
        const int drafted = spec["usage"]["drafted_tokens"].get<int>(),
                  accepted = spec["usage"]["accepted_tokens"].get<int>();
        CHECK(drafted > 0);
        CHECK(accepted > 0);
        CHECK(accepted <= drafted);
        const json off = complete(c, "off", rp, {{"speculative", false}});
        CHECK(off["text"] == plain);
        CHECK(off["usage"]["drafted_tokens"] == 0);
        const json status = c.call({{"id", 3}, {"op", "status"}});
        CHECK(status["tokens"]["drafted"] == drafted);
        CHECK(status["tokens"]["accepted"] == accepted);
        CHECK(status["tokens"]["acceptance_rate"].get<double>() == doctest::Approx(double(accepted) / drafted));
    }
    auto opts = engine_daemon(COLIBRI_DEFAULT_MODEL);
    opts["--speculative"] = "false";
    daemon_process d(opts);
    client c(d.socket_path());
    const json off = complete(c, "daemon-off", rp);
    CHECK(off["text"] == plain);
    CHECK(off["usage"]["drafted_tokens"] == 0);
}

TEST_CASE("engine over HTTP: /infill with llama.vim's extra chunks gives the in-process completion with context") {
    temp_dir dir;
    const std::string http = dir.path() + "/http.sock";
    auto opts = engine_daemon(COLIBRI_DEFAULT_MODEL);
    opts["--http"] = "unix:" + http;
    daemon_process d(opts);
    reference_params rp;
    rp.model = COLIBRI_DEFAULT_MODEL;
    rp.prompt = "def total(items):\n    ";
    rp.suffix = "\n\nprint(total([1, 2]))\n";
    rp.max_tokens = 24;
    rp.min_indent = 4;
    rp.context = {{"util.py", "def count(items):\n    return len(items)\n"}, {"", "values = [3, 4]\n"}};
    int n_prompt_with = 0, n_prompt_without = 0;
    const std::string want = in_process(rp, nullptr, &n_prompt_with);
    auto without = rp;
    without.context.clear();
    in_process(without, nullptr, &n_prompt_without);
    CHECK(n_prompt_with > n_prompt_without + 10); // the chunks are in the prompt

    const json body = {
        {"input_prefix", "def total(items):\n"},
        {"input_suffix", rp.suffix},
        {"prompt", "    "},
        {"input_extra", json::array({{{"filename", "util.py"}, {"text", rp.context[0].second}, {"time", 1}},
                                     {{"text", rp.context[1].second}}})},
        {"n_predict", rp.max_tokens},
        {"n_indent", 4},
        {"temperature", 0},
        {"samplers", {"top_k", "top_p", "infill"}},
        {"cache_prompt", true}};
    auto r = http_call(http, "POST", "/infill", body.dump(), {}, std::chrono::seconds(30));
    REQUIRE(r.status == 200);
    const json j = r.json_body();
    CHECK(j["content"] == want);
    CHECK(j["tokens_evaluated"] == n_prompt_with);

    // The same request again reuses the cached prompt.
    auto again = http_call(http, "POST", "/infill", body.dump(), {}, std::chrono::seconds(30));
    CHECK(again.json_body()["content"] == want);
    CHECK(again.json_body()["timings"]["cache_n"].get<int>() >= n_prompt_with - 1);
}
