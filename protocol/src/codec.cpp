#include "colibri/protocol/codec.hpp"

#include "json_numbers.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

namespace colibri::protocol {
namespace {

using json = nlohmann::json;

// Field names: the one place they are spelled.
namespace field {
constexpr const char* id = "id";
constexpr const char* op = "op";
constexpr const char* event = "event";
constexpr const char* protocol = "protocol";
constexpr const char* client = "client";
constexpr const char* prompt = "prompt";
constexpr const char* suffix = "suffix";
constexpr const char* session = "session";
constexpr const char* max_tokens = "max_tokens";
constexpr const char* max_lines = "max_lines";
constexpr const char* stop_on_dedent = "stop_on_dedent";
constexpr const char* min_indent = "min_indent";
constexpr const char* context = "context";
constexpr const char* filename = "filename";
constexpr const char* speculative = "speculative";
constexpr const char* drafted_tokens = "drafted_tokens";
constexpr const char* accepted_tokens = "accepted_tokens";
constexpr const char* temperature = "temperature";
constexpr const char* top_p = "top_p";
constexpr const char* top_k = "top_k";
constexpr const char* min_p = "min_p";
constexpr const char* repeat_penalty = "repeat_penalty";
constexpr const char* seed = "seed";
constexpr const char* stop = "stop";
constexpr const char* stream = "stream";
constexpr const char* timeout_ms = "timeout_ms";
constexpr const char* debug_fault = "debug_fault";
constexpr const char* kind = "kind";
constexpr const char* after_tokens = "after_tokens";
constexpr const char* delay_ms = "delay_ms";
constexpr const char* target = "target";
constexpr const char* text = "text";
constexpr const char* finish_reason = "finish_reason";
constexpr const char* usage = "usage";
constexpr const char* prompt_tokens = "prompt_tokens";
constexpr const char* completion_tokens = "completion_tokens";
constexpr const char* cached_tokens = "cached_tokens";
constexpr const char* timings = "timings";
constexpr const char* queued_ms = "queued_ms";
constexpr const char* prefill_ms = "prefill_ms";
constexpr const char* decode_ms = "decode_ms";
constexpr const char* ttft_ms = "ttft_ms";
constexpr const char* code = "code";
constexpr const char* message = "message";
constexpr const char* found = "found";
constexpr const char* server = "server";
constexpr const char* ops = "ops";
} // namespace field

constexpr std::array<std::pair<finish_reason, std::string_view>, 5> k_finish_names{{
    {finish_reason::stop, "stop"},
    {finish_reason::length, "length"},
    {finish_reason::cancelled, "cancelled"},
    {finish_reason::timeout, "timeout"},
    {finish_reason::error, "error"},
}};

constexpr std::array<std::pair<fault_kind, std::string_view>, 8> k_fault_names{{
    {fault_kind::none, "none"},
    {fault_kind::crash, "crash"},
    {fault_kind::abort, "abort"},
    {fault_kind::kill, "kill"},
    {fault_kind::exit, "exit"},
    {fault_kind::hang, "hang"},
    {fault_kind::slow, "slow"},
    {fault_kind::device_error, "device_error"},
}};

[[noreturn]] void bad(const std::string& message) { throw protocol_error(error_code::invalid_request, message); }

/// Reads the fields of one JSON object, remembering which were consumed so that unknown
/// fields can be reported by name.
class object_reader {
public:
    explicit object_reader(const json& obj) : obj_(obj) {}

    const json* get(const char* name) {
        used_.insert(name);
        auto it = obj_.find(name);
        return it == obj_.end() ? nullptr : &*it;
    }

    std::optional<std::string> string(const char* name) {
        const json* v = get(name);
        if (!v) return std::nullopt;
        if (!v->is_string()) bad(std::string("'") + name + "' must be a string");
        return v->get<std::string>();
    }

    std::optional<bool> boolean(const char* name) {
        const json* v = get(name);
        if (!v) return std::nullopt;
        if (!v->is_boolean()) bad(std::string("'") + name + "' must be true or false");
        return v->get<bool>();
    }

    std::optional<std::int64_t> integer(const char* name, std::int64_t lo, std::int64_t hi) {
        const json* v = get(name);
        if (!v) return std::nullopt;
        if (!v->is_number_integer()) bad(std::string("'") + name + "' must be an integer");
        if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
            bad(range_message(name, lo, hi));
        const auto x = v->get<std::int64_t>();
        if (x < lo || x > hi) bad(range_message(name, lo, hi));
        return x;
    }

    std::optional<double> number(const char* name, double lo, double hi) {
        const json* v = get(name);
        if (!v) return std::nullopt;
        if (!v->is_number()) bad(std::string("'") + name + "' must be a number");
        const double x = v->get<double>();
        if (!std::isfinite(x) || x < lo || x > hi) bad(range_message(name, lo, hi));
        return x;
    }

