#include <doctest/doctest.h>

#include <string>

#include "colibri/protocol/codec.hpp"

namespace p = colibri::protocol;
using nlohmann::json;

namespace {

p::request parse_ok(const std::string& line, const p::request_limits& limits = {}) {
    auto r = p::parse_request(line, limits);
    if (auto* e = std::get_if<p::request_error>(&r)) FAIL("unexpected error: " << e->message);
    return std::get<p::request>(r);
}

p::request_error parse_err(const std::string& line, const p::request_limits& limits = {}) {
    auto r = p::parse_request(line, limits);
    REQUIRE_MESSAGE(std::holds_alternative<p::request_error>(r), "accepted: " << line);
    return std::get<p::request_error>(r);
}

} // namespace

TEST_CASE("error code names are stable and round-trip") {
    CHECK(p::to_string(p::error_code::invalid_json) == "invalid_json");
    CHECK(p::to_string(p::error_code::invalid_request) == "invalid_request");
    CHECK(p::to_string(p::error_code::unknown_op) == "unknown_op");
    CHECK(p::to_string(p::error_code::unsupported_protocol) == "unsupported_protocol");
    CHECK(p::to_string(p::error_code::too_large) == "too_large");
    CHECK(p::to_string(p::error_code::busy) == "busy");
    CHECK(p::to_string(p::error_code::forbidden) == "forbidden");
    CHECK(p::to_string(p::error_code::worker_crashed) == "worker_crashed");
    CHECK(p::to_string(p::error_code::timeout) == "timeout");
    CHECK(p::to_string(p::error_code::unavailable) == "unavailable");
    CHECK(p::to_string(p::error_code::internal) == "internal");
    for (auto c : {p::error_code::invalid_json, p::error_code::busy, p::error_code::internal})
        CHECK(p::error_code_from_string(p::to_string(c)) == c);
    CHECK_FALSE(p::error_code_from_string("nope").has_value());
}

TEST_CASE("complete request: defaults") {
    auto req = parse_ok(R"({"id":"a1","op":"complete","prompt":"def f("})");
    CHECK(req.id == "a1");
    auto& c = std::get<p::complete_request>(req.body);
    CHECK(c.prompt == "def f(");
    CHECK(c.suffix.empty());
    CHECK(c.max_tokens == 128);
    CHECK(c.temperature == doctest::Approx(0.8));
    CHECK(c.top_p == doctest::Approx(0.95));
    CHECK(c.top_k == 40);
    CHECK(c.min_p == doctest::Approx(0.05));
    CHECK(c.repeat_penalty == 1.0f);
    CHECK_FALSE(c.seed.has_value());
    CHECK(c.stop.empty());
    CHECK(c.stream);
    CHECK_FALSE(c.timeout_ms.has_value());
    CHECK(c.fault.kind == p::fault_kind::none);
}

TEST_CASE("complete request: every field") {
    auto req = parse_ok(R"({"id":7,"op":"complete","prompt":"a\u00e9\ud83d\ude00","suffix":"}\n",
        "max_tokens":16,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,
        "repeat_penalty":1.1,"seed":18446744073709551615,"stop":["\n\n","}"],"stream":false,"timeout_ms":2500,
        "session":"nvim-12-3","max_lines":2,"stop_on_dedent":true,"speculative":false})");
    CHECK(req.id == 7);
    auto& c = std::get<p::complete_request>(req.body);
    CHECK(c.prompt == "a\xc3\xa9\xf0\x9f\x98\x80");
    CHECK(c.suffix == "}\n");
    CHECK(c.max_tokens == 16);
    CHECK(c.temperature == 0.0f);
    CHECK(c.top_p == doctest::Approx(0.5));
    CHECK(c.top_k == 3);
    CHECK(c.min_p == doctest::Approx(0.1));
    CHECK(c.repeat_penalty == doctest::Approx(1.1));
    CHECK(c.seed == UINT64_MAX);
    REQUIRE(c.stop.size() == 2);
    CHECK(c.stop[0] == "\n\n");
    CHECK(c.stop[1] == "}");
    CHECK_FALSE(c.stream);
    CHECK(c.timeout_ms == 2500);
    CHECK(c.session == "nvim-12-3");
    CHECK(c.max_lines == 2);
    CHECK(c.stop_on_dedent);
    CHECK_FALSE(c.speculative);
}

