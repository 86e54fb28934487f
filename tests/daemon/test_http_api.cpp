// The HTTP dialects as translations: request bodies to complete requests, outcomes to
// llama-server's and OpenAI's response shapes.

#include <doctest/doctest.h>

#include "config.hpp"
#include "http_api.hpp"

namespace cd = colibri::daemon;
namespace p = colibri::protocol;
using nlohmann::json;

namespace {

cd::http_completion parse_ok(cd::http_api api, const json& body, const p::request_limits& limits = {}) {
    auto r = cd::parse_http_completion(api, body.dump(), limits);
    if (auto* e = std::get_if<p::request_error>(&r)) FAIL("unexpected error: " << e->message);
    return std::get<cd::http_completion>(r);
}

p::request_error parse_err(cd::http_api api, const std::string& body, const p::request_limits& limits = {}) {
    auto r = cd::parse_http_completion(api, body, limits);
    REQUIRE_MESSAGE(std::holds_alternative<p::request_error>(r), "accepted: " << body);
    return std::get<p::request_error>(r);
}

/// The JSON payloads of "data: ..." events ("[DONE]" as a string).
std::vector<json> sse_payloads(const std::string& events) {
    std::vector<json> out;
    for (size_t at = 0; (at = events.find("data: ", at)) != std::string::npos;) {
        const size_t end = events.find("\n\n", at);
        REQUIRE(end != std::string::npos);
        const std::string data = events.substr(at + 6, end - at - 6);
        out.push_back(data == "[DONE]" ? json(data) : json::parse(data));
        at = end + 2;
    }
    return out;
}

} // namespace

TEST_CASE("/infill as llama.vim sends it: the prompt continues the prefix, extra chunks become context") {
    const json body = {{"input_prefix", "def f(x):\n"},
                       {"input_suffix", "\nprint(f(2))\n"},
                       {"input_extra", json::array({{{"text", "def g(): pass\n"}, {"time", 12.5}, {"filename", "g.py"}},
                                                    {{"text", "y = 2\n"}}})},
                       {"prompt", "    return"},
                       {"n_predict", 64},
                       {"n_indent", 4},
                       {"top_k", 40},
                       {"top_p", 0.99},
                       {"stream", false},
                       {"samplers", {"top_k", "top_p", "infill"}},
                       {"cache_prompt", true},
                       {"t_max_prompt_ms", 500},
                       {"t_max_predict_ms", 3000}};
    const auto c = parse_ok(cd::http_api::infill, body);
    CHECK(c.req.prompt == "def f(x):\n    return");
    CHECK(c.req.suffix == "\nprint(f(2))\n");
    REQUIRE(c.req.context.size() == 2);
    CHECK(c.req.context[0] == p::context_file{"g.py", "def g(): pass\n"});
    CHECK(c.req.context[1] == p::context_file{"", "y = 2\n"});
    CHECK(c.req.max_tokens == 64);
    CHECK(c.req.min_indent == 4);
    CHECK(c.req.top_k == 40);
    CHECK(c.req.top_p == doctest::Approx(0.99));
    CHECK(c.req.temperature == doctest::Approx(0.8)); // llama-server's default, as the socket's
    CHECK(c.req.stream);                              // the front always streams from the worker
    CHECK_FALSE(c.stream);
    CHECK(c.max_predict_ms == 3000);
}

