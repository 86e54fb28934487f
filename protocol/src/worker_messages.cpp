#include "colibri/protocol/worker_messages.hpp"

#include "json_numbers.hpp"

#include "colibri/protocol/codec.hpp"

namespace colibri::protocol::worker {
namespace {

using json = nlohmann::json;

json parse_object(std::string_view line) {
    json j = json::parse(line.begin(), line.end(), nullptr, false);
    if (!j.is_object()) throw protocol_error(error_code::internal, "worker message is not a JSON object");
    return j;
}

template <class F>
auto decoding(F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const json::exception& e) {
        throw protocol_error(error_code::internal, std::string("malformed worker message: ") + e.what());
    }
}

json usage_json(const usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"cached_tokens", u.cached_tokens},
            {"drafted_tokens", u.drafted_tokens},
            {"accepted_tokens", u.accepted_tokens}};
}

} // namespace

std::string encode(const to_worker& msg) {
    json j = std::visit(
        [](const auto& m) -> json {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, run_msg>) {
                // Reuse the client encoding of the request so that both stay in step.
                json r = to_json(request{0, m.req});
                r.erase("id");
                r.erase("op");
                return {{"t", "run"}, {"job", m.job}, {"req", std::move(r)}, {"seed", m.seed}};
            } else if constexpr (std::is_same_v<T, cancel_msg>) {
                return {{"t", "cancel"}, {"job", m.job}};
            } else if constexpr (std::is_same_v<T, ping_msg>) {
                return {{"t", "ping"}, {"n", m.n}};
            } else {
                return {{"t", "shutdown"}};
            }
        },
        msg);
    return dump_line(j);
}

std::string encode(const from_worker& msg) {
    json j = std::visit(
        [](const auto& m) -> json {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, ready_msg>) {
                return {{"t", "ready"}, {"info", m.info}};
            } else if constexpr (std::is_same_v<T, piece_msg>) {
                return {{"t", "piece"}, {"job", m.job}, {"text", m.text}};
            } else if constexpr (std::is_same_v<T, done_msg>) {
                json d = {{"t", "done"},
                          {"job", m.job},
                          {"finish_reason", to_string(m.reason)},
                          {"usage", usage_json(m.tokens)},
                          {"prefill_ms", m.prefill_ms},
                          {"decode_ms", m.decode_ms}};
                if (!m.cache.is_null()) d["cache"] = m.cache;
                if (!m.upstreams.is_null()) d["upstreams"] = m.upstreams;
                return d;
            } else if constexpr (std::is_same_v<T, error_msg>) {
                json e = {{"t", "error"}, {"job", m.job}, {"code", to_string(m.code)}, {"message", m.message}};
                if (!m.upstreams.is_null()) e["upstreams"] = m.upstreams;
                return e;
            } else if constexpr (std::is_same_v<T, pong_msg>) {
                return {{"t", "pong"}, {"n", m.n}};
            } else if constexpr (std::is_same_v<T, progress_msg>) {
                return {{"t", "progress"}, {"job", m.job}};
            } else {
                return {{"t", "fatal"}, {"message", m.message}};
            }
        },
        msg);
    return dump_line(j);
}

to_worker decode_to_worker(std::string_view line) {
    const json j = parse_object(line);
    return decoding([&]() -> to_worker {
        const auto t = j.at("t").get<std::string>();
        if (t == "run") {
            json r = j.at("req");
            r["id"] = 0;
            r["op"] = "complete";
            request_limits limits;
            limits.allow_fault_injection = true; // the supervisor already validated it
            limits.max_tokens = INT32_MAX;
            auto parsed = parse_request(dump_line(r), limits);
            if (auto* err = std::get_if<request_error>(&parsed))
                throw protocol_error(error_code::internal, "bad run request: " + err->message);
            return run_msg{whole_number(j, "job"), std::get<complete_request>(std::get<request>(parsed).body),
                           whole_number(j, "seed")};
        }
        if (t == "cancel") return cancel_msg{whole_number(j, "job")};
        if (t == "ping") return ping_msg{whole_number(j, "n")};
        if (t == "shutdown") return shutdown_msg{};
        throw protocol_error(error_code::internal, "unknown worker message '" + t + "'");
    });
}

from_worker decode_from_worker(std::string_view line) {
    const json j = parse_object(line);
    return decoding([&]() -> from_worker {
        const auto t = j.at("t").get<std::string>();
        if (t == "piece") return piece_msg{whole_number(j, "job"), j.at("text").get<std::string>()};
        if (t == "done") {
            done_msg d;
            d.job = whole_number(j, "job");
            const auto r = finish_reason_from_string(j.at("finish_reason").get<std::string>());
            if (!r) throw protocol_error(error_code::internal, "unknown finish_reason");
            d.reason = *r;
            const json& u = j.at("usage");
            d.tokens.prompt_tokens = token_count(u, "prompt_tokens");
            d.tokens.completion_tokens = token_count(u, "completion_tokens");
            d.tokens.cached_tokens = token_count(u, "cached_tokens");
            d.tokens.drafted_tokens = token_count(u, "drafted_tokens");
            d.tokens.accepted_tokens = token_count(u, "accepted_tokens");
            d.prefill_ms = j.at("prefill_ms").get<double>();
            d.decode_ms = j.at("decode_ms").get<double>();
            if (auto it = j.find("cache"); it != j.end()) d.cache = *it;
            if (auto it = j.find("upstreams"); it != j.end()) d.upstreams = *it;
            return d;
        }
        if (t == "pong") return pong_msg{whole_number(j, "n")};
        if (t == "progress") return progress_msg{whole_number(j, "job")};
        if (t == "ready") return ready_msg{j.at("info")};
        if (t == "error") {
            const auto c = error_code_from_string(j.at("code").get<std::string>());
            error_msg e{
                whole_number(j, "job"), c.value_or(error_code::internal), j.at("message").get<std::string>(), {}};
            if (auto it = j.find("upstreams"); it != j.end()) e.upstreams = *it;
            return e;
        }
        if (t == "fatal") return fatal_msg{j.at("message").get<std::string>()};
        throw protocol_error(error_code::internal, "unknown worker message '" + t + "'");
    });
}

} // namespace colibri::protocol::worker