TEST_CASE("context files and min_indent: parsed, checked by name, and written back") {
    auto req = parse_ok(R"({"id":1,"op":"complete","prompt":"x","min_indent":4,
        "context":[{"filename":"a.py","text":"def a(): pass\n"},{"text":"b = 1\n"}]})");
    auto& c = std::get<p::complete_request>(req.body);
    CHECK(c.min_indent == 4);
    REQUIRE(c.context.size() == 2);
    CHECK(c.context[0] == p::context_file{"a.py", "def a(): pass\n"});
    CHECK(c.context[1] == p::context_file{"", "b = 1\n"});
    CHECK(parse_ok(p::to_json(req).dump()) == req);

    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"x","context":{"text":"a"}})").message.find("'context'") !=
          std::string::npos);
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"x","context":[{"filename":"a"}]})").message.find("'text'") !=
          std::string::npos);
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"x","context":[{"text":"a","time":3}]})")
              .message.find("'time'") != std::string::npos);
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"x","min_indent":-1})").message.find("'min_indent'") !=
          std::string::npos);
    p::request_limits two;
    two.max_context_files = 2;
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"x","context":[{"text":"a"},{"text":"b"},{"text":"c"}]})", two)
              .message.find("at most 2") != std::string::npos);
}

TEST_CASE("an overlong session name is refused by name") {
    const std::string line = R"({"id":1,"op":"complete","prompt":"x","session":")" + std::string(257, 's') + R"("})";
    const auto e = parse_err(line);
    CHECK(e.code == p::error_code::invalid_request);
    CHECK(e.message.find("'session'") != std::string::npos);
    CHECK(std::holds_alternative<p::complete_request>(
        parse_ok(R"({"id":1,"op":"complete","prompt":"x","session":")" + std::string(256, 's') + R"("})").body));
}

TEST_CASE("max_tokens 0 asks for a warm-up: the prompt only") {
    auto req = parse_ok(R"({"id":"w","op":"complete","prompt":"import os","max_tokens":0})");
    auto& c = std::get<p::complete_request>(req.body);
    CHECK(c.max_tokens == 0);
    CHECK(c.session.empty());
    CHECK(c.max_lines == 0);
    CHECK_FALSE(c.stop_on_dedent);
    CHECK(c.speculative); // on unless asked otherwise
}

TEST_CASE("stop may be a single string") {
    auto req = parse_ok(R"({"id":"x","op":"complete","prompt":"","stop":";"})");
    auto& c = std::get<p::complete_request>(req.body);
    REQUIRE(c.stop.size() == 1);
    CHECK(c.stop[0] == ";");
}

TEST_CASE("invalid JSON and non-objects") {
    auto e = parse_err("{\"id\":1,");
    CHECK(e.code == p::error_code::invalid_json);
    CHECK(e.id.is_null());
    e = parse_err(std::string("\x00\xff\x13garbage", 10));
    CHECK(e.code == p::error_code::invalid_json);
    e = parse_err("[1,2]");
    CHECK(e.code == p::error_code::invalid_request);
    e = parse_err("\"str\"");
    CHECK(e.code == p::error_code::invalid_request);
    // Invalid UTF-8 inside a string is not JSON.
    e = parse_err("{\"id\":1,\"op\":\"complete\",\"prompt\":\"\xc3\x28\"}");
    CHECK(e.code == p::error_code::invalid_json);
}

TEST_CASE("deeply nested JSON is rejected without crashing") {
    std::string deep(200000, '[');
    CHECK(parse_err(deep).code == p::error_code::invalid_json);
    deep += std::string(200000, ']');
    CHECK(parse_err(deep).code == p::error_code::invalid_request);
    std::string obj = R"({"id":1,"op":"health","x":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
    auto e = parse_err(obj);
    CHECK(e.code == p::error_code::invalid_request);
    CHECK(e.message.find("'x'") != std::string::npos);
}

TEST_CASE("id is required and typed") {
    auto e = parse_err(R"({"op":"health"})");
    CHECK(e.code == p::error_code::invalid_request);
    CHECK(e.id.is_null());
    CHECK(e.message.find("id") != std::string::npos);
    CHECK(parse_err(R"({"id":1.5,"op":"health"})").code == p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":null,"op":"health"})").code == p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":"","op":"health"})").code == p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":[1],"op":"health"})").code == p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":18446744073709551615,"op":"health"})").code == p::error_code::invalid_request);
    const std::string long_id(257, 'x');
    CHECK(parse_err(R"({"id":")" + long_id + R"(","op":"health"})").code == p::error_code::invalid_request);
    CHECK(parse_ok(R"({"id":-3,"op":"health"})").id == -3);
}