TEST_CASE("llama-server's conventions: n_predict -1 is the daemon's limit, seed -1 random, top_k -1 off") {
    p::request_limits limits;
    limits.max_tokens = 300;
    auto c = parse_ok(cd::http_api::completion,
                      {{"prompt", "x"}, {"n_predict", -1}, {"seed", -1}, {"top_k", -1}, {"temperature", -1}}, limits);
    CHECK(c.req.max_tokens == 300);
    CHECK_FALSE(c.req.seed.has_value());
    CHECK(c.req.top_k == 0);
    CHECK(c.req.temperature == 0.0f);
    CHECK(parse_ok(cd::http_api::completion, {{"prompt", "x"}}, limits).req.max_tokens == 300);
    // max_tokens stands for n_predict, which wins when both come
    CHECK(parse_ok(cd::http_api::completion, {{"prompt", "x"}, {"max_tokens", 7}}, limits).req.max_tokens == 7);
    CHECK(parse_ok(cd::http_api::infill,
                   {{"input_prefix", ""}, {"input_suffix", ""}, {"max_tokens", 5}, {"n_predict", 9}}, limits)
              .req.max_tokens == 9);
    c = parse_ok(cd::http_api::completion, {{"prompt", "x"}, {"seed", 42}, {"stop", {"\n\n"}}, {"stream", true}});
    CHECK(c.req.seed == 42u);
    CHECK(c.req.stop == std::vector<std::string>{"\n\n"});
    CHECK(c.stream);
    CHECK(c.req.speculative);
    CHECK_FALSE(parse_ok(cd::http_api::infill, {{"input_prefix", ""}, {"input_suffix", ""}, {"speculative", false}})
                    .req.speculative);
}

TEST_CASE("bad HTTP bodies get the socket protocol's codes, naming the client's fields") {
    using cd::http_api;
    CHECK(parse_err(http_api::infill, "{").code == p::error_code::invalid_json);
    CHECK(parse_err(http_api::infill, "[1]").code == p::error_code::invalid_request);
    CHECK(parse_err(http_api::infill, R"({"input_suffix":""})").message == "missing 'input_prefix'");
    CHECK(parse_err(http_api::infill, R"({"input_prefix":""})").message == "missing 'input_suffix'");
    CHECK(parse_err(http_api::completion, R"({"n_predict":1})").message == "missing 'prompt'");
    p::request_limits limits;
    limits.max_tokens = 100;
    const auto big = parse_err(http_api::completion, R"({"prompt":"x","n_predict":101})", limits);
    CHECK(big.code == p::error_code::invalid_request);
    CHECK(big.message.find("'n_predict'") != std::string::npos);
    CHECK(parse_err(http_api::completion, R"({"prompt":"x","n_indent":"4"})").message.find("'n_indent'") !=
          std::string::npos);
    CHECK(parse_err(http_api::infill, R"({"input_prefix":"","input_suffix":"","input_extra":[{"filename":"a"}]})")
              .message.find("\"text\"") != std::string::npos);
    CHECK(parse_err(http_api::completion, R"({"prompt":[1,2,3]})").message.find("token ids") != std::string::npos);
    CHECK(parse_err(http_api::completion, R"({"prompt":"x","grammar":"root ::= \"a\""})").message.find("'grammar'") !=
          std::string::npos);
    CHECK(parse_err(http_api::completion, R"({"prompt":"x","n_probs":5})").message.find("'n_probs'") !=
          std::string::npos);
    CHECK(parse_err(http_api::completion, R"({"prompt":"x","top_p":2})").message.find("'top_p'") != std::string::npos);
    CHECK(parse_err(http_api::completion, R"({"prompt":"x","stream":"yes"})").message.find("'stream'") !=
          std::string::npos);
    // Neutral values of unsupported fields, and unknown fields, pass.
    parse_ok(http_api::completion, {{"prompt", "x"},
                                    {"grammar", ""},
                                    {"n_probs", 0},
                                    {"mirostat", 0},
                                    {"typical_p", 1},
                                    {"some_future_field", {1, 2}}});
    // debug_fault is the socket's test field: unknown unless the daemon enables fault injection.
    CHECK(parse_err(http_api::completion, R"({"prompt":"x","debug_fault":{"kind":"crash"}})")
              .message.find("'debug_fault'") != std::string::npos);
}

