#include <doctest/doctest.h>

#include "colibri/protocol/worker_messages.hpp"

namespace p = colibri::protocol;
using nlohmann::json;
namespace w = colibri::protocol::worker;

TEST_CASE("supervisor-to-worker messages round-trip") {
    w::run_msg run;
    run.job = 12;
    run.req.prompt = "x = \xf0\x9f\x90\x8d";
    run.req.max_tokens = 9000; // above the client limit: the worker trusts the supervisor
    run.req.stop = {"\n"};
    run.req.fault = {p::fault_kind::hang, 4, 0};
    run.seed = 77;
    auto back = std::get<w::run_msg>(w::decode_to_worker(w::encode(run)));
    CHECK(back.job == 12);
    CHECK(back.seed == 77);
    CHECK(back.req == run.req);

    CHECK(std::get<w::cancel_msg>(w::decode_to_worker(w::encode(w::cancel_msg{3}))).job == 3);
    CHECK(std::get<w::ping_msg>(w::decode_to_worker(w::encode(w::ping_msg{8}))).n == 8);
    CHECK(std::holds_alternative<w::shutdown_msg>(w::decode_to_worker(w::encode(w::shutdown_msg{}))));
}

TEST_CASE("worker-to-supervisor messages round-trip") {
    auto piece = std::get<w::piece_msg>(w::decode_from_worker(w::encode(w::piece_msg{4, "\xe4\xb8\xad\n"})));
    CHECK(piece.job == 4);
    CHECK(piece.text == "\xe4\xb8\xad\n");

    w::done_msg d{5,
                  p::finish_reason::stop,
                  {10, 3, 2, 8, 5},
                  1.25,
                  7.5,
                  {{"slots", 4}, {"hits", 1}},
                  json::array({{{"url", "http://a:8000"}, {"state", "up"}}})};
    auto done = std::get<w::done_msg>(w::decode_from_worker(w::encode(d)));
    CHECK(done.cache == d.cache);
    CHECK(done.upstreams == d.upstreams);
    d.cache = nullptr;
    CHECK(std::get<w::done_msg>(w::decode_from_worker(w::encode(d))).cache.is_null());
    CHECK(done.job == 5);
    CHECK(done.reason == p::finish_reason::stop);
    CHECK(done.tokens == d.tokens);
    CHECK(done.prefill_ms == 1.25);
    CHECK(done.decode_ms == 7.5);

    auto err = std::get<w::error_msg>(
        w::decode_from_worker(w::encode(w::error_msg{6, p::error_code::invalid_request, "prompt too long", {}})));
    CHECK(err.code == p::error_code::invalid_request);
    CHECK(err.message == "prompt too long");
    CHECK(err.upstreams.is_null());
    err = std::get<w::error_msg>(w::decode_from_worker(
        w::encode(w::error_msg{6, p::error_code::unavailable, "none", json::array({{{"state", "down"}}})})));
    CHECK(err.upstreams[0]["state"] == "down");

    auto ready = std::get<w::ready_msg>(
        w::decode_from_worker(w::encode(w::ready_msg{{{"architecture", "mixtral"}, {"n_ctx", 4096}}})));
    CHECK(ready.info["architecture"] == "mixtral");
    CHECK(std::get<w::pong_msg>(w::decode_from_worker(w::encode(w::pong_msg{9}))).n == 9);
    CHECK(std::get<w::progress_msg>(w::decode_from_worker(w::encode(w::progress_msg{11}))).job == 11);
    CHECK(std::get<w::fatal_msg>(w::decode_from_worker(w::encode(w::fatal_msg{"no model"}))).message == "no model");
}

TEST_CASE("malformed worker messages throw protocol_error") {
    CHECK_THROWS_AS(w::decode_from_worker("not json"), p::protocol_error);
    CHECK_THROWS_AS(w::decode_from_worker(R"({"t":"piece"})"), p::protocol_error);
    CHECK_THROWS_AS(w::decode_from_worker(R"({"t":"piece","job":"x","text":"a"})"), p::protocol_error);
    CHECK_THROWS_AS(w::decode_from_worker(R"({"t":"explode"})"), p::protocol_error);
    CHECK_THROWS_AS(w::decode_to_worker(R"({"t":"run","job":1,"seed":0,"req":{"prompt":3}})"), p::protocol_error);
    CHECK_THROWS_AS(w::decode_to_worker("[]"), p::protocol_error);
}

TEST_CASE("numbers that are not whole or out of range are refused, not converted") {
    for (const char* line : {R"({"t":"cancel","job":1e64})", R"({"t":"cancel","job":-1})", R"({"t":"ping","n":2.5})",
                             R"({"t":"piece","job":99999999999999999999999,"text":"x"})"}) {
        CAPTURE(line);
        CHECK_THROWS_AS(w::decode_to_worker(line), p::protocol_error);
    }
    CHECK_THROWS_AS(
        w::decode_from_worker(R"({"t":"done","job":1,"finish_reason":"stop","usage":{"prompt_tokens":1e10,)"
                              R"("completion_tokens":1,"cached_tokens":0,"drafted_tokens":0,"accepted_tokens":0},)"
                              R"("prefill_ms":1,"decode_ms":1})"),
        p::protocol_error);
}
