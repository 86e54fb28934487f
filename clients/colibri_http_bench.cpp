// colibri-http-bench: completion latency through an HTTP server that speaks llama-server's
// /infill (colibrid --http, or llama-server itself), on one keep-alive connection.
//   typing    text typed into a file one character at a time, one request per keystroke,
//             each waited for: /infill as llama.vim sends it (prefix: the lines above,
//             prompt: the cursor's line so far, suffix: the lines below), or /completion
//             with the text before the cursor (for models without fill-in-the-middle
//             tokens, which llama-server's /infill refuses). Reports the time to the whole
//             reply (median, p95) and the server's prompt and generation times and reused
//             prompt tokens;
//   overhead  with --socket, the same small completion alternately over HTTP
//             (/completion) and colibrid's socket: the HTTP front's cost per request.
// Prints a table, or one JSON object per measurement with --json.

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "bench_support.hpp"
#include "command_line.hpp"

namespace asio = boost::asio;
namespace http = boost::beast::http;
namespace po = boost::program_options;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

using colibri::bench::percentile;

/// One keep-alive HTTP connection to HOST:PORT.
class http_connection {
public:
    http_connection(const std::string& host, const std::string& port) : socket_(io_) {
        asio::ip::tcp::resolver resolver(io_);
        asio::connect(socket_, resolver.resolve(host, port));
        socket_.set_option(asio::ip::tcp::no_delay(true));
        host_ = host + ":" + port;
    }

    json post(const std::string& target, const json& body) {
        http::request<http::string_body> req{http::verb::post, target, 11};
        req.set(http::field::host, host_);
        req.set(http::field::content_type, "application/json");
        req.body() = body.dump();
        req.prepare_payload();
        http::write(socket_, req);
        http::response<http::string_body> res;
        http::read(socket_, buffer_, res);
        if (res.result() != http::status::ok)
            throw std::runtime_error(target + " answered " + std::to_string(res.result_int()) + ": " + res.body());
        return json::parse(res.body());
    }

private:
    asio::io_context io_;
    asio::ip::tcp::socket socket_;
    boost::beast::flat_buffer buffer_;
    std::string host_;
};

/// One connection to colibrid's socket, one request at a time.
class socket_connection {
public:
    explicit socket_connection(const std::string& path) : fd_(colibri::bench::connect_daemon(path)) {}
    ~socket_connection() { ::close(fd_); }

    /// Sends a request and returns its final event.
    json call(const json& req) {
        const std::string line = req.dump() + "\n";
        if (::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
            throw std::runtime_error("send failed");
        for (;;) {
            const auto nl = buf_.find('\n');
            if (nl != std::string::npos) {
                json event = json::parse(buf_.substr(0, nl));
                buf_.erase(0, nl + 1);
                const std::string kind = event.value("event", "");
                if (kind == "done" || kind == "error") return event;
                continue;
            }
            char tmp[65536];
            const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
            if (n <= 0) throw std::runtime_error("the daemon closed the connection");
            buf_.append(tmp, static_cast<size_t>(n));
        }
    }

private:
    int fd_ = -1;
    std::string buf_;
};

std::string default_text() {
    std::string s;
    for (int i = 0; i < 40; ++i)
        s += "def handler_" + std::to_string(i) + "(request, retries=" + std::to_string(i % 7) +
             "):\n    if request.method == 'GET':\n        return fetch(request.path, timeout=" +
             std::to_string(10 + i) + ")\n    raise ValueError('unsupported method')\n\n";
    return s;
}

struct stats {
    std::vector<double> total_ms, prompt_ms, predicted_ms, prompt_n, cache_n;
};

json summary(const std::string& name, const stats& s) {
    return {{"measurement", name},
            {"requests", s.total_ms.size()},
            {"total_ms_median", percentile(s.total_ms, 0.5)},
            {"total_ms_p95", percentile(s.total_ms, 0.95)},
            {"prompt_ms_median", percentile(s.prompt_ms, 0.5)},
            {"predicted_ms_median", percentile(s.predicted_ms, 0.5)},
            {"prompt_n_median", percentile(s.prompt_n, 0.5)},
            {"cache_n_median", percentile(s.cache_n, 0.5)}};
}

} // namespace

