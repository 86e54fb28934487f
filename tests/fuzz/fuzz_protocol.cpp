// Fuzz target: bytes off a client's socket and off the worker's pipe. They go through
// the line framer in pieces the input chooses. Each line goes to the request decoder, the
// worker-channel decoders, the client's done-event reader and, as an HTTP body, to each
// HTTP dialect's translation. Any input must give lines,
// decoded messages or protocol errors: never a crash, a hang or a sanitizer report. A
// request that decodes must encode back to itself.

#include "colibri/protocol/codec.hpp"
#include "colibri/protocol/errors.hpp"
#include "colibri/protocol/line_framer.hpp"
#include "colibri/protocol/worker_messages.hpp"
#include "http_api.hpp"

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

namespace p = colibri::protocol;

namespace {

void decode_line(const std::string& line) {
    p::request_limits limits;
    limits.allow_fault_injection = true;
    auto parsed = p::parse_request(line, limits);
    if (auto* req = std::get_if<p::request>(&parsed)) {
        auto again = p::parse_request(p::dump_line(p::to_json(*req)), limits);
        auto* back = std::get_if<p::request>(&again);
        if (back == nullptr || !(*back == *req)) std::abort(); // the encoder and decoder disagree
    }
    try {
        (void)p::worker::decode_to_worker(line);
    } catch (const p::protocol_error&) {}
    try {
        (void)p::worker::decode_from_worker(line);
    } catch (const p::protocol_error&) {}
    for (auto api : {colibri::daemon::http_api::infill, colibri::daemon::http_api::completion,
                     colibri::daemon::http_api::openai_completion}) {
        auto http = colibri::daemon::parse_http_completion(api, line, limits);
        if (auto* c = std::get_if<colibri::daemon::http_completion>(&http)) {
            // what the HTTP front accepts is a valid request of the socket protocol
            const auto again = p::parse_request(p::dump_line(p::to_json(p::request{1, c->req})), limits);
            if (!std::holds_alternative<p::request>(again) || c->req.max_tokens > limits.max_tokens) std::abort();
        }
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("usage")) {
        try {
            (void)p::parse_done_event(j);
        } catch (const p::protocol_error&) {}
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // the first byte picks the framer's limit and the piece size: lines cut anywhere
    if (size == 0) return 0;
    const size_t max_line = 64 + size_t(data[0]) * 64, piece = 1 + data[0] % 17;
    p::line_framer framer(max_line);
    const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
    std::string line;
    for (size_t at = 0; at < bytes.size(); at += piece) {
        framer.feed(bytes.substr(at, piece));
        for (auto r = framer.next(line); r != p::line_framer::result::need_more; r = framer.next(line)) {
            if (r == p::line_framer::result::too_long) return 0;
            if (line.size() > max_line) std::abort();
            decode_line(line);
        }
    }
    return 0;
}