TEST_CASE("errors after the id carry the id") {
    auto e = parse_err(R"({"id":"q","op":"launch"})");
    CHECK(e.code == p::error_code::unknown_op);
    CHECK(e.id == "q");
    CHECK(e.message.find("launch") != std::string::npos);
    e = parse_err(R"({"id":"q"})");
    CHECK(e.code == p::error_code::invalid_request);
    CHECK(e.id == "q");
    e = parse_err(R"({"id":"q","op":5})");
    CHECK(e.code == p::error_code::invalid_request);
}

TEST_CASE("wrong field types and ranges name the field") {
    struct bad_case {
        const char* fields;
        const char* name;
    };
    const bad_case cases[] = {
        {R"("prompt":5)", "prompt"},
        {R"("prompt":"x","suffix":[])", "suffix"},
        {R"("prompt":"x","max_tokens":"9")", "max_tokens"},
        {R"("prompt":"x","max_tokens":-1)", "max_tokens"},
        {R"("prompt":"x","session":"")", "session"},
        {R"("prompt":"x","session":7)", "session"},
        {R"("prompt":"x","max_lines":-1)", "max_lines"},
        {R"("prompt":"x","max_lines":true)", "max_lines"},
        {R"("prompt":"x","stop_on_dedent":"yes")", "stop_on_dedent"},
        {R"("prompt":"x","max_tokens":4097)", "max_tokens"},
        {R"("prompt":"x","max_tokens":1.5)", "max_tokens"},
        {R"("prompt":"x","temperature":-0.1)", "temperature"},
        {R"("prompt":"x","temperature":"hot")", "temperature"},
        {R"("prompt":"x","top_p":1.01)", "top_p"},
        {R"("prompt":"x","top_k":-1)", "top_k"},
        {R"("prompt":"x","min_p":2)", "min_p"},
        {R"("prompt":"x","seed":-1)", "seed"},
        {R"("prompt":"x","repeat_penalty":0)", "repeat_penalty"},
        {R"("prompt":"x","seed":1.0)", "seed"},
        {R"("prompt":"x","stop":[1])", "stop"},
        {R"("prompt":"x","stop":[""])", "stop"},
        {R"("prompt":"x","stop":{})", "stop"},
        {R"("prompt":"x","stream":1)", "stream"},
        {R"("prompt":"x","timeout_ms":0)", "timeout_ms"},
        {R"("prompt":"x","timeout_ms":"1s")", "timeout_ms"},
        {R"("prompt":"x","max_token":5)", "max_token"},
        {R"("prompt":"x","debug_fault":{"kind":"crash"})", "debug_fault"},
        {R"("suffix":"y")", "prompt"},
    };
    for (const auto& c : cases) {
        const std::string line = std::string(R"({"id":"r","op":"complete",)") + c.fields + "}";
        CAPTURE(line);
        auto e = parse_err(line);
        CHECK(e.code == p::error_code::invalid_request);
        CHECK(e.id == "r");
        CHECK(e.message.find(c.name) != std::string::npos);
    }
}

TEST_CASE("stop limits are enforced") {
    p::request_limits limits;
    limits.max_stop = 2;
    limits.max_stop_bytes = 4;
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"","stop":["a","b","c"]})", limits).code ==
          p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"","stop":"abcde"})", limits).code ==
          p::error_code::invalid_request);
    CHECK(std::get<p::complete_request>(
              parse_ok(R"({"id":1,"op":"complete","prompt":"","stop":["abcd","b"]})", limits).body)
              .stop.size() == 2);
}

TEST_CASE("debug_fault only when fault injection is allowed") {
    p::request_limits limits;
    limits.allow_fault_injection = true;
    auto req =
        parse_ok(R"({"id":1,"op":"complete","prompt":"","debug_fault":{"kind":"crash","after_tokens":3}})", limits);
    auto& c = std::get<p::complete_request>(req.body);
    CHECK(c.fault.kind == p::fault_kind::crash);
    CHECK(c.fault.after_tokens == 3);
    CHECK(c.fault.delay_ms == 0);
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"","debug_fault":{"kind":"melt"}})", limits).code ==
          p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":1,"op":"complete","prompt":"","debug_fault":{"kind":"hang","x":1}})", limits).code ==
          p::error_code::invalid_request);
}

