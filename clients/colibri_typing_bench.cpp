// colibri-typing-bench: what a user typing in an editor feels, measured through a running
// colibrid. Two measurements on the same text:
//   follow-up  a cold prompt of about N tokens, then the same prompt extended by 1 and by 5
//              characters: time to first token of each, against one decode step;
//   typing     one request per keystroke in one session (each supersedes the previous),
//              keystrokes in bursts (a word typed at a fixed interval, then a pause while
//              the user reads the suggestion): time to first token and to a 16-token
//              completion (median, p95) of the requests that were not superseded, and how
//              many were; with and without prompt reuse (without: every prompt starts with
//              a unique line, so nothing is shared). Time to first token is the daemon's
//              queued + prompt time (a random-weight model's tokens may decode to no text,
//              so the first piece can come late); the completion time is the client's.
// Prints a table, or one JSON object per measurement with --json.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "bench_support.hpp"
#include "colibri/protocol/transport.hpp"
#include "command_line.hpp"

namespace po = boost::program_options;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0, clock_type::time_point t1) {
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

/// One connection; a reader thread records when each request's events arrive.
class connection {
public:
    struct record {
        clock_type::time_point sent, first_event, final_event;
        bool has_first = false, finished = false;
        json final;
    };

    explicit connection(const std::string& path) : fd_(colibri::bench::connect_daemon(path)) {
        reader_ = std::thread([this] { read_loop(); });
    }
    ~connection() {
        ::shutdown(fd_, SHUT_RDWR);
        reader_.join();
        ::close(fd_);
    }

    void send(const json& req) {
        {
            std::lock_guard lock(mu_);
            auto& r = records_[req.at("id").dump()];
            r = record{};
            r.sent = clock_type::now();
        }
        const std::string line = req.dump() + "\n";
        for (size_t off = 0; off < line.size();) {
            const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
            if (n <= 0) throw std::runtime_error("the daemon closed the connection");
            off += static_cast<size_t>(n);
        }
    }

    record wait(const json& id) {
        std::unique_lock lock(mu_);
        const std::string key = id.dump();
        if (!cv_.wait_for(lock, std::chrono::minutes(10), [&] { return closed_ || records_[key].finished; }))
            throw std::runtime_error("no final event for " + key);
        if (!records_[key].finished) throw std::runtime_error("the daemon closed the connection");
        return records_[key];
    }

    json call(const json& req) {
        send(req);
        return wait(req.at("id")).final;
    }

private:
    void read_loop() {
        std::string buf;
        char chunk[65536];
        for (;;) {
            const ssize_t n = ::read(fd_, chunk, sizeof chunk);
            if (n <= 0) break;
            buf.append(chunk, static_cast<size_t>(n));
            for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
                const auto now = clock_type::now();
                json ev = json::parse(buf.substr(0, nl), nullptr, false);
                if (ev.is_discarded() || !ev.contains("id")) continue;
                std::lock_guard lock(mu_);
                auto& r = records_[ev["id"].dump()];
                if (!r.has_first) {
                    r.has_first = true;
                    r.first_event = now;
                }
                const std::string e = ev.value("event", "");
                if (e != "piece") {
                    r.finished = true;
                    r.final_event = now;
                    r.final = std::move(ev);
                    cv_.notify_all();
                }
            }
        }
        std::lock_guard lock(mu_);
        closed_ = true;
        cv_.notify_all();
    }

    int fd_ = -1;
    std::thread reader_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, record> records_;
    bool closed_ = false;
};

using colibri::bench::percentile;

bool speculative = true; // --no-speculative: every request asks for plain decoding

json complete_req(const json& id, const std::string& prompt, int max_tokens) {
    json req = {{"id", id},         {"op", "complete"},    {"prompt", prompt}, {"max_tokens", max_tokens},
                {"temperature", 0}, {"timeout_ms", 600000}};
    if (!speculative) req["speculative"] = false;
    return req;
}

std::string default_text() {
    std::string s;
    for (int i = 0; i < 400; ++i)
        s += "def handler_" + std::to_string(i) + "(request, retries=" + std::to_string(i % 7) +
             "):\n    if request.method == 'GET':\n        return fetch(request.path, timeout=" +
             std::to_string(10 + i) + ")\n    raise ValueError('unsupported method')\n\n";
    return s;
}

} // namespace