TEST_CASE("/v1/completions: OpenAI's defaults and shapes") {
    using cd::http_api;
    auto c = parse_ok(http_api::openai_completion, {{"model", "anything"}, {"prompt", {"def f("}}, {"suffix", ")\n"}});
    CHECK(c.req.prompt == "def f(");
    CHECK(c.req.suffix == ")\n");
    CHECK(c.req.max_tokens == 16);
    CHECK(c.req.temperature == 1.0f);
    CHECK(c.req.top_p == 1.0f);
    CHECK(c.req.top_k == 0);
    CHECK(c.req.min_p == 0.0f);
    CHECK(c.model == "anything");
    c = parse_ok(http_api::openai_completion, {{"prompt", "x"},
                                               {"max_tokens", nullptr},
                                               {"stream", true},
                                               {"stream_options", {{"include_usage", true}}},
                                               {"n", 1},
                                               {"logprobs", nullptr},
                                               {"echo", false},
                                               {"user", "me"}});
    CHECK(c.req.max_tokens == 16);
    CHECK(c.stream);
    CHECK(c.include_usage);
    CHECK(parse_err(http_api::openai_completion, R"({"prompt":"x","n":2})").message.find("'n'") != std::string::npos);
    CHECK(parse_err(http_api::openai_completion, R"({"prompt":"x","echo":true})").message.find("'echo'") !=
          std::string::npos);
    CHECK(parse_err(http_api::openai_completion, R"({"prompt":"x","logprobs":2})").message.find("'logprobs'") !=
          std::string::npos);
    CHECK(parse_err(http_api::openai_completion, R"({"prompt":["a","b"]})").message.find("'prompt'") !=
          std::string::npos);
    CHECK(parse_err(http_api::openai_completion, R"({"prompt":"x","max_tokens":-1})").message.find("'max_tokens'") !=
          std::string::npos);
}

TEST_CASE("llama-server replies: content, stop_type, timings and the fields llama.vim reads") {
    p::complete_request req;
    req.max_tokens = 64;
    cd::http_reply r{cd::http_api::infill, "m", "cmpl-1", 1700000000, cd::http_generation_settings(req, 2048), {}};
    cd::http_outcome o;
    o.text = "return x\n";
    o.reason = p::finish_reason::length;
    o.usage = {40, 10, 30, 6, 4};
    o.timings.prefill_ms = 5;
    o.timings.decode_ms = 20;
    json j = cd::http_final_body(r, o);
    CHECK(j["content"] == "return x\n");
    CHECK(j["stop"] == true);
    CHECK(j["stop_type"] == "limit");
    CHECK(j["has_new_line"] == true);
    CHECK(j["truncated"] == false);
    CHECK(j["tokens_predicted"] == 10);
    CHECK(j["tokens_evaluated"] == 40);
    CHECK(j["tokens_cached"] == 50);
    CHECK(j["generation_settings"]["n_ctx"] == 2048); // llama.vim's "c: cached / n_ctx"
    CHECK(j["generation_settings"]["n_predict"] == 64);
    CHECK(j["timings"]["cache_n"] == 30);
    CHECK(j["timings"]["prompt_n"] == 10);
    CHECK(j["timings"]["prompt_ms"] == 5.0);
    CHECK(j["timings"]["prompt_per_second"] == doctest::Approx(2000.0));
    CHECK(j["timings"]["predicted_n"] == 10);
    CHECK(j["timings"]["predicted_per_second"] == doctest::Approx(500.0));
    CHECK(j["timings"]["draft_n"] == 6);
    CHECK(j["timings"]["draft_n_accepted"] == 4);
    o.reason = p::finish_reason::stop;
    CHECK(cd::http_final_body(r, o)["stop_type"] == "eos");
    o.time_limited = true;
    CHECK(cd::http_final_body(r, o)["stop_type"] == "limit");

    const auto piece = sse_payloads(cd::http_piece_event(r, "ret", 1));
    REQUIRE(piece.size() == 1);
    CHECK(piece[0]["content"] == "ret");
    CHECK(piece[0]["stop"] == false);
    const auto last = sse_payloads(cd::http_final_events(r, o, false));
    REQUIRE(last.size() == 1); // no [DONE] in llama-server's own stream
    CHECK(last[0]["stop"] == true);
    CHECK(last[0]["content"] == "");
}