TEST_CASE("hello - cancel - health - status") {
    auto h = std::get<p::hello_request>(parse_ok(R"({"id":0,"op":"hello","protocol":1,"client":"nvim"})").body);
    CHECK(h.protocol == 1);
    CHECK(h.client == "nvim");
    auto e = parse_err(R"({"id":0,"op":"hello","protocol":2})");
    CHECK(e.code == p::error_code::unsupported_protocol);
    CHECK(e.message.find("speaks 1") != std::string::npos);

    auto c = std::get<p::cancel_request>(parse_ok(R"({"id":1,"op":"cancel","target":"a1"})").body);
    CHECK(c.target == "a1");
    CHECK(parse_err(R"({"id":1,"op":"cancel"})").code == p::error_code::invalid_request);
    CHECK(parse_err(R"({"id":1,"op":"cancel","target":true})").code == p::error_code::invalid_request);

    CHECK(std::holds_alternative<p::health_request>(parse_ok(R"({"id":2,"op":"health"})").body));
    CHECK(std::holds_alternative<p::status_request>(parse_ok(R"({"id":3,"op":"status"})").body));
    CHECK(parse_err(R"({"id":3,"op":"status","verbose":true})").code == p::error_code::invalid_request);
}

TEST_CASE("to_json round-trips through parse_request") {
    p::request_limits limits;
    limits.allow_fault_injection = true;
    p::complete_request c;
    c.prompt = "int main() {\n  \xe4\xb8\xad";
    c.suffix = "\n}";
    c.max_tokens = 77;
    c.temperature = 0.25f;
    c.top_p = 0.5f;
    c.top_k = 9;
    c.min_p = 0.125f;
    c.repeat_penalty = 1.25f;
    c.seed = 42;
    c.stop = {"\n", "//"};
    c.stream = false;
    c.timeout_ms = 1234;
    c.session = "buffer-1";
    c.max_lines = 1;
    c.stop_on_dedent = true;
    c.speculative = false;
    c.fault = {p::fault_kind::slow, 2, 15};
    const p::request reqs[] = {
        {"c", c},
        {5, p::hello_request{1, "test"}},
        {"k", p::cancel_request{"c"}},
        {6, p::health_request{}},
        {7, p::status_request{}},
    };
    for (const auto& req : reqs) {
        const std::string line = p::dump_line(p::to_json(req));
        CAPTURE(line);
        CHECK(parse_ok(line, limits) == req);
    }
}

TEST_CASE("events carry the id and the documented fields") {
    auto piece = p::make_piece_event("a", "x\xc3\xa9");
    CHECK(piece["id"] == "a");
    CHECK(piece["event"] == "piece");
    CHECK(piece["text"] == "x\xc3\xa9");

    p::done_event d;
    d.reason = p::finish_reason::length;
    d.usage = {5, 3, 0, 6, 2};
    d.timings = {1.5, 2.0, 3.0, 4.0};
    d.seed = 99;
    auto done = p::make_done_event(7, d);
    CHECK(done["id"] == 7);
    CHECK(done["event"] == "done");
    CHECK(done["finish_reason"] == "length");
    CHECK(done["usage"]["prompt_tokens"] == 5);
    CHECK(done["usage"]["completion_tokens"] == 3);
    CHECK(done["usage"]["drafted_tokens"] == 6);
    CHECK(done["usage"]["accepted_tokens"] == 2);
    CHECK(done["timings"]["ttft_ms"] == 4.0);
    CHECK_FALSE(done.contains("text"));
    auto back = p::parse_done_event(done);
    CHECK(back.reason == p::finish_reason::length);
    CHECK(back.usage == d.usage);
    CHECK(back.seed == 99);
    d.text = "abc";
    CHECK(p::parse_done_event(p::make_done_event(7, d)).text == "abc");

    auto err = p::make_error_event(nullptr, p::error_code::too_large, "line too long");
    CHECK(err["id"].is_null());
    CHECK(err["event"] == "error");
    CHECK(err["code"] == "too_large");
    CHECK(err["message"] == "line too long");
    CHECK_FALSE(err.contains("finish_reason"));
    err = p::make_error_event("z", p::error_code::worker_crashed, "boom", p::finish_reason::error);
    CHECK(err["finish_reason"] == "error");

    auto hello = p::make_hello_event(1, "colibrid 0.1.0");
    CHECK(hello["protocol"] == 1);
    CHECK(hello["ops"].size() == 5);

    auto cancel = p::make_cancel_event("c", "a", true);
    CHECK(cancel["target"] == "a");
    CHECK(cancel["found"] == true);
}

TEST_CASE("dump_line never throws and never emits a newline") {
    json j = {{"text", std::string("a\xff\nb")}};
    std::string s;
    CHECK_NOTHROW(s = p::dump_line(j));
    CHECK(s.find('\n') == std::string::npos);
    CHECK(s.find("\\n") != std::string::npos);
    CHECK(s.find("\xef\xbf\xbd") != std::string::npos); // U+FFFD
}
