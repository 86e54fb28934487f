#include "http_api.hpp"

#include <cmath>
#include <limits>

namespace colibri::daemon {

namespace p = protocol;
using nlohmann::json;

namespace {

struct http_input_error {
    std::string message;
};

[[noreturn]] void bad(std::string message) { throw http_input_error{std::move(message)}; }

/// A field the client sent, or nullptr when absent or null.
const json* field(const json& body, const char* name) {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

const std::string* string_field(const json& body, const char* name) {
    const json* v = field(body, name);
    if (!v) return nullptr;
    if (!v->is_string()) bad(std::string("'") + name + "' must be a string");
    return &v->get_ref<const std::string&>();
}

/// Copies a field under the protocol's name; the codec checks its type and range.
void copy(const json& body, const char* from, json& to, const char* name) {
    if (const json* v = field(body, from)) to[name] = *v;
}

/// Refuses a field that would change the output unless it has its neutral value.
void neutral(const json& body, const char* name, const json& neutral_value, std::string_view why) {
    const json* v = field(body, name);
    if (!v || *v == neutral_value) return;
    if (v->is_number() && neutral_value.is_number() && v->get<double>() == neutral_value.get<double>()) return;
    if ((v->is_array() || v->is_object() || v->is_string()) && v->empty() && neutral_value.empty()) return;
    bad(std::string("'") + name + "' is not supported: " + std::string(why));
}

/// llama-server's sampling fields; negative top_k and temperature mean off and greedy there.
void sampling_fields(const json& body, json& out) {
    if (const json* t = field(body, "temperature"))
        out["temperature"] = t->is_number() && t->get<double>() < 0 ? json(0.0) : *t;
    if (const json* k = field(body, "top_k"))
        out["top_k"] = k->is_number_integer() && k->get<std::int64_t>() < 0 ? json(0) : *k;
    copy(body, "top_p", out, "top_p");
    copy(body, "min_p", out, "min_p");
    copy(body, "stop", out, "stop");
    if (const json* s = field(body, "seed")) {
        // -1 asks for a random seed, which the daemon picks (and reports) when none is given.
        if (!(s->is_number_integer() && s->get<std::int64_t>() < 0)) out["seed"] = *s;
    }
}

void llama_fields(const json& body, json& out, http_completion& c, const p::request_limits& limits) {
    sampling_fields(body, out);
    copy(body, "repeat_penalty", out, "repeat_penalty");
    const char* const limit = field(body, "n_predict") || !field(body, "max_tokens") ? "n_predict" : "max_tokens";
    if (const json* n = field(body, limit)) { // llama-server takes max_tokens for n_predict too
        if (!n->is_number_integer()) bad(std::string("'") + limit + "' must be an integer");
        out["max_tokens"] = n->get<std::int64_t>() < 0 ? json(limits.max_tokens) : *n;
    } else {
        out["max_tokens"] = limits.max_tokens; // llama-server's default: no limit but the context
    }
    if (const json* n = field(body, "n_indent")) {
        if (!n->is_number_integer()) bad("'n_indent' must be an integer");
        if (n->get<std::int64_t>() > 0) out["min_indent"] = *n;
    }
    if (const json* t = field(body, "t_max_predict_ms")) {
        if (!t->is_number()) bad("'t_max_predict_ms' must be a number");
        c.max_predict_ms = std::max(0.0, t->get<double>());
    }
    if (const json* f = field(body, "response_fields")) {
        if (!f->is_array()) bad("'response_fields' must be an array of strings");
        for (const json& path : *f) {
            if (!path.is_string()) bad("'response_fields' must be an array of strings");
            c.response_fields.push_back(path.get<std::string>());
        }
    }
    neutral(body, "n_probs", 0, "token probabilities are not reported");
    neutral(body, "grammar", "", "grammars are not supported");
    neutral(body, "json_schema", json::object(), "JSON schemas are not supported");
    neutral(body, "logit_bias", json::array(), "logit biases are not supported");
    neutral(body, "mirostat", 0, "only top-k, top-p, min-p and temperature sampling are supported");
    neutral(body, "ignore_eos", false, "generation always ends at the end of text");
    neutral(body, "presence_penalty", 0, "use repeat_penalty");
    neutral(body, "frequency_penalty", 0, "use repeat_penalty");
}

void openai_fields(const json& body, json& out, http_completion& c) {
    // OpenAI's documented defaults, not llama-server's.
    out["temperature"] = 1.0;
    out["top_p"] = 1.0;
    out["top_k"] = 0;
    out["min_p"] = 0.0;
    out["max_tokens"] = 16;
    sampling_fields(body, out);
    copy(body, "max_tokens", out, "max_tokens");
    copy(body, "repetition_penalty", out, "repeat_penalty");
    if (const std::string* m = string_field(body, "model")) c.model = *m;
    if (const json* o = field(body, "stream_options")) {
        if (!o->is_object()) bad("'stream_options' must be an object");
        if (const json* u = field(*o, "include_usage")) {
            if (!u->is_boolean()) bad("'stream_options.include_usage' must be true or false");
            c.include_usage = u->get<bool>();
        }
    }
    neutral(body, "n", 1, "one choice per request");
    neutral(body, "best_of", 1, "one choice per request");
    neutral(body, "echo", false, "the prompt is not echoed");
    neutral(body, "logprobs", 0, "token probabilities are not reported");
    neutral(body, "logit_bias", json::object(), "logit biases are not supported");
    neutral(body, "presence_penalty", 0, "use repetition_penalty");
    neutral(body, "frequency_penalty", 0, "use repetition_penalty");
}

/// The prompt as one string: a string, or an array holding one string.
std::string prompt_text(const json& body, bool required) {
    const json* v = field(body, "prompt");
    if (!v) {
        if (required) bad("missing 'prompt'");
        return {};
    }
    if (v->is_string()) return v->get<std::string>();
    if (v->is_array() && v->size() == 1 && (*v)[0].is_string()) return (*v)[0].get<std::string>();
    if (v->is_array() && !v->empty() && (*v)[0].is_number_integer())
        bad("'prompt' must be text: token ids are not supported");
    bad("'prompt' must be a string (or an array of one string)");
}

json extra_context(const json& body) {
    const json* v = field(body, "input_extra");
    json files = json::array();
    if (!v) return files;
    if (!v->is_array()) bad("'input_extra' must be an array of {\"filename\": string, \"text\": string}");
    for (const json& chunk : *v) {
        if (!chunk.is_object() || !chunk.contains("text") || !chunk["text"].is_string())
            bad("each 'input_extra' chunk needs a \"text\" string");
        json f = {{"text", chunk["text"]}};
        if (const std::string* name = string_field(chunk, "filename")) f["filename"] = *name;
        files.push_back(std::move(f)); // other keys (llama.vim's "time") are the client's own
    }
    return files;
}

/// The codec names protocol fields; say the client's name for the renamed ones.
std::string client_names(std::string message, http_api api) {
    auto rename = [&](std::string_view ours, std::string_view theirs) {
        for (size_t at = message.find(ours); at != std::string::npos; at = message.find(ours, at + theirs.size()))
            message.replace(at, ours.size(), theirs);
    };
    if (api == http_api::openai_completion) {
        rename("'repeat_penalty'", "'repetition_penalty'");
    } else {
        rename("'max_tokens'", "'n_predict'");
        rename("'min_indent'", "'n_indent'");
        rename("'context'", "'input_extra'");
        if (api == http_api::infill) rename("'suffix'", "'input_suffix'");
    }
    return message;
}

double per_second(int n, double ms) { return ms > 0 ? 1000.0 * n / ms : 0.0; }

json llama_timings(const http_outcome& o) {
    const int prompt_n = std::max(0, o.usage.prompt_tokens - o.usage.cached_tokens);
    const int predicted_n = o.usage.completion_tokens;
    json t = {{"cache_n", o.usage.cached_tokens},
              {"prompt_n", prompt_n},
              {"prompt_ms", o.timings.prefill_ms},
              {"prompt_per_token_ms", prompt_n > 0 ? o.timings.prefill_ms / prompt_n : 0.0},
              {"prompt_per_second", per_second(prompt_n, o.timings.prefill_ms)},
              {"predicted_n", predicted_n},
              {"predicted_ms", o.timings.decode_ms},
              {"predicted_per_token_ms", predicted_n > 0 ? o.timings.decode_ms / predicted_n : 0.0},
              {"predicted_per_second", per_second(predicted_n, o.timings.decode_ms)}};
    if (o.usage.drafted_tokens > 0) {
        t["draft_n"] = o.usage.drafted_tokens;
        t["draft_n_accepted"] = o.usage.accepted_tokens;
    }
    return t;
}

bool ended_by_limit(const http_outcome& o) {
    return o.time_limited || o.reason == p::finish_reason::length || o.reason == p::finish_reason::timeout;
}

// llama-server's response_fields: each path ("timings/prompt_n") that leads to a value, under
// the path itself as a key; paths that lead nowhere are left out.
json selected_fields(const json& reply, const std::vector<std::string>& paths) {
    json out = json::object();
    for (const std::string& path : paths) {
        const json* at = &reply;
        for (size_t from = 0; at != nullptr && from <= path.size();) {
            const size_t to = std::min(path.find('/', from), path.size());
            const std::string key = path.substr(from, to - from);
            at = at->is_object() && at->contains(key) ? &(*at)[key] : nullptr;
            from = to + 1;
        }
        if (at != nullptr) out[path] = *at;
    }
    return out;
}

json llama_final(const http_reply& r, const http_outcome& o, std::string_view content) {
    const char* stop_type = ended_by_limit(o) ? "limit" : o.reason == p::finish_reason::stop ? "eos" : "none";
    json reply = {{"index", 0},
                  {"content", content},
                  {"tokens", json::array()},
                  {"id_slot", 0},
                  {"stop", true},
                  {"model", r.model},
                  {"tokens_predicted", o.usage.completion_tokens},
                  {"tokens_evaluated", o.usage.prompt_tokens},
                  {"has_new_line", o.text.find('\n') != std::string::npos},
                  {"truncated", false},
                  {"stop_type", stop_type},
                  {"stopping_word", ""},
                  {"tokens_cached", o.usage.prompt_tokens + o.usage.completion_tokens},
                  {"generation_settings", r.settings.is_null() ? json::object() : r.settings},
                  {"timings", llama_timings(o)}};
    return r.response_fields.empty() ? reply : selected_fields(reply, r.response_fields);
}

json openai_usage(const http_outcome& o) {
    return {{"prompt_tokens", o.usage.prompt_tokens},
            {"completion_tokens", o.usage.completion_tokens},
            {"total_tokens", o.usage.prompt_tokens + o.usage.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", o.usage.cached_tokens}}}};
}

json openai_chunk(const http_reply& r, std::string_view text, const json& finish_reason) {
    return {{"id", r.id},
            {"object", "text_completion"},
            {"created", r.created},
            {"model", r.model},
            {"choices",
             json::array({{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}}})}};
}

const char* openai_finish(const http_outcome& o) { return ended_by_limit(o) ? "length" : "stop"; }

} // namespace

std::variant<http_completion, p::request_error> parse_http_completion(http_api api, std::string_view body,
                                                                      const p::request_limits& limits) {
    http_completion c;
    c.api = api;
    json in;
    try {
        in = json::parse(body);
    } catch (const json::exception&) {
        return p::request_error{nullptr, p::error_code::invalid_json, "the request body is not valid JSON"};
    }
    if (!in.is_object())
        return p::request_error{nullptr, p::error_code::invalid_request, "the body must be a JSON object"};
    json out = {{"id", 0}, {"op", "complete"}, {"stream", true}};
    copy(in, "debug_fault", out, "debug_fault"); // refused by the codec unless fault injection is on
    copy(in, "speculative", out, "speculative"); // Colibri's own: false turns drafting off
    try {
        if (const json* s = field(in, "stream")) {
            if (!s->is_boolean()) bad("'stream' must be true or false");
            c.stream = s->get<bool>();
        }
        if (api == http_api::openai_completion) {
            openai_fields(in, out, c);
            out["prompt"] = prompt_text(in, true);
            if (const std::string* s = string_field(in, "suffix")) out["suffix"] = *s;
        } else {
            llama_fields(in, out, c, limits);
            if (api == http_api::infill) {
                const std::string* prefix = string_field(in, "input_prefix");
                const std::string* suffix = string_field(in, "input_suffix");
                if (!prefix) bad("missing 'input_prefix'");
                if (!suffix) bad("missing 'input_suffix'");
                // llama-server: the prompt continues the prefix up to the cursor.
                out["prompt"] = *prefix + prompt_text(in, false);
                out["suffix"] = *suffix;
                if (json files = extra_context(in); !files.empty()) out["context"] = std::move(files);
            } else {
                out["prompt"] = prompt_text(in, true);
            }
        }
    } catch (const http_input_error& e) {
        return p::request_error{nullptr, p::error_code::invalid_request, e.message};
    }
    auto parsed = p::parse_request(p::dump_line(out), limits);
    if (auto* err = std::get_if<p::request_error>(&parsed)) {
        err->id = nullptr;
        err->message = client_names(std::move(err->message), api);
        return *err;
    }
    c.req = std::get<p::complete_request>(std::get<p::request>(parsed).body);
    return c;
}

json http_generation_settings(const p::complete_request& req, int n_ctx) {
    json s = {{"n_ctx", n_ctx},
              {"n_predict", req.max_tokens},
              {"temperature", req.temperature},
              {"top_k", req.top_k},
              {"top_p", req.top_p},
              {"min_p", req.min_p},
              {"repeat_penalty", req.repeat_penalty},
              {"stop", req.stop},
              {"n_indent", req.min_indent},
              {"speculative", req.speculative}};
    if (req.seed) s["seed"] = *req.seed;
    return s;
}

json http_final_body(const http_reply& r, const http_outcome& o) {
    if (r.api != http_api::openai_completion) return llama_final(r, o, o.text);
    json j = openai_chunk(r, o.text, openai_finish(o));
    j["usage"] = openai_usage(o);
    return j;
}

std::string http_piece_event(const http_reply& r, std::string_view text, int n_predicted) {
    if (r.api == http_api::openai_completion) return sse_event(openai_chunk(r, text, nullptr));
    return sse_event({{"index", 0},
                      {"content", text},
                      {"tokens", json::array()},
                      {"stop", false},
                      {"id_slot", 0},
                      {"tokens_predicted", n_predicted},
                      {"tokens_evaluated", 0}});
}

std::string http_final_events(const http_reply& r, const http_outcome& o, bool include_usage) {
    if (r.api != http_api::openai_completion) return sse_event(llama_final(r, o, ""));
    std::string out = sse_event(openai_chunk(r, "", openai_finish(o)));
    if (include_usage) {
        json u = openai_chunk(r, "", nullptr);
        u["choices"] = json::array();
        u["usage"] = openai_usage(o);
        out += sse_event(u);
    }
    return out + "data: [DONE]\n\n";
}

unsigned http_status(p::error_code code) {
    switch (code) {
    case p::error_code::invalid_json:
    case p::error_code::invalid_request:
    case p::error_code::unsupported_protocol: return 400;
    case p::error_code::forbidden: return 403;
    case p::error_code::unknown_op: return 404;
    case p::error_code::too_large: return 413;
    case p::error_code::busy:
    case p::error_code::unavailable: return 503;
    case p::error_code::timeout: return 504;
    case p::error_code::worker_crashed:
    case p::error_code::internal: return 500;
    }
    return 500;
}

json http_error_body(unsigned status, std::string_view type, std::string_view message) {
    return {{"error", {{"code", status}, {"message", message}, {"type", type}}}};
}

std::string sse_event(const json& payload) { return "data: " + p::dump_line(payload) + "\n\n"; }

} // namespace colibri::daemon