TEST_CASE("OpenAI replies: text_completion objects, finish_reason, usage, and [DONE]") {
    cd::http_reply r{cd::http_api::openai_completion, "m", "cmpl-7", 1700000000, json::object(), {}};
    cd::http_outcome o;
    o.text = "x)";
    o.reason = p::finish_reason::stop;
    o.usage = {9, 2, 3, 0, 0};
    json j = cd::http_final_body(r, o);
    CHECK(j["object"] == "text_completion");
    CHECK(j["id"] == "cmpl-7");
    CHECK(j["created"] == 1700000000);
    CHECK(j["model"] == "m");
    REQUIRE(j["choices"].size() == 1);
    CHECK(j["choices"][0]["text"] == "x)");
    CHECK(j["choices"][0]["index"] == 0);
    CHECK(j["choices"][0]["logprobs"].is_null());
    CHECK(j["choices"][0]["finish_reason"] == "stop");
    CHECK(j["usage"] == json{{"prompt_tokens", 9},
                             {"completion_tokens", 2},
                             {"total_tokens", 11},
                             {"prompt_tokens_details", {{"cached_tokens", 3}}}});
    o.reason = p::finish_reason::timeout;
    CHECK(cd::http_final_body(r, o)["choices"][0]["finish_reason"] == "length");

    const auto piece = sse_payloads(cd::http_piece_event(r, "x", 1));
    CHECK(piece[0]["choices"][0]["text"] == "x");
    CHECK(piece[0]["choices"][0]["finish_reason"].is_null());
    auto end = sse_payloads(cd::http_final_events(r, o, true));
    REQUIRE(end.size() == 3);
    CHECK(end[0]["choices"][0]["finish_reason"] == "length");
    CHECK(end[1]["choices"].empty());
    CHECK(end[1]["usage"]["total_tokens"] == 11);
    CHECK(end[2] == "[DONE]");
    CHECK(sse_payloads(cd::http_final_events(r, o, false)).size() == 2);
}

TEST_CASE("error bodies and status codes") {
    CHECK(cd::http_status(p::error_code::invalid_request) == 400);
    CHECK(cd::http_status(p::error_code::invalid_json) == 400);
    CHECK(cd::http_status(p::error_code::too_large) == 413);
    CHECK(cd::http_status(p::error_code::busy) == 503);
    CHECK(cd::http_status(p::error_code::unavailable) == 503);
    CHECK(cd::http_status(p::error_code::timeout) == 504);
    CHECK(cd::http_status(p::error_code::worker_crashed) == 500);
    CHECK(cd::http_error_body(400, "invalid_request", "bad") ==
          json{{"error", {{"code", 400}, {"message", "bad"}, {"type", "invalid_request"}}}});
}

TEST_CASE("--http addresses") {
    auto a = cd::parse_http_address("127.0.0.1:8012");
    CHECK_FALSE(a.unix_socket);
    CHECK(a.host == "127.0.0.1");
    CHECK(a.port == 8012);
    a = cd::parse_http_address("[::1]:9000");
    CHECK(a.host == "::1");
    CHECK(a.port == 9000);
    a = cd::parse_http_address("unix:/run/colibri/http.sock");
    CHECK(a.unix_socket);
    CHECK(a.path == "/run/colibri/http.sock");
    for (const char* bad : {"8012", ":8012", "localhost:0", "localhost:65536", "localhost:80x", "unix:relative"})
        CHECK_THROWS_AS(cd::parse_http_address(bad), cd::config_error);
}
