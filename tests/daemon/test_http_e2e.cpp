// End-to-end: colibrid's HTTP front (llama-server's /infill and /completion, OpenAI's
// /v1/completions) on a Unix socket, against the fake worker.

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;
namespace p = colibri::protocol;

namespace {

std::string expected_text(const std::string& prompt, const std::string& suffix, int max_tokens, std::uint64_t seed) {
    p::complete_request req;
    req.prompt = prompt;
    req.suffix = suffix;
    req.max_tokens = max_tokens;
    return make_fake_completion(req, seed).text();
}

json status_of(const daemon_process& d) {
    client c(d.socket_path());
    return c.call({{"id", "s"}, {"op", "status"}});
}

} // namespace

/// A private directory for the HTTP socket, made before the daemon starts.
class http_fixture {
public:
    explicit http_fixture(daemon_process::options extra = {}) : path_(dir_.path() + "/http.sock") {
        extra["--http"] = "unix:" + path_;
        d_ = std::make_unique<daemon_process>(extra);
    }
    daemon_process& d() { return *d_; }
    const std::string& http() const { return path_; }

private:
    temp_dir dir_;
    std::string path_;
    std::unique_ptr<daemon_process> d_;
};

TEST_CASE("HTTP: health, models, unknown paths and methods") {
    http_fixture f;
    struct stat st {};
    REQUIRE(::stat(f.http().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600); // owner only, as the protocol socket

    auto health = http_call(f.http(), "GET", "/health");
    CHECK(health.status == 200);
    CHECK(health.json_body() == json{{"status", "ok"}});
    CHECK(health.headers["content-type"] == "application/json");

    auto models = http_call(f.http(), "GET", "/v1/models");
    CHECK(models.status == 200);
    const json m = models.json_body();
    CHECK(m["object"] == "list");
    REQUIRE(m["data"].size() == 1);
    CHECK(m["data"][0]["object"] == "model");
    CHECK(m["data"][0]["meta"]["architecture"] == "fake");

    auto missing = http_call(f.http(), "GET", "/nothing");
    CHECK(missing.status == 404);
    CHECK(missing.json_body()["error"]["type"] == "not_found");
    CHECK(http_call(f.http(), "GET", "/infill").status == 405);
    CHECK(http_call(f.http(), "POST", "/health").status == 405);

    const json status = status_of(f.d());
    CHECK(status["http"]["listen"] == "unix:" + f.http());
}

TEST_CASE("HTTP /infill answers llama.vim's request with llama-server's fields") {
    http_fixture f;
    const json req = {{"input_prefix", "def f(x):\n"},
                      {"input_suffix", "\n"},
                      {"input_extra", json::array({{{"text", "a = 1\n"}, {"time", 1.5}, {"filename", "a.py"}}})},
                      {"prompt", "    "},
                      {"n_predict", 12},
                      {"n_indent", 4},
                      {"seed", 7},
                      {"stream", false},
                      {"samplers", {"top_k", "top_p", "infill"}},
                      {"cache_prompt", true},
                      {"t_max_prompt_ms", 500},
                      {"t_max_predict_ms", 3000}};
    auto r = http_call(f.http(), "POST", "/infill", req.dump());
    REQUIRE(r.status == 200);
    const json j = r.json_body();
    CHECK(j["content"] == expected_text("def f(x):\n    ", "\n", 12, 7));
    CHECK(j["stop"] == true);
    CHECK(j["stop_type"] == "limit");
    CHECK(j["tokens_predicted"] == 12);
    CHECK(j["truncated"] == false);
    CHECK(j["timings"]["predicted_n"] == 12);
    CHECK(j.contains("tokens_cached"));

    // llama.vim's response_fields: those paths alone, each under its whole path
    json fields = req;
    fields["response_fields"] = {"content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "no/such"};
    auto rf = http_call(f.http(), "POST", "/infill", fields.dump());
    REQUIRE(rf.status == 200);
    const json k = rf.json_body();
    CHECK(k.size() == 4);
    CHECK(k["content"] == j["content"]);
    CHECK(k["timings/predicted_n"] == 12);
    CHECK(k["timings/prompt_n"].is_number_integer());
    CHECK(k.contains("tokens_cached"));
    fields["response_fields"] = "content";
    CHECK(http_call(f.http(), "POST", "/infill", fields.dump()).status == 400);
}

TEST_CASE("HTTP /completion streams SSE events whose content joins to the completion") {
    http_fixture f;
    auto r = http_call(f.http(), "POST", "/completion",
                       json{{"prompt", "int main() {"}, {"n_predict", 20}, {"seed", 3}, {"stream", true}}.dump());
    REQUIRE(r.status == 200);
    CHECK(r.headers["content-type"] == "text/event-stream");
    CHECK(r.headers["transfer-encoding"] == "chunked");
    const auto events = sse_data(r.body);
    REQUIRE(events.size() == 21);
    std::string text;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        const json e = json::parse(events[i]);
        CHECK(e["stop"] == false);
        text += e["content"].get<std::string>();
    }
    CHECK(text == expected_text("int main() {", "", 20, 3));
    const json last = json::parse(events.back());
    CHECK(last["stop"] == true);
    CHECK(last["content"] == "");
    CHECK(last["tokens_predicted"] == 20);
}

TEST_CASE("HTTP /v1/completions: one body, or SSE chunks with usage and [DONE]") {
    http_fixture f;
    const json req = {{"model", "whatever"}, {"prompt", "x = "}, {"suffix", ";\n"},
                      {"max_tokens", 5},     {"seed", 9},        {"stop", "\n"}};
    auto r = http_call(f.http(), "POST", "/v1/completions", req.dump());
    REQUIRE(r.status == 200);
    const json j = r.json_body();
    CHECK(j["object"] == "text_completion");
    CHECK(j["model"] == "whatever");
    CHECK(j["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    p::complete_request want;
    want.prompt = "x = ";
    want.suffix = ";\n";
    want.max_tokens = 5;
    want.stop = {"\n"};
    const auto expected = make_fake_completion(want, 9);
    CHECK(j["choices"][0]["text"] == expected.text());
    CHECK(j["choices"][0]["finish_reason"] == (expected.reason == p::finish_reason::stop ? "stop" : "length"));
    CHECK(j["usage"]["completion_tokens"] == static_cast<int>(expected.pieces.size()));
    CHECK(j["usage"]["total_tokens"] ==
          j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

    json stream_req = req;
    stream_req["stream"] = true;
    stream_req["stream_options"] = {{"include_usage", true}};
    stream_req.erase("stop");
    auto s = http_call(f.http(), "POST", "/v1/completions", stream_req.dump());
    REQUIRE(s.status == 200);
    const auto events = sse_data(s.body);
    REQUIRE(events.size() == 5 + 3);
    std::string text;
    for (int i = 0; i < 5; ++i) {
        const json e = json::parse(events[static_cast<size_t>(i)]);
        CHECK(e["choices"][0]["finish_reason"].is_null());
        text += e["choices"][0]["text"].get<std::string>();
    }
    CHECK(text == expected_text("x = ", ";\n", 5, 9));
    CHECK(json::parse(events[5])["choices"][0]["finish_reason"] == "length");
    CHECK(json::parse(events[6])["usage"]["completion_tokens"] == 5);
    CHECK(events[7] == "[DONE]");
}

TEST_CASE("HTTP errors: bad bodies 400, oversized 413, a worker error with its code") {
    http_fixture f(daemon_process::options{{"--max-line-bytes", "2048"}});
    auto bad = http_call(f.http(), "POST", "/completion", "{not json");
    CHECK(bad.status == 400);
    CHECK(bad.json_body()["error"]["type"] == "invalid_json");
    auto field = http_call(f.http(), "POST", "/completion", R"({"prompt":"x","n_predict":"many"})");
    CHECK(field.status == 400);
    CHECK(field.json_body()["error"]["message"] == "'n_predict' must be an integer");
    auto big = http_call(f.http(), "POST", "/completion", json{{"prompt", std::string(4000, 'a')}}.dump());
    CHECK(big.status == 413);
    CHECK(big.json_body()["error"]["type"] == "too_large");
    auto refused = http_call(f.http(), "POST", "/completion", R"({"prompt":"reject me","n_predict":3})");
    CHECK(refused.status == 400);
    CHECK(refused.json_body()["error"]["message"] == "the fake refuses this prompt");
    // The daemon still serves.
    CHECK(http_call(f.http(), "POST", "/completion", R"({"prompt":"y","n_predict":2})").status == 200);
}

TEST_CASE("HTTP keep-alive: pipelined requests on one connection are answered in order") {
    http_fixture f;
    client c(f.http());
    c.send_raw(http_request_bytes("POST", "/completion", R"({"prompt":"a","n_predict":3,"seed":1})", true) +
               http_request_bytes("GET", "/health", "", true) +
               http_request_bytes("POST", "/completion", R"({"prompt":"b","n_predict":4,"seed":1})", false));
    const auto responses = parse_http_responses(c.read_to_eof());
    REQUIRE(responses.size() == 3);
    CHECK(responses[0].json_body()["content"] == expected_text("a", "", 3, 1));
    CHECK(responses[1].json_body()["status"] == "ok");
    CHECK(responses[2].json_body()["content"] == expected_text("b", "", 4, 1));
}

TEST_CASE("HTTP: a client that closes the connection mid-stream cancels its completion at once") {
    http_fixture f;
    {
        client c(f.http());
        c.send_raw(http_request_bytes("POST", "/completion",
                                      json{{"prompt", "slow"},
                                           {"n_predict", 1000},
                                           {"stream", true},
                                           {"debug_fault", {{"kind", "slow"}, {"delay_ms", 20}}}}
                                          .dump(),
                                      true));
        c.read_until("data: ");
    } // closed
    json st;
    for (int i = 0; i < 200; ++i) {
        st = status_of(f.d());
        if (st["requests"]["cancelled"] == 1 && st["in_flight"] == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(st["requests"]["cancelled"] == 1);
    CHECK(st["in_flight"] == 0);
    // The next request is served at once (the cancelled one is not still running).
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(http_call(f.http(), "POST", "/completion", R"({"prompt":"next","n_predict":2})").status == 200);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
}

TEST_CASE("HTTP t_max_predict_ms: past the time the completion ends once it holds a newline") {
    http_fixture f;
    const json req = {{"prompt", "p"},
                      {"n_predict", 300},
                      {"seed", 5},
                      {"t_max_predict_ms", 100},
                      {"debug_fault", {{"kind", "slow"}, {"delay_ms", 10}}}};
    auto r = http_call(f.http(), "POST", "/completion", req.dump());
    REQUIRE(r.status == 200);
    const json j = r.json_body();
    const std::string text = j["content"];
    const std::string full = expected_text("p", "", 300, 5);
    CHECK(j["stop_type"] == "limit");
    CHECK(text.size() < full.size());
    CHECK(full.compare(0, text.size(), text) == 0); // what came is the completion's start
    REQUIRE_FALSE(text.empty());
    CHECK(text.back() == '\n');           // ended with a piece holding a newline: never in mid-line
    const json status = status_of(f.d()); // served, not cancelled
    CHECK(status["requests"]["served"] == 1);
    CHECK(status["requests"]["cancelled"] == 0);
}

TEST_CASE("HTTP with an API key: 401 without it or with a wrong one; /health stays public") {
    temp_dir keys;
    const std::string key_file = keys.path() + "/key";
    std::ofstream(key_file) << "s3cret-key\n";
    http_fixture f(daemon_process::options{{"--api-key-file", key_file}});
    const std::string body = R"({"prompt":"x","n_predict":1})";
    auto none = http_call(f.http(), "POST", "/completion", body);
    CHECK(none.status == 401);
    CHECK(none.headers["www-authenticate"] == "Bearer");
    CHECK(none.json_body()["error"]["type"] == "unauthorized");
    CHECK(http_call(f.http(), "POST", "/completion", body, {"Authorization: Bearer wrong"}).status == 401);
    CHECK(http_call(f.http(), "GET", "/v1/models", "", {"Authorization: Bearer s3cret-ke"}).status == 401);
    CHECK(http_call(f.http(), "POST", "/completion", body, {"Authorization: Bearer s3cret-key"}).status == 200);
    CHECK(http_call(f.http(), "POST", "/completion", body, {"X-Api-Key: s3cret-key"}).status == 200);
    CHECK(http_call(f.http(), "POST", "/completion", body, {"Authorization: s3cret-key"}).status ==
          200); // as llama-server
    CHECK(http_call(f.http(), "POST", "/completion", body, {"Authorization: Basic s3cret-key"}).status == 401);
    CHECK(http_call(f.http(), "GET", "/health").status == 200);
}

TEST_CASE("HTTP on an address other machines reach needs an API key: colibrid refuses to start") {
    temp_dir dir;
    const std::string model = dir.path() + "/m.colibri";
    std::ofstream(model) << "fake model\n";
    const auto r = run_command({COLIBRID_EXE, "--model", model, "--socket", dir.path() + "/s.sock", "--worker-exe",
                                COLIBRI_TEST_WORKER_EXE, "--http", "0.0.0.0:18012"},
                               std::chrono::seconds(10));
    CHECK(WEXITSTATUS(r.status) == 1);
    CHECK(r.err.find("--api-key-file") != std::string::npos);
    const auto bad = run_command({COLIBRID_EXE, "--model", model, "--http", "nowhere"}, std::chrono::seconds(10));
    CHECK(WEXITSTATUS(bad.status) == 2);
    CHECK(bad.err.find("--http") != std::string::npos);
    // a key file with HTTP off is a mistake in the configuration: status 2, which systemd does not retry
    const auto keyless = run_command({COLIBRID_EXE, "--model", model, "--socket", dir.path() + "/k.sock",
                                      "--worker-exe", COLIBRI_TEST_WORKER_EXE, "--api-key-file", model},
                                     std::chrono::seconds(10));
    CHECK(WEXITSTATUS(keyless.status) == 2);
    CHECK(keyless.err.find("--api-key-file is for HTTP, which is off") != std::string::npos);
}

TEST_CASE("HTTP: a client that sends nothing is closed after --http-timeout-ms") {
    http_fixture f(daemon_process::options{{"--http-timeout-ms", "200"}});
    client c(f.http());
    c.send_raw("POST /completion HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":");
    CHECK(c.wait_closed(std::chrono::seconds(3)));
    CHECK(http_call(f.http(), "GET", "/health").status == 200);
}

TEST_CASE("HTTP Expect: 100-continue gets its 100 before the body is sent") {
    http_fixture f;
    client c(f.http());
    const std::string body = R"({"prompt":"e","n_predict":2,"seed":1})";
    c.send_raw("POST /completion HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
               "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n");
    CHECK(c.read_until("\r\n\r\n", std::chrono::seconds(2)) == "HTTP/1.1 100 Continue\r\n\r\n");
    c.send_raw(body);
    const auto responses = parse_http_responses(c.read_to_eof());
    REQUIRE(responses.size() == 1);
    CHECK(responses[0].json_body()["content"] == expected_text("e", "", 2, 1));
}
