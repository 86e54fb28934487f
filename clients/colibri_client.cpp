// colibri-client: one completion (or a health/status query) against a running colibrid.
// Standard output carries the completion text only; everything else goes to stderr.

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "colibri/protocol/codec.hpp"
#include "colibri/protocol/line_framer.hpp"
#include "colibri/protocol/transport.hpp"

namespace p = colibri::protocol;
using nlohmann::json;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_failed = 1;
constexpr int exit_usage = 2;

const char* const usage_text =
    R"(colibri-client: ask a running colibrid for one completion

Usage: colibri-client [options] [PROMPT]      (no PROMPT and no --prompt: read standard input)
       colibri-client [--socket PATH] [--json] health|status

Options (each --name_with_underscores also accepts --name-with-dashes):
  --socket PATH        daemon socket (default: $XDG_RUNTIME_DIR/colibri/colibri.sock,
                       or /tmp/colibri-$UID/colibri.sock when XDG_RUNTIME_DIR is unset)
  --prompt TEXT        prompt text ('-' reads standard input)
  --suffix TEXT        text after the cursor (fill-in-the-middle)
  --max_tokens N       tokens to generate at most (default 128); 0: only load the prompt
                       into the daemon's cache (warm-up)
  --max_lines N        end before line N+1 of the completion (1: the rest of the line)
  --stop_on_dedent     end before a line indented less than the prompt's last line
  --session NAME       editor buffer; a newer request in the same session cancels this one
  --temperature X      0: greedy (default 0.8)
  --top_p X            top-p, 1: off (default 0.95)
  --top_k N            top-k, 0: off (default 40)
  --min_p X            min-p, 0: off (default 0.05)
  --repeat_penalty X   1: off (default 1.0)
  --seed N             sampling seed (same seed, same text; default: the daemon picks one)
  --stop TEXT          stop string, repeatable; never printed
  --no-stream          receive the completion in one piece (same output)
  --json               print the daemon's events (one JSON object per line) instead of text
  --timeout MS         deadline for the request; the client gives up 5 s after it
  -h, --help           show this help

Exit status: 0 the completion finished (stop or length); 1 the daemon reported an error,
a timeout or a cancellation, or could not be reached; 2 bad usage.
)";

struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct options {
    std::string socket = p::default_socket_path();
    std::optional<std::string> prompt;
    std::string command; // "", "health", "status"
    p::complete_request req;
    bool json_out = false;
    std::optional<std::int64_t> timeout_ms;
};

double to_double(const std::string& flag, const std::string& v) {
    try {
        std::size_t pos = 0;
        const double x = std::stod(v, &pos);
        if (pos == v.size()) return x;
    } catch (const std::exception&) {}
    throw usage_error(flag + " needs a number, got '" + v + "'");
}

long long to_integer(const std::string& flag, const std::string& v) {
    try {
        std::size_t pos = 0;
        const long long x = std::stoll(v, &pos);
        if (pos == v.size()) return x;
    } catch (const std::exception&) {}
    throw usage_error(flag + " needs an integer, got '" + v + "'");
}

