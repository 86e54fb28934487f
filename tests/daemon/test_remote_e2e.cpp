// End-to-end: colibrid --backend openai, completing through a fake OpenAI-compatible server
// (fake_upstream.hpp) with the real colibri-worker: streaming, cancel, local line limits,
// errors, and failover between upstreams.

#include <doctest/doctest.h>

#include <fstream>
#include <thread>

#include "fake_upstream.hpp"
#include "harness.hpp"

using namespace colibri::test;
using namespace std::chrono_literals;

namespace {

daemon_process::options remote_daemon(const std::string& upstream, const std::string& model = "") {
    daemon_process::options o = {
        {"--backend", "openai"}, {"--worker-exe", COLIBRI_WORKER_EXE}, {"--upstream", upstream}};
    o["--model"] = model.empty() ? "<remove>" : model; // none: the upstream's own
    return o;
}

/// A port nothing listens on.
int dead_port() {
    fake_upstream f({});
    return f.port();
}

json run(client& c, const json& id, json req) {
    req["id"] = id;
    req["op"] = "complete";
    c.send(req);
    auto events = c.until_final(id, 20s);
    json last = events.back();
    last["text"] = concat_pieces(events);
    return last;
}

} // namespace

TEST_CASE("remote: the upstream's stream arrives as pieces, with its usage; the request carries the model and FIM") {
    fake_upstream up({});
    daemon_process d(remote_daemon(up.url(), "qwen2.5-coder"), true, "");
    client c(d.socket_path());
    const json done = run(c, 1,
                          {{"prompt", "def f"},
                           {"suffix", "\n"},
                           {"max_tokens", 30},
                           {"temperature", 0},
                           {"stop", {"\n\n"}},
                           {"seed", 3}});
    CHECK(done["event"] == "done");
    CHECK(done["text"] == "def f(x):\n    return x\n");
    CHECK(done["finish_reason"] == "length");
    CHECK(done["usage"]["completion_tokens"] == 4);
    CHECK(done["usage"]["prompt_tokens"] == 7);
    const auto reqs = up.requests();
    REQUIRE(reqs.size() == 1);
    CHECK(reqs[0]["model"] == "qwen2.5-coder");
    CHECK(reqs[0]["prompt"] == "def f");
    CHECK(reqs[0]["suffix"] == "\n");
    CHECK(reqs[0]["max_tokens"] == 30);
    CHECK(reqs[0]["stream"] == true);
    CHECK(reqs[0]["stop"] == json::array({"\n\n"}));
    CHECK(reqs[0]["seed"] == 3);
    // A warm-up asks the server for one token (its prefix cache keeps the prompt) and shows none.
    const json warm = run(c, 2, {{"prompt", "def f"}, {"max_tokens", 0}});
    CHECK(warm["event"] == "done");
    CHECK(warm["text"] == "");
    CHECK(warm["usage"]["completion_tokens"] == 0);
    CHECK(up.requests().back()["max_tokens"] == 1);
    auto status = c.call({{"id", "s"}, {"op", "status"}});
    CHECK(status["model"]["backend"] == "openai");
    CHECK(status["model"]["upstreams"] == json::array({up.url()}));
}

TEST_CASE("remote: cancel closes the upstream request at once") {
    fake_upstream::script slow;
    slow.pieces.assign(100, "x");
    slow.delay_ms = 30;
    fake_upstream up(slow);
    daemon_process d(remote_daemon(up.url()), true, "");
    client c(d.socket_path());
    c.send({{"id", "s"}, {"op", "complete"}, {"prompt", "p"}, {"max_tokens", 100}});
    auto first = c.next(10s);
    REQUIRE(first.has_value());
    CHECK((*first)["event"] == "piece");
    c.send({{"id", "c"}, {"op", "cancel"}, {"target", "s"}});
    CHECK(c.until_final("s").back()["finish_reason"] == "cancelled");
    for (int i = 0; i < 200 && up.hung_up() == 0; ++i) std::this_thread::sleep_for(10ms);
    CHECK(up.hung_up() == 1);
    // The next request is served.
    CHECK(run(c, 2, {{"prompt", "q"}, {"max_tokens", 3}})["event"] == "done");
}

TEST_CASE("remote: max_lines and stop_on_dedent hold though the upstream knows neither") {
    fake_upstream::script s;
    s.pieces = {"a = 1\n", "    b = 2\n", "c = 3\n"};
    fake_upstream up(s);
    daemon_process d(remote_daemon(up.url()), true, "");
    client c(d.socket_path());
    CHECK(run(c, 1, {{"prompt", "x"}, {"max_lines", 2}})["text"] == "a = 1\n    b = 2");
    const json dedent = run(c, 2, {{"prompt", "def f():\n    "}, {"stop_on_dedent", true}});
    CHECK(dedent["text"] == "a = 1\n    b = 2");
    CHECK(dedent["finish_reason"] == "stop");
}

TEST_CASE("remote: an upstream's error is the request's, with its message; an unreachable one is unavailable") {
    fake_upstream::script bad;
    bad.status = 400;
    bad.error_message = "This model's maximum context length is 2048 tokens";
    fake_upstream up(bad);
    daemon_process d(remote_daemon(up.url()), true, "");
    client c(d.socket_path());
    const json e = run(c, 1, {{"prompt", "x"}});
    CHECK(e["event"] == "error");
    CHECK(e["code"] == "invalid_request");
    CHECK(e["message"].get<std::string>().find("maximum context length") != std::string::npos);

    daemon_process gone(remote_daemon("http://127.0.0.1:" + std::to_string(dead_port())), true, "");
    client g(gone.socket_path());
    const json u = run(g, 1, {{"prompt", "x"}});
    CHECK(u["event"] == "error");
    CHECK(u["code"] == "unavailable");
    CHECK(u["message"].get<std::string>().find("no upstream could be reached") != std::string::npos);
}