int main(int argc, char** argv) {
    std::string url = "http://127.0.0.1:8012", socket, text_file;
    int keystrokes = 60, n_predict = 16, overhead = 0, start_chars = 2000;
    std::string endpoint = "infill";
    bool as_json = false, no_speculative = false;
    po::options_description opts(
        "colibri-http-bench: completion latency through llama-server's /infill (colibrid --http or llama-server)\n\n"
        "  colibri-http-bench [--url http://HOST:PORT] [options]\n\nOptions");
    opts.add_options()("help,h", "show this help")("url", po::value(&url),
                                                   "the server (default http://127.0.0.1:8012)")(
        "text", po::value(&text_file), "source text to type (default: generated Python)")(
        "start", po::value(&start_chars), "typing: characters already written when typing starts (default 2000)")(
        "keystrokes", po::value(&keystrokes), "typing: keystrokes, one request each (default 60; 0: skip)")(
        "endpoint", po::value(&endpoint), "typing: infill (default) or completion")(
        "n-predict", po::value(&n_predict), "tokens per completion (default 16)")(
        "socket", po::value(&socket), "overhead: colibrid's socket, to compare with its HTTP front")(
        "overhead", po::value(&overhead), "overhead: requests over each transport, alternating (default 0: skip)")(
        "no-speculative", po::bool_switch(&no_speculative),
        "typing: ask colibrid for plain decoding (\"speculative\": false; llama-server ignores it)")(
        "json", po::bool_switch(&as_json), "one JSON object per measurement");
    po::variables_map vm;
    if (const int status = colibri::cli::parse(argc, argv, "colibri-http-bench", opts, vm); status >= 0) return status;
    const std::string prefix = "http://";
    const auto colon = url.rfind(':');
    if (url.rfind(prefix, 0) != 0 || colon == std::string::npos || colon < prefix.size()) {
        std::cerr << "colibri-http-bench: --url must be http://HOST:PORT\n";
        return 2;
    }
    const std::string host = url.substr(prefix.size(), colon - prefix.size());
    std::string port = url.substr(colon + 1);
    if (auto slash = port.find('/'); slash != std::string::npos) port.resize(slash);

    std::string text = default_text();
    if (!text_file.empty()) {
        std::ifstream in(text_file);
        if (!in) {
            std::cerr << "colibri-http-bench: cannot read " << text_file << "\n";
            return 2;
        }
        std::stringstream all;
        all << in.rdbuf();
        text = all.str();
    }
    if (endpoint != "infill" && endpoint != "completion") {
        std::cerr << "colibri-http-bench: --endpoint must be infill or completion\n";
        return 2;
    }
    if (static_cast<size_t>(start_chars + keystrokes) > text.size()) {
        std::cerr << "colibri-http-bench: the text is shorter than --start plus --keystrokes\n";
        return 2;
    }

    std::vector<json> out;
    try {
        http_connection conn(host, port);
        if (keystrokes > 0) {
            stats s;
            // The user types text[start, end) at `start`; the rest of the file stays below.
            const size_t start = static_cast<size_t>(start_chars), end = start + static_cast<size_t>(keystrokes);
            size_t suffix_end = end;
            for (int lines = 0; lines < 64 && suffix_end < text.size(); ++lines) {
                const size_t nl = text.find('\n', suffix_end);
                suffix_end = nl == std::string::npos ? text.size() : nl + 1;
            }
            const std::string suffix = text.substr(end, suffix_end - end);
            // One warm request first: the server's cache then holds the file as written so far.
            for (int k = -1; k < keystrokes; ++k) {
                const size_t cursor = start + static_cast<size_t>(std::max(k, 0));
                const size_t line_start = text.rfind('\n', cursor - 1) + 1;
                json req = {{"n_predict", n_predict}, {"temperature", 0}, {"top_k", 40},
                            {"top_p", 0.99},          {"stream", false},  {"cache_prompt", true}};
                if (no_speculative) req["speculative"] = false;
                if (endpoint == "infill") {
                    req.update({{"input_prefix", text.substr(0, line_start)},
                                {"prompt", text.substr(line_start, cursor - line_start)},
                                {"input_suffix", suffix},
                                {"input_extra", json::array()},
                                {"samplers", {"top_k", "top_p", "infill"}},
                                {"t_max_prompt_ms", 500},
                                {"t_max_predict_ms", 3000}});
                } else {
                    req["prompt"] = text.substr(0, cursor);
                }
                const auto t0 = clock_type::now();
                const json r = conn.post("/" + endpoint, req);
                const double total = ms_since(t0);
                if (k < 0) continue;
                const json& t = r.at("timings");
                s.total_ms.push_back(total);
                s.prompt_ms.push_back(t.value("prompt_ms", 0.0));
                s.predicted_ms.push_back(t.value("predicted_ms", 0.0));
                s.prompt_n.push_back(t.value("prompt_n", 0.0));
                s.cache_n.push_back(t.value("cache_n", 0.0));
            }
            out.push_back(summary("typing", s));
        }
        if (overhead > 0) {
            if (socket.empty()) throw std::runtime_error("--overhead needs --socket");
            socket_connection sock(socket);
            const std::string prompt = text.substr(0, 200);
            stats over_http, over_socket;
            for (int i = -1; i < overhead; ++i) {
                auto t0 = clock_type::now();
                conn.post("/completion", {{"prompt", prompt}, {"n_predict", 1}, {"temperature", 0}});
                const double h = ms_since(t0);
                t0 = clock_type::now();
                const json done = sock.call({{"id", i + 2},
                                             {"op", "complete"},
                                             {"prompt", prompt},
                                             {"max_tokens", 1},
                                             {"temperature", 0},
                                             {"stream", false}});
                const double u = ms_since(t0);
                if (done.value("event", "") != "done") throw std::runtime_error("socket: " + done.dump());
                if (i < 0) continue; // the first fills the cache
                over_http.total_ms.push_back(h);
                over_socket.total_ms.push_back(u);
            }
            json o = {{"measurement", "overhead"},
                      {"requests", overhead},
                      {"http_ms_median", percentile(over_http.total_ms, 0.5)},
                      {"http_ms_p95", percentile(over_http.total_ms, 0.95)},
                      {"socket_ms_median", percentile(over_socket.total_ms, 0.5)},
                      {"socket_ms_p95", percentile(over_socket.total_ms, 0.95)}};
            o["http_overhead_ms"] = o["http_ms_median"].get<double>() - o["socket_ms_median"].get<double>();
            out.push_back(o);
        }
    } catch (const std::exception& e) {
        std::cerr << "colibri-http-bench: " << e.what() << "\n";
        return 1;
    }
    for (const json& m : out) {
        if (as_json) {
            std::cout << m.dump() << "\n";
        } else if (m["measurement"] == "typing") {
            std::printf("typing   %d keystrokes: reply %.1f ms median, %.1f p95; server: prompt %.1f ms for %.0f "
                        "tokens (%.0f reused), generation %.1f ms\n",
                        m["requests"].get<int>(), m["total_ms_median"].get<double>(), m["total_ms_p95"].get<double>(),
                        m["prompt_ms_median"].get<double>(), m["prompt_n_median"].get<double>(),
                        m["cache_n_median"].get<double>(), m["predicted_ms_median"].get<double>());
        } else {
            std::printf("overhead %d requests: HTTP %.3f ms median (p95 %.3f), socket %.3f ms (p95 %.3f): the HTTP "
                        "front adds %.3f ms\n",
                        m["requests"].get<int>(), m["http_ms_median"].get<double>(), m["http_ms_p95"].get<double>(),
                        m["socket_ms_median"].get<double>(), m["socket_ms_p95"].get<double>(),
                        m["http_overhead_ms"].get<double>());
        }
    }
    return 0;
}