int main(int argc, char** argv) {
    std::string socket = colibri::protocol::default_socket_path(), text_file, sizes_arg = "500,1000";
    int keystrokes = 30, interval_ms = 100, burst = 5, pause_ms = 4000, max_tokens = 16, typing_tokens = 500,
        suffix_chars = 0;
    bool as_json = false;
    po::options_description opts("colibri-typing-bench: latency as you type, through a running colibrid\n\n"
                                 "  colibri-typing-bench [--socket PATH] [options]\n\nOptions");
    opts.add_options()("help,h", "show this help")("socket", po::value(&socket), "the daemon's socket")(
        "text", po::value(&text_file), "source text to type (default: generated Python)")(
        "sizes", po::value(&sizes_arg), "follow-up: prompt sizes in tokens, comma-separated (default 500,1000)")(
        "typing-tokens", po::value(&typing_tokens), "typing: tokens of text before the cursor (default 500)")(
        "suffix-chars", po::value(&suffix_chars),
        "typing: characters of text after the cursor sent as the suffix "
        "(fill-in-the-middle; default 0: none)")("keystrokes", po::value(&keystrokes),
                                                 "typing: keystrokes (default 30)")(
        "interval-ms", po::value(&interval_ms), "typing: time between keystrokes of a burst (default 100)")(
        "burst", po::value(&burst), "typing: keystrokes per burst (default 5)")(
        "pause-ms", po::value(&pause_ms), "typing: pause after each burst (default 4000)")(
        "max-tokens", po::value(&max_tokens), "typing: tokens per completion (default 16)")(
        "json", po::bool_switch(&as_json), "one JSON object per measurement")(
        "no-speculative", "requests without drafts from the context (the daemon's speculative decoding off)");
    po::variables_map vm;
    if (const int status = colibri::cli::parse(argc, argv, "colibri-typing-bench", opts, vm); status >= 0)
        return status;
    speculative = vm.count("no-speculative") == 0;
    try {
        std::string text = default_text();
        if (!text_file.empty()) {
            std::ifstream in(text_file, std::ios::binary);
            if (!in) throw std::runtime_error("cannot read " + text_file);
            text.assign(std::istreambuf_iterator<char>(in), {});
        }
        std::vector<int> sizes;
        std::stringstream ss(sizes_arg);
        for (std::string tok; std::getline(ss, tok, ',');) sizes.push_back(std::stoi(tok));

        connection c(socket);
        int next_id = 0;
        auto id = [&] { return json(next_id++); };
        std::mt19937_64 rng(std::random_device{}());
        auto unique_line = [&] { return "# session " + std::to_string(rng()) + "\n"; };
        // Characters per token of this text, from a short warm-up request.
        const size_t probe_chars = std::min<size_t>(text.size(), 600);
        const json probe = c.call(complete_req(id(), unique_line() + text.substr(0, probe_chars), 0));
        if (probe.value("event", "") != "done") throw std::runtime_error("the daemon answered " + probe.dump());
        const double chars_per_token = static_cast<double>(probe_chars) / probe["usage"]["prompt_tokens"].get<double>();
        auto chars_for = [&](int tokens) {
            const auto n = static_cast<size_t>(tokens * chars_per_token);
            if (n + 16 > text.size())
                throw std::runtime_error("the text is too short for " + std::to_string(tokens) + " tokens");
            return n;
        };

        // Follow-up: cold, +1 character, +5 characters (time to the first token: max_tokens 1).
        for (int size : sizes) {
            const std::string head = unique_line();
            const size_t n = chars_for(size);
            auto first_token = [&](const std::string& prompt) {
                const json rid = id();
                c.send(complete_req(rid, prompt, 1));
                const auto r = c.wait(rid);
                if (r.final.value("event", "") != "done") throw std::runtime_error("failed: " + r.final.dump());
                return std::make_pair(ms_since(r.sent, r.first_event), r.final);
            };
            const auto [cold_ms, cold] = first_token(head + text.substr(0, n));
            const auto [plus1_ms, plus1] = first_token(head + text.substr(0, n + 1));
            const auto [plus5_ms, plus5] = first_token(head + text.substr(0, n + 6));
            // One decode step on this context: a longer completion of the same prompt.
            const json dec = c.call(complete_req(id(), head + text.substr(0, n + 6), 17));
            const int gen = dec["usage"]["completion_tokens"].get<int>();
            const double step_ms = gen > 1 ? dec["timings"]["decode_ms"].get<double>() / (gen - 1) : 0;
            json row = {{"measure", "follow-up"},
                        {"prompt_tokens", cold["usage"]["prompt_tokens"]},
                        {"cold_ttft_ms", cold_ms},
                        {"plus1_ttft_ms", plus1_ms},
                        {"plus1_new_tokens",
                         plus1["usage"]["prompt_tokens"].get<int>() - plus1["usage"]["cached_tokens"].get<int>()},
                        {"plus5_ttft_ms", plus5_ms},
                        {"plus5_new_tokens",
                         plus5["usage"]["prompt_tokens"].get<int>() - plus5["usage"]["cached_tokens"].get<int>()},
                        {"decode_step_ms", step_ms}};
            if (as_json) {
                std::cout << row.dump() << std::endl;
            } else {
                std::printf("follow-up  %4d tokens: cold %8.1f ms | +1 char %6.1f ms (%d new tokens, %.2f%% of cold, "
                            "%.2fx a decode step)"
                            " | +5 chars %6.1f ms (%d new, %.2f%%, %.2fx) | decode step %.1f ms\n",
                            row["prompt_tokens"].get<int>(), cold_ms, plus1_ms, row["plus1_new_tokens"].get<int>(),
                            100 * plus1_ms / cold_ms, plus1_ms / step_ms, plus5_ms, row["plus5_new_tokens"].get<int>(),
                            100 * plus5_ms / cold_ms, plus5_ms / step_ms, step_ms);
                std::fflush(stdout);
            }
        }

        // Typing: one request per keystroke in one session.
        const size_t start = chars_for(typing_tokens);
        const std::string suffix =
            suffix_chars > 0 ? text.substr(start + static_cast<size_t>(keystrokes), static_cast<size_t>(suffix_chars))
                             : std::string();
        auto with_suffix = [&](json req) {
            if (!suffix.empty()) req["suffix"] = suffix;
            return req;
        };
        for (const bool reuse : {true, false}) {
            const std::string head = unique_line();
            const std::string session = "typing-bench-" + std::to_string(rng());
            // The text before the first keystroke is in the cache, as after earlier typing.
            c.call(with_suffix(complete_req(id(), head + text.substr(0, start), 0)));
            std::vector<json> ids;
            auto at = clock_type::now();
            for (int k = 1; k <= keystrokes; ++k) {
                std::this_thread::sleep_until(at);
                at += std::chrono::milliseconds(k % std::max(burst, 1) == 0 ? pause_ms : interval_ms);
                const std::string prompt =
                    (reuse ? head : unique_line()) + text.substr(0, start + static_cast<size_t>(k));
                json req = with_suffix(complete_req(id(), prompt, max_tokens));
                req["session"] = session;
                ids.push_back(req["id"]);
                c.send(req);
            }
            std::vector<double> ttft, full, recomputed, queued;
            int cancelled = 0;
            for (const json& rid : ids) {
                const auto r = c.wait(rid);
                const std::string reason = r.final.value("finish_reason", "");
                if (reason == "cancelled") {
                    ++cancelled;
                    continue;
                }
                // queued: waiting for the worker, which first stops the request this one superseded
                queued.push_back(r.final["timings"].value("queued_ms", 0.0));
                ttft.push_back(queued.back() + r.final["timings"].value("prefill_ms", 0.0));
                full.push_back(ms_since(r.sent, r.final_event));
                const json& u = r.final["usage"];
                recomputed.push_back(u["prompt_tokens"].get<double>() - u["cached_tokens"].get<double>());
            }
            json row = {{"measure", "typing"},
                        {"reuse", reuse},
                        {"keystrokes", keystrokes},
                        {"interval_ms", interval_ms},
                        {"burst", burst},
                        {"pause_ms", pause_ms},
                        {"completed", ttft.size()},
                        {"cancelled", cancelled},
                        {"ttft_median_ms", percentile(ttft, 0.5)},
                        {"ttft_p95_ms", percentile(ttft, 0.95)},
                        {"complete_median_ms", percentile(full, 0.5)},
                        {"complete_p95_ms", percentile(full, 0.95)},
                        {"queued_median_ms", percentile(queued, 0.5)},
                        {"queued_p95_ms", percentile(queued, 0.95)},
                        {"suffix_chars", suffix.size()},
                        {"recomputed_tokens_median", percentile(recomputed, 0.5)}};
            if (as_json) {
                std::cout << row.dump() << std::endl;
            } else {
                std::printf(
                    "typing     %s reuse: %d keystrokes (bursts of %d every %d ms, then %d ms), %zu completed, %d "
                    "superseded | queued median %.1f ms p95 %.1f ms | first token median %.1f ms p95 %.1f ms | %d "
                    "tokens median %.1f ms p95 %.1f ms | prompt tokens computed median %.0f\n",
                    reuse ? "with   " : "without", keystrokes, burst, interval_ms, pause_ms, ttft.size(), cancelled,
                    percentile(queued, 0.5), percentile(queued, 0.95), percentile(ttft, 0.5), percentile(ttft, 0.95),
                    max_tokens, percentile(full, 0.5), percentile(full, 0.95), percentile(recomputed, 0.5));
                std::fflush(stdout);
            }
        }
    } catch (const std::exception& e) {
        std::cerr << "colibri-typing-bench: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