TEST_CASE("remote: with two upstreams one of which is down, every request is served; a returning one is used") {
    fake_upstream live({});
    const int port = dead_port();
    temp_dir dir;
    const std::string conf = dir.path() + "/colibrid.conf";
    std::ofstream(conf) << "upstream = http://127.0.0.1:" << port << "\nupstream = " << live.url() << "\n";
    daemon_process d(
        {{"--backend", "openai"}, {"--worker-exe", COLIBRI_WORKER_EXE}, {"--config", conf}, {"--model", "<remove>"}},
        true, "");
    client c(d.socket_path());
    for (int i = 0; i < 4; ++i) CHECK(run(c, i, {{"prompt", "x"}, {"max_tokens", 4}})["event"] == "done");
    CHECK(live.requests().size() == 4);
    // status and health say which is down, and why
    const json status = c.call({{"id", "s"}, {"op", "status"}});
    REQUIRE(status["upstreams"].size() == 2);
    CHECK(status["upstreams"][0]["state"] == "down");
    CHECK(status["upstreams"][0]["connect_failures"].get<int>() >= 1);
    CHECK(status["upstreams"][0]["last_error"].get<std::string>().find("refused") != std::string::npos);
    CHECK(status["upstreams"][1]["state"] == "up");
    CHECK(status["upstreams"][1]["requests"] == 4);
    CHECK(status["upstreams"][1]["first_piece_ms"].get<double>() > 0);
    const json health = c.call({{"id", "h"}, {"op", "health"}});
    CHECK(health["upstreams"][1] == json{{"url", live.url()}, {"state", "up"}});

    // The dead one comes back: after its backoff it takes its share again.
    fake_upstream back({}, port);
    std::this_thread::sleep_for(1500ms);
    for (int i = 0; i < 4; ++i) CHECK(run(c, 10 + i, {{"prompt", "y"}, {"max_tokens", 4}})["event"] == "done");
    CHECK(back.requests().size() >= 1);
    CHECK(live.requests().size() + back.requests().size() == 8);
}

TEST_CASE("remote: an https upstream, its certificate checked against the trusted ones") {
    temp_dir dir;
    const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
    const auto made =
        run_command({COLIBRI_OPENSSL_EXE, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                     "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"},
                    30s);
    REQUIRE_MESSAGE(made.status == 0, made.err);
    fake_upstream::script s;
    s.cert_file = cert;
    s.key_file = key;
    fake_upstream up(s);
    REQUIRE(up.url().rfind("https://localhost:", 0) == 0);

    auto trusted = remote_daemon(up.url());
    trusted["--upstream-ca-file"] = cert;
    daemon_process d(trusted, true, "");
    client c(d.socket_path());
    const json done = run(c, 1, {{"prompt", "def f"}, {"max_tokens", 8}});
    CHECK(done["event"] == "done");
    CHECK(done["text"] == "def f(x):\n    return x\n");

    // Without the certificate among the trusted ones, nothing is sent.
    daemon_process untrusting(remote_daemon(up.url()), true, "");
    client u(untrusting.socket_path());
    const json refused = run(u, 1, {{"prompt", "x"}});
    CHECK(refused["code"] == "unavailable");
    CHECK(refused["message"].get<std::string>().find("certificate") != std::string::npos);
    CHECK(up.requests().size() == 1);
}

TEST_CASE("remote: --upstream-fim builds the model's own FIM prompt, context files first, for servers without suffix") {
    fake_upstream up({});
    auto opts = remote_daemon(up.url());
    opts["--upstream-fim"] = "qwen";
    daemon_process d(opts, true, "");
    client c(d.socket_path());
    CHECK(run(c, 1,
              {{"prompt", "def f("},
               {"suffix", "):\n"},
               {"context", {{{"filename", "a.py"}, {"text", "A = 1\n"}}, {{"text", "B = 2\n"}}}}})["event"] == "done");
    CHECK(run(c, 2, {{"prompt", "import os\n"}})["event"] == "done");
    const auto reqs = up.requests();
    REQUIRE(reqs.size() == 2);
    CHECK(reqs[0]["prompt"] == "<|repo_name|>myproject\n<|file_sep|>a.py\nA = 1\n<|file_sep|>tmp\nB = 2\n"
                               "<|file_sep|>filename\n<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>");
    CHECK_FALSE(reqs[0].contains("suffix"));
    CHECK(reqs[1]["prompt"] == "import os\n"); // no suffix: a plain completion
}

TEST_CASE("remote: --upstream-fim auto takes the template the served model's tokenizer has") {
    fake_upstream up({});
    auto opts = remote_daemon(up.url());
    opts["--upstream-fim"] = "auto";
    SUBCASE("a tokenizer.json with Qwen's FIM tokens") {
        opts["--upstream-tokenizer"] = COLIBRI_FIXTURES_DIR "/tokenizers/qwen3/tokenizer.json";
        daemon_process d(opts, true, "");
        client c(d.socket_path());
        CHECK(run(c, 1, {{"prompt", "a"}, {"suffix", "b"}})["event"] == "done");
        CHECK(up.requests().at(0)["prompt"] == "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>");
    }
    SUBCASE("a GGUF file whose vocabulary has none: the servers get `suffix`") {
        opts["--upstream-tokenizer"] = COLIBRI_FIXTURES_DIR "/gguf/starcoder2.gguf";
        daemon_process d(opts, true, "");
        client c(d.socket_path());
        CHECK(run(c, 1, {{"prompt", "a"}, {"suffix", "b"}})["event"] == "done");
        CHECK(up.requests().at(0)["prompt"] == "a");
        CHECK(up.requests().at(0)["suffix"] == "b");
    }
}