options parse_args(int argc, char** argv, bool& help) {
    options o;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            help = true;
            return o;
        }
        if (a.rfind("--", 0) != 0 || a == "--") {
            if (a == "--") {
                for (++i; i < argc; ++i) positional.push_back(argv[i]);
                break;
            }
            positional.push_back(a);
            continue;
        }
        std::string value;
        bool has_value = false;
        if (auto eq = a.find('='); eq != std::string::npos) {
            value = a.substr(eq + 1);
            a.resize(eq);
            has_value = true;
        }
        std::string name = a.substr(2);
        for (auto& ch : name)
            if (ch == '-') ch = '_';
        auto next = [&]() -> std::string {
            if (has_value) return value;
            if (i + 1 >= argc) throw usage_error(a + " needs a value");
            return argv[++i];
        };
        if (name == "json") o.json_out = true;
        else if (name == "no_stream") o.req.stream = false;
        else if (name == "stream") o.req.stream = true;
        else if (name == "socket") o.socket = next();
        else if (name == "prompt") o.prompt = next();
        else if (name == "suffix") o.req.suffix = next();
        else if (name == "max_tokens") o.req.max_tokens = static_cast<int>(to_integer(a, next()));
        else if (name == "max_lines") o.req.max_lines = static_cast<int>(to_integer(a, next()));
        else if (name == "stop_on_dedent") o.req.stop_on_dedent = true;
        else if (name == "session") o.req.session = next();
        else if (name == "temperature") o.req.temperature = static_cast<float>(to_double(a, next()));
        else if (name == "top_p") o.req.top_p = static_cast<float>(to_double(a, next()));
        else if (name == "top_k") o.req.top_k = static_cast<int>(to_integer(a, next()));
        else if (name == "min_p") o.req.min_p = static_cast<float>(to_double(a, next()));
        else if (name == "repeat_penalty") o.req.repeat_penalty = static_cast<float>(to_double(a, next()));
        else if (name == "seed") {
            const auto v = next();
            if (v.empty() || v[0] == '-') throw usage_error("--seed needs a non-negative integer");
            try {
                o.req.seed = std::stoull(v);
            } catch (const std::exception&) {
                throw usage_error("--seed needs a non-negative integer, got '" + v + "'");
            }
        } else if (name == "stop") o.req.stop.push_back(next());
        else if (name == "timeout") o.timeout_ms = to_integer(a, next());
        else throw usage_error("unknown option " + a);
    }
    if (!positional.empty() && (positional[0] == "health" || positional[0] == "status") && positional.size() == 1 &&
        !o.prompt) {
        o.command = positional[0];
        return o;
    }
    if (positional.size() > 1) throw usage_error("give the prompt as one argument (quote it)");
    if (!positional.empty()) {
        if (o.prompt) throw usage_error("give the prompt either as an argument or with --prompt");
        o.prompt = positional[0];
    }
    if (o.timeout_ms && *o.timeout_ms <= 0) throw usage_error("--timeout must be positive");
    o.req.timeout_ms = o.timeout_ms;
    return o;
}

class connection {
public:
    explicit connection(const std::string& path) {
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        if (path.size() >= sizeof(addr.sun_path)) throw std::runtime_error("socket path too long: " + path);
        std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
        fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd_ < 0 || ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
            throw std::runtime_error("cannot connect to " + path + ": " + std::strerror(errno) +
                                     " (is colibrid running?)");
    }
    ~connection() {
        if (fd_ >= 0) ::close(fd_);
    }

    void send(const json& j) {
        if (send_errno_ != 0) return;
        const std::string line = p::frame(p::dump_line(j));
        std::size_t off = 0;
        while (off < line.size()) {
            const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
                // The daemon has closed the connection, usually after saying why (forbidden,
                // busy, shutting down): next() returns that line first.
                send_errno_ = errno;
                return;
            }
            if (n < 0) throw std::runtime_error(std::string("cannot send to the daemon: ") + std::strerror(errno));
            off += static_cast<std::size_t>(n);
        }
    }

    /// Next event; nullopt when the daemon closed the connection. Throws on timeout.
    std::optional<json> next(std::optional<std::chrono::steady_clock::time_point> deadline) {
        std::string line;
        for (;;) {
            const auto r = framer_.next(line);
            if (r == p::line_framer::result::line) return json::parse(line, nullptr, false);
            if (r == p::line_framer::result::too_long) throw std::runtime_error("oversized line from the daemon");
            int wait = -1;
            if (deadline) {
                const auto left =
                    std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
                wait = static_cast<int>(std::max<long long>(0, left.count()));
            }
            pollfd pfd{fd_, POLLIN, 0};
            const int pr = ::poll(&pfd, 1, wait);
            if (pr < 0 && errno == EINTR) continue;
            if (pr == 0) throw std::runtime_error("no answer from the daemon in time");
            char buf[65536];
            const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0 && send_errno_ != 0)
                throw std::runtime_error(std::string("cannot send to the daemon: ") + std::strerror(send_errno_));
            if (n <= 0) return std::nullopt;
            framer_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
        }
    }