    /// Fails on the first field that was never asked for.
    void reject_unknown() const {
        for (auto it = obj_.begin(); it != obj_.end(); ++it)
            if (!used_.count(it.key())) bad("unknown field '" + it.key() + "'");
    }

private:
    template <class T>
    static std::string range_message(const char* name, T lo, T hi) {
        json range = json::array({lo, hi});
        return std::string("'") + name + "' must be in " + range.dump();
    }

    const json& obj_;
    std::set<std::string, std::less<>> used_;
};

json read_id(const json& obj, const request_limits& limits) {
    auto it = obj.find(field::id);
    if (it == obj.end()) bad("missing 'id'");
    const json& id = *it;
    if (id.is_string()) {
        const auto& s = id.get_ref<const std::string&>();
        if (s.empty()) bad("'id' must not be empty");
        if (s.size() > limits.max_id_bytes)
            bad("'id' is longer than " + std::to_string(limits.max_id_bytes) + " bytes");
        return id;
    }
    if (id.is_number_integer()) {
        if (id.is_number_unsigned() && id.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
            bad("'id' integer out of range");
        return id;
    }
    bad("'id' must be a string or an integer");
}

std::vector<std::string> read_stop(const json& v, const request_limits& limits) {
    std::vector<std::string> out;
    auto add = [&](const json& s) {
        if (!s.is_string()) bad("'stop' must be a string or an array of strings");
        const auto& str = s.get_ref<const std::string&>();
        if (str.empty()) bad("'stop' strings must not be empty");
        if (str.size() > limits.max_stop_bytes)
            bad("'stop' strings are limited to " + std::to_string(limits.max_stop_bytes) + " bytes");
        out.push_back(str);
    };
    if (v.is_array()) {
        if (v.size() > limits.max_stop) bad("'stop' holds at most " + std::to_string(limits.max_stop) + " strings");
        for (const auto& s : v) add(s);
    } else {
        add(v);
    }
    return out;
}

std::vector<context_file> read_context(const json& v, const request_limits& limits) {
    if (!v.is_array()) bad("'context' must be an array of {\"filename\", \"text\"} objects");
    if (v.size() > limits.max_context_files)
        bad("'context' holds at most " + std::to_string(limits.max_context_files) + " files");
    std::vector<context_file> out;
    for (const json& f : v) {
        if (!f.is_object()) bad("'context' must be an array of {\"filename\", \"text\"} objects");
        object_reader r(f);
        context_file c;
        auto text = r.string(field::text);
        if (!text) bad("a 'context' file needs 'text'");
        c.text = std::move(*text);
        if (auto name = r.string(field::filename)) c.filename = std::move(*name);
        r.reject_unknown();
        out.push_back(std::move(c));
    }
    return out;
}

fault_spec read_fault(const json& v) {
    if (!v.is_object()) bad("'debug_fault' must be an object");
    object_reader r(v);
    fault_spec f;
    const auto kind = r.string(field::kind);
    if (!kind) bad("'debug_fault' needs 'kind'");
    const auto k = fault_kind_from_string(*kind);
    if (!k) bad("unknown 'debug_fault.kind' '" + *kind + "'");
    f.kind = *k;
    if (auto n = r.integer(field::after_tokens, 0, 1 << 20)) f.after_tokens = static_cast<int>(*n);
    if (auto n = r.integer(field::delay_ms, 0, 60000)) f.delay_ms = static_cast<int>(*n);
    r.reject_unknown();
    return f;
}

complete_request read_complete(object_reader& r, const request_limits& limits) {
    complete_request c;
    auto prompt = r.string(field::prompt);
    if (!prompt) bad("missing 'prompt'");
    c.prompt = std::move(*prompt);
    if (auto s = r.string(field::suffix)) c.suffix = std::move(*s);
    if (auto s = r.string(field::session)) {
        if (s->empty()) bad("'session' must not be empty");
        if (s->size() > limits.max_session_bytes)
            bad("'session' is longer than " + std::to_string(limits.max_session_bytes) + " bytes");
        c.session = std::move(*s);
    }
    if (auto n = r.integer(field::max_tokens, 0, limits.max_tokens)) c.max_tokens = static_cast<int>(*n);
    if (auto n = r.integer(field::max_lines, 0, 1 << 20)) c.max_lines = static_cast<int>(*n);
    if (auto b = r.boolean(field::stop_on_dedent)) c.stop_on_dedent = *b;
    if (auto n = r.integer(field::min_indent, 0, 1 << 20)) c.min_indent = static_cast<int>(*n);
    if (const json* v = r.get(field::context)) c.context = read_context(*v, limits);
    if (auto b = r.boolean(field::speculative)) c.speculative = *b;
    if (auto x = r.number(field::temperature, 0.0, 10.0)) c.temperature = static_cast<float>(*x);
    if (auto x = r.number(field::top_p, 0.0, 1.0)) c.top_p = static_cast<float>(*x);
    if (auto n = r.integer(field::top_k, 0, 1 << 24)) c.top_k = static_cast<int>(*n);
    if (auto x = r.number(field::min_p, 0.0, 1.0)) c.min_p = static_cast<float>(*x);
    if (auto x = r.number(field::repeat_penalty, 0.01, 10.0)) c.repeat_penalty = static_cast<float>(*x);
    if (const json* s = r.get(field::seed)) {
        if (!s->is_number_integer() || (!s->is_number_unsigned() && s->get<std::int64_t>() < 0))
            bad("'seed' must be a non-negative integer");
        c.seed = s->get<std::uint64_t>();
    }
    if (const json* s = r.get(field::stop)) c.stop = read_stop(*s, limits);
    if (auto b = r.boolean(field::stream)) c.stream = *b;
    if (auto n = r.integer(field::timeout_ms, 1, std::numeric_limits<std::int64_t>::max())) c.timeout_ms = *n;
    if (limits.allow_fault_injection)
        if (const json* f = r.get(field::debug_fault)) c.fault = read_fault(*f);
    return c;
}

request_body read_body(const std::string& op, object_reader& r, const request_limits& limits) {
    if (op == "complete") return read_complete(r, limits);
    if (op == "hello") {
        hello_request h;
        if (auto v = r.integer(field::protocol, 0, INT32_MAX)) h.protocol = static_cast<int>(*v);
        if (auto s = r.string(field::client)) h.client = std::move(*s);
        if (h.protocol != protocol_version)
            throw protocol_error(error_code::unsupported_protocol, "protocol " + std::to_string(h.protocol) +
                                                                       " is not supported; this server speaks " +
                                                                       std::to_string(protocol_version));
        return h;
    }
    if (op == "cancel") {
        const json* t = r.get(field::target);
        if (!t) bad("missing 'target'");
        if (!(t->is_string() || t->is_number_integer())) bad("'target' must be a string or an integer");
        return cancel_request{*t};
    }
    if (op == "health") return health_request{};
    if (op == "status") return status_request{};
    throw protocol_error(error_code::unknown_op, "unknown op '" + op + "'");
}

} // namespace

std::string_view to_string(finish_reason reason) {
    for (const auto& [r, name] : k_finish_names)
        if (r == reason) return name;
    return "error";
}

std::optional<finish_reason> finish_reason_from_string(std::string_view name) {
    for (const auto& [r, n] : k_finish_names)
        if (n == name) return r;
    return std::nullopt;
}

std::string_view to_string(fault_kind kind) {
    for (const auto& [k, name] : k_fault_names)
        if (k == kind) return name;
    return "none";
}

std::optional<fault_kind> fault_kind_from_string(std::string_view name) {
    for (const auto& [k, n] : k_fault_names)
        if (n == name) return k;
    return std::nullopt;
}

std::variant<request, request_error> parse_request(std::string_view line, const request_limits& limits) {
    json obj = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded()) return request_error{nullptr, error_code::invalid_json, "the line is not valid JSON"};
    if (!obj.is_object()) return request_error{nullptr, error_code::invalid_request, "a request must be a JSON object"};
    json id;
    try {
        id = read_id(obj, limits);
    } catch (const protocol_error& e) {
        return request_error{nullptr, e.code(), e.what()};
    }
    try {
        object_reader r(obj);
        r.get(field::id);
        const auto op = r.string(field::op);
        if (!op) bad("missing 'op'");
        request req{id, read_body(*op, r, limits)};
        r.reject_unknown();
        return req;
    } catch (const protocol_error& e) {
        return request_error{id, e.code(), e.what()};
    }
}

json to_json(const request& req) {
    json j = json::object();
    j[field::id] = req.id;
    std::visit(
        [&](const auto& body) {
            using T = std::decay_t<decltype(body)>;
            if constexpr (std::is_same_v<T, hello_request>) {
                j[field::op] = "hello";
                j[field::protocol] = body.protocol;
                if (!body.client.empty()) j[field::client] = body.client;
            } else if constexpr (std::is_same_v<T, complete_request>) {
                j[field::op] = "complete";
                j[field::prompt] = body.prompt;
                if (!body.suffix.empty()) j[field::suffix] = body.suffix;
                if (!body.session.empty()) j[field::session] = body.session;
                j[field::max_tokens] = body.max_tokens;
                if (body.max_lines != 0) j[field::max_lines] = body.max_lines;
                if (body.stop_on_dedent) j[field::stop_on_dedent] = true;
                if (body.min_indent != 0) j[field::min_indent] = body.min_indent;
                if (!body.context.empty()) {
                    json files = json::array();
                    for (const auto& f : body.context) {
                        json o = {{field::text, f.text}};
                        if (!f.filename.empty()) o[field::filename] = f.filename;
                        files.push_back(std::move(o));
                    }
                    j[field::context] = std::move(files);
                }
                if (!body.speculative) j[field::speculative] = false;
                j[field::temperature] = body.temperature;
                j[field::top_p] = body.top_p;
                j[field::top_k] = body.top_k;
                j[field::min_p] = body.min_p;
                j[field::repeat_penalty] = body.repeat_penalty;
                if (body.seed) j[field::seed] = *body.seed;
                if (!body.stop.empty()) j[field::stop] = body.stop;
                j[field::stream] = body.stream;
                if (body.timeout_ms) j[field::timeout_ms] = *body.timeout_ms;
                if (body.fault.kind != fault_kind::none)
                    j[field::debug_fault] = {{field::kind, to_string(body.fault.kind)},
                                             {field::after_tokens, body.fault.after_tokens},
                                             {field::delay_ms, body.fault.delay_ms}};
            } else if constexpr (std::is_same_v<T, cancel_request>) {
                j[field::op] = "cancel";
                j[field::target] = body.target;
            } else if constexpr (std::is_same_v<T, health_request>) {
                j[field::op] = "health";
            } else {
                j[field::op] = "status";
            }
        },
        req.body);
    return j;
}

std::string dump_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json make_hello_event(const json& id, std::string_view server_version) {
    return {{field::id, id},
            {field::event, event::hello},
            {field::protocol, protocol_version},
            {field::server, server_version},
            {field::ops, {"hello", "complete", "cancel", "health", "status"}}};
}

json make_piece_event(const json& id, std::string_view text) {
    return {{field::id, id}, {field::event, event::piece}, {field::text, text}};
}

json make_done_event(const json& id, const done_event& done) {
    json j = {{field::id, id},
              {field::event, event::done},
              {field::finish_reason, to_string(done.reason)},
              {field::usage,
               {{field::prompt_tokens, done.usage.prompt_tokens},
                {field::completion_tokens, done.usage.completion_tokens},
                {field::cached_tokens, done.usage.cached_tokens},
                {field::drafted_tokens, done.usage.drafted_tokens},
                {field::accepted_tokens, done.usage.accepted_tokens}}},
              {field::timings,
               {{field::queued_ms, done.timings.queued_ms},
                {field::prefill_ms, done.timings.prefill_ms},
                {field::decode_ms, done.timings.decode_ms},
                {field::ttft_ms, done.timings.ttft_ms}}},
              {field::seed, done.seed}};
    if (done.text) j[field::text] = *done.text;
    return j;
}

json make_error_event(const json& id, error_code code, std::string_view message, std::optional<finish_reason> reason) {
    json j = {{field::id, id}, {field::event, event::error}, {field::code, to_string(code)}, {field::message, message}};
    if (reason) j[field::finish_reason] = to_string(*reason);
    return j;
}

json make_cancel_event(const json& id, const json& target, bool found) {
    return {{field::id, id}, {field::event, event::cancel}, {field::target, target}, {field::found, found}};
}

done_event parse_done_event(const json& j) {
    try {
        done_event d;
        const auto reason = finish_reason_from_string(j.at(field::finish_reason).get<std::string>());
        if (!reason) throw protocol_error(error_code::internal, "unknown finish_reason");
        d.reason = *reason;
        const json& u = j.at(field::usage);
        d.usage.prompt_tokens = token_count(u, field::prompt_tokens);
        d.usage.completion_tokens = token_count(u, field::completion_tokens);
        d.usage.cached_tokens = token_count(u, field::cached_tokens);
        d.usage.drafted_tokens = token_count(u, field::drafted_tokens, 0);
        d.usage.accepted_tokens = token_count(u, field::accepted_tokens, 0);
        const json& t = j.at(field::timings);
        d.timings.queued_ms = t.at(field::queued_ms).get<double>();
        d.timings.prefill_ms = t.at(field::prefill_ms).get<double>();
        d.timings.decode_ms = t.at(field::decode_ms).get<double>();
        d.timings.ttft_ms = t.at(field::ttft_ms).get<double>();
        d.seed = whole_number(j, field::seed);
        if (auto it = j.find(field::text); it != j.end()) d.text = it->get<std::string>();
        return d;
    } catch (const json::exception& e) {
        throw protocol_error(error_code::internal, std::string("malformed done event: ") + e.what());
    }
}

} // namespace colibri::protocol