private:
    int fd_ = -1;
    int send_errno_ = 0; ///< the send that found the connection closed
    p::line_framer framer_{std::size_t{1} << 30};
};

void print_json_line(const json& j) {
    const std::string s = p::frame(p::dump_line(j));
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

int report_error(const json& ev) {
    std::cerr << "colibri-client: " << ev.value("code", "error") << ": " << ev.value("message", "") << "\n";
    return exit_failed;
}

int run_query(connection& conn, const options& o) {
    const json id = o.command;
    conn.send({{"id", id}, {"op", o.command}});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
        auto ev = conn.next(deadline);
        if (!ev) throw std::runtime_error("the daemon closed the connection");
        if ((*ev)["id"] != id && !(*ev)["id"].is_null()) continue;
        if ((*ev)["event"] == "error") return report_error(*ev);
        if (o.json_out) print_json_line(*ev);
        else if (o.command == "health") std::cout << (*ev)["status"].get<std::string>() << "\n";
        else std::cout << ev->dump(2) << "\n";
        if (o.command == "health") return (*ev)["status"] == "ok" ? exit_ok : exit_failed;
        return exit_ok;
    }
}

int run_completion(connection& conn, options& o) {
    if (!o.prompt || *o.prompt == "-") {
        std::stringstream ss;
        ss << std::cin.rdbuf();
        o.prompt = ss.str();
    }
    o.req.prompt = *o.prompt;
    const json hello_id = "hello";
    const json id = "c";
    // Pipelined: the handshake costs no extra round trip.
    conn.send(p::to_json(p::request{hello_id, p::hello_request{p::protocol_version, "colibri-client"}}));
    conn.send(p::to_json(p::request{id, o.req}));
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (o.timeout_ms) deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(*o.timeout_ms + 5000);
    for (;;) {
        auto ev = conn.next(deadline);
        if (!ev) throw std::runtime_error("the daemon closed the connection before the completion ended");
        if (ev->is_discarded()) throw std::runtime_error("malformed line from the daemon");
        if (o.json_out && (*ev)["id"] != hello_id) print_json_line(*ev);
        const std::string event = ev->value("event", "");
        if ((*ev)["id"] == hello_id) {
            if (event == "error") return report_error(*ev); // unsupported_protocol
            continue;
        }
        if ((*ev)["id"] != id) {
            if (event == "error") return report_error(*ev); // e.g. shutting down, forbidden
            continue;
        }
        if (event == "piece") {
            if (!o.json_out) {
                const auto& text = (*ev)["text"].get_ref<const std::string&>();
                std::fwrite(text.data(), 1, text.size(), stdout);
                std::fflush(stdout);
            }
            continue;
        }
        if (event == "error") return report_error(*ev);
        if (event == "done") {
            const auto done = p::parse_done_event(*ev);
            if (!o.json_out && done.text) {
                std::fwrite(done.text->data(), 1, done.text->size(), stdout);
                std::fflush(stdout);
            }
            if (done.reason == p::finish_reason::stop || done.reason == p::finish_reason::length) return exit_ok;
            std::cerr << "colibri-client: the completion ended early: " << p::to_string(done.reason) << "\n";
            return exit_failed;
        }
    }
}

} // namespace

int main(int argc, char** argv) {
    options o;
    try {
        bool help = false;
        o = parse_args(argc, argv, help);
        if (help) {
            std::cout << usage_text;
            return exit_ok;
        }
    } catch (const usage_error& e) {
        std::cerr << "colibri-client: " << e.what() << "\n(see --help)\n";
        return exit_usage;
    }
    try {
        connection conn(o.socket);
        return o.command.empty() ? run_completion(conn, o) : run_query(conn, o);
    } catch (const std::exception& e) {
        std::cerr << "colibri-client: " << e.what() << "\n";
        return exit_failed;
    }
}
