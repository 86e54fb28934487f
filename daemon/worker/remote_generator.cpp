#include "remote_generator.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/ssl.h>

#include "colibri.h"
#include <openssl/x509v3.h>

namespace colibri::worker {

namespace p = protocol;
using nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int poll_ms = 20; // how often a blocked read looks for a cancel
constexpr int connect_timeout_ms = 3000;
constexpr int first_byte_timeout_ms = 600000; // the daemon's deadline ends a job sooner
constexpr std::size_t max_error_body = 64 * 1024;

double ms_since(clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

/// An owned socket descriptor.
class socket_fd {
public:
    explicit socket_fd(int fd = -1) : fd_(fd) {}
    socket_fd(socket_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    socket_fd& operator=(socket_fd&&) = delete;
    ~socket_fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    int get() const { return fd_; }

private:
    int fd_;
};

/// An upstream could not be reached (or failed its TLS check): the request may go to another.
struct connect_failure {
    std::string reason;
};

/// Connects within the timeout, giving up early when the job is cancelled (returns -1).
socket_fd connect_to(const upstream_url& u, piece_sink& sink) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = ::getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &found); rc != 0)
        throw connect_failure{"cannot resolve " + u.host + ": " + ::gai_strerror(rc)};
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
    std::string last = "no address";
    for (addrinfo* a = found; a; a = a->ai_next) {
        socket_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (fd.get() < 0) continue;
        if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            last = std::strerror(errno);
            continue;
        }
        const auto start = clock_type::now();
        for (;;) {
            pollfd pfd{fd.get(), POLLOUT, 0};
            const int n = ::poll(&pfd, 1, poll_ms);
            if (n > 0) break;
            if (sink.poll()) return socket_fd();
            if (ms_since(start) > connect_timeout_ms) throw connect_failure{"connection timed out"};
        }
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            last = std::strerror(err);
            continue;
        }
        ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
        return fd;
    }
    throw connect_failure{last};
}

/// One connection to an upstream, over TLS for https: what the request is written to and
/// its response read from.
class upstream_link {
public:
    upstream_link(socket_fd fd, SSL_CTX* tls, const upstream_url& u) : fd_(std::move(fd)) {
        if (!tls) return;
        ssl_.reset(::SSL_new(tls));
        if (!ssl_ || ::SSL_set_fd(ssl_.get(), fd_.get()) != 1) throw connect_failure{"cannot start TLS"};
        ::SSL_set_tlsext_host_name(ssl_.get(), u.host.c_str()); // SNI
        if (::SSL_set1_host(ssl_.get(), u.host.c_str()) != 1) throw connect_failure{"cannot check the host name"};
        // The handshake blocks: bound it, as the connection was.
        timeval tv{connect_timeout_ms / 1000, 0};
        ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (::SSL_connect(ssl_.get()) != 1) {
            const long verify = ::SSL_get_verify_result(ssl_.get());
            throw connect_failure{verify != X509_V_OK ? std::string("TLS: ") + ::X509_verify_cert_error_string(verify)
                                                      : "the TLS handshake failed"};
        }
        tv = {0, 0};
        ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }

    /// Sends all of `bytes`; false when the upstream went away.
    bool send_all(const std::string& bytes) {
        std::size_t off = 0;
        while (off < bytes.size()) {
            ssize_t n;
            if (ssl_) {
                n = ::SSL_write(ssl_.get(), bytes.data() + off, static_cast<int>(bytes.size() - off));
            } else {
                n = ::send(fd_.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR) continue;
            }
            if (n <= 0) return false;
            off += static_cast<std::size_t>(n);
        }
        return true;
    }

    /// Reads what is there, waiting in short slices so that a cancel is seen within
    /// poll_ms. Returns the bytes read ("" at the end of the stream), or nullopt when
    /// cancelled.
    std::optional<std::string> read_some(piece_sink& sink, int timeout_ms) {
        const auto start = clock_type::now();
        char buf[16384];
        for (;;) {
            if (!ssl_ || ::SSL_pending(ssl_.get()) == 0) {
                pollfd pfd{fd_.get(), POLLIN, 0};
                if (::poll(&pfd, 1, poll_ms) <= 0) {
                    if (sink.poll()) return std::nullopt;
                    if (ms_since(start) > timeout_ms)
                        throw p::protocol_error(p::error_code::unavailable, "the upstream stopped answering");
                    continue;
                }
            }
            if (!ssl_) {
                const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
                if (n < 0 && errno == EINTR) continue;
                return n <= 0 ? std::string() : std::string(buf, static_cast<std::size_t>(n));
            }
            const int n = ::SSL_read(ssl_.get(), buf, sizeof(buf));
            if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
            const int err = ::SSL_get_error(ssl_.get(), n);
            if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) continue; // a partial record
            return std::string();
        }
    }

private:
    struct ssl_free {
        void operator()(SSL* s) const { ::SSL_free(s); }
    };
    socket_fd fd_;
    std::unique_ptr<SSL, ssl_free> ssl_;
};

/// An HTTP/1.1 response read incrementally: status and headers, then the body, with
/// chunked transfer decoded.
class response_reader {
public:
    response_reader(upstream_link& link, piece_sink& sink) : link_(link), sink_(sink) {}

    /// Reads the status line and headers; false when cancelled.
    bool read_head() {
        for (;;) {
            const auto end = buf_.find("\r\n\r\n");
            if (end != std::string::npos) {
                parse_head(buf_.substr(0, end));
                buf_.erase(0, end + 4);
                return true;
            }
            auto more = link_.read_some(sink_, first_byte_timeout_ms);
            if (!more) return false;
            if (more->empty())
                throw p::protocol_error(p::error_code::unavailable, "the upstream closed the connection");
            buf_ += *more;
            if (buf_.size() > 65536)
                throw p::protocol_error(p::error_code::unavailable, "the upstream sent no HTTP response");
        }
    }

    int status() const { return status_; }

    /// The next bytes of the body; "" at its end; nullopt when cancelled.
    std::optional<std::string> body_part() {
        for (;;) {
            if (!chunked_) {
                if (!buf_.empty()) return std::exchange(buf_, {});
                if (done_) return std::string();
                auto more = link_.read_some(sink_, first_byte_timeout_ms);
                if (!more) return std::nullopt;
                if (more->empty()) done_ = true;
                buf_ += *more;
                continue;
            }
            if (done_) return std::string();
            if (chunk_left_ > 0 && !buf_.empty()) {
                const std::size_t n = std::min(chunk_left_, buf_.size());
                std::string out = buf_.substr(0, n);
                buf_.erase(0, n);
                chunk_left_ -= n;
                return out;
            }
            if (chunk_left_ == 0) {
                // [\r\n] SIZE[;ext]\r\n
                std::size_t at = buf_.rfind("\r\n", 0) == 0 && after_chunk_ ? 2 : 0;
                const auto eol = buf_.find("\r\n", at);
                if (eol != std::string::npos) {
                    const std::size_t size = std::strtoull(buf_.substr(at, eol - at).c_str(), nullptr, 16);
                    buf_.erase(0, eol + 2);
                    after_chunk_ = true;
                    if (size == 0) {
                        done_ = true;
                        return std::string();
                    }
                    chunk_left_ = size;
                    continue;
                }
            }
            auto more = link_.read_some(sink_, first_byte_timeout_ms);
            if (!more) return std::nullopt;
            if (more->empty()) throw p::protocol_error(p::error_code::unavailable, "the upstream closed the stream");
            buf_ += *more;
        }
    }

private:
    void parse_head(const std::string& head) {
        std::istringstream in(head);
        std::string line, version;
        std::getline(in, line);
        std::istringstream status_line(line);
        status_line >> version >> status_;
        if (version.rfind("HTTP/1.", 0) != 0)
            throw p::protocol_error(p::error_code::unavailable, "the upstream does not speak HTTP/1.1");
        while (std::getline(in, line)) {
            std::string lower = line;
            std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
            if (lower.rfind("transfer-encoding:", 0) == 0 && lower.find("chunked") != std::string::npos)
                chunked_ = true;
        }
    }

    upstream_link& link_;
    piece_sink& sink_;
    std::string buf_;
    int status_ = 0;
    bool chunked_ = false, done_ = false, after_chunk_ = false;
    std::size_t chunk_left_ = 0;
};

/// max_lines and the indentation limits on streamed text, which the upstream does not
/// know: what may be shown of each piece, and whether the completion ends there.
class line_limits {
public:
    line_limits(const p::complete_request& req) : max_lines_(req.max_lines) {
        int indent = req.min_indent;
        if (req.stop_on_dedent) {
            const auto nl = req.prompt.rfind('\n');
            const std::string_view line = std::string_view(req.prompt).substr(nl == std::string::npos ? 0 : nl + 1);
            indent = std::max(indent, static_cast<int>(line.find_first_not_of(" \t") == std::string_view::npos
                                                           ? line.size()
                                                           : line.find_first_not_of(" \t")));
        }
        min_indent_ = indent;
    }

    /// The part of `text` to emit; sets ended() when a limit is reached.
    std::string push(std::string_view text) {
        std::string out;
        for (const char c : text) {
            if (ended_) break;
            if (c == '\n') {
                if (max_lines_ > 0 && ++newlines_ >= max_lines_) {
                    ended_ = true;
                    break;
                }
                held_ += c; // blank lines stay held until a visible character decides
                in_indent_ = min_indent_ > 0;
                indent_ = 0;
                if (!in_indent_) flush(out);
            } else if (in_indent_ && (c == ' ' || c == '\t' || c == '\r')) {
                held_ += c;
                ++indent_;
            } else {
                if (in_indent_ && indent_ < min_indent_) {
                    ended_ = true;
                    break;
                }
                in_indent_ = false;
                held_ += c;
                flush(out);
            }
        }
        return out;
    }
    /// What is still held when the stream ends by itself.
    std::string finish() { return ended_ ? std::string() : std::exchange(held_, {}); }
    bool ended() const { return ended_; }

private:
    void flush(std::string& out) { out += std::exchange(held_, {}); }

    int max_lines_, min_indent_ = 0;
    int newlines_ = 0, indent_ = 0;
    bool in_indent_ = false, ended_ = false;
    std::string held_;
};

struct upstream_state {
    upstream_url url;
    clock_type::time_point down_until{};
    int backoff_ms = 0; ///< 0: reachable at the last attempt
    bool tried = false;
    std::uint64_t requests = 0; ///< sent to it
    std::uint64_t failures = 0; ///< connections that failed
    double first_piece_ms = -1; ///< of its last answered request: the time to its first text
    std::string last_error;
};

class remote_generator final : public generator {
public:
    remote_generator(std::vector<upstream_url> upstreams, std::string model, std::string key,
                     const std::string& ca_file, const std::string& fim)
        : model_(std::move(model)), key_(std::move(key)) {
        if (fim != "suffix") {
            colibri_fim_text t;
            if (colibri_fim_text_of(fim.c_str(), &t) != COLIBRI_OK)
                throw std::invalid_argument("--upstream-fim must be suffix, starcoder, qwen, deepseek, codellama or "
                                            "codestral (got '" +
                                            fim + "')");
            fim_ = t;
        }
        if (std::any_of(upstreams.begin(), upstreams.end(), [](const auto& u) { return u.tls; })) {
            tls_.reset(::SSL_CTX_new(::TLS_client_method()));
            if (!tls_) throw std::runtime_error("cannot set up TLS");
            ::SSL_CTX_set_min_proto_version(tls_.get(), TLS1_2_VERSION);
            ::SSL_CTX_set_verify(tls_.get(), SSL_VERIFY_PEER, nullptr);
            const bool trusted = ca_file.empty()
                                     ? ::SSL_CTX_set_default_verify_paths(tls_.get()) == 1
                                     : ::SSL_CTX_load_verify_locations(tls_.get(), ca_file.c_str(), nullptr) == 1;
            if (!trusted)
                throw std::invalid_argument("cannot load the certificates to trust" +
                                            (ca_file.empty() ? std::string() : " from '" + ca_file + "'"));
        }
        for (auto& u : upstreams) {
            upstream_state s;
            s.url = std::move(u);
            upstreams_.push_back(std::move(s));
        }
    }

    json info() const override {
        json urls = json::array();
        for (const auto& u : upstreams_) urls.push_back(u.url.text);
        return {{"architecture", "remote"}, {"quant", "none"},
                {"backend", "openai"},      {"n_ctx", 0},
                {"model", model_},          {"upstreams", std::move(urls)}};
    }

    json upstream_stats() const override {
        json out = json::array();
        const auto now = clock_type::now();
        for (const auto& u : upstreams_) {
            json s = {{"url", u.url.text},
                      {"state", !u.tried           ? "unknown"
                                : u.backoff_ms > 0 ? "down"
                                                   : "up"},
                      {"requests", u.requests},
                      {"connect_failures", u.failures},
                      {"first_piece_ms", u.first_piece_ms >= 0 ? json(u.first_piece_ms) : json(nullptr)},
                      {"last_error", u.last_error.empty() ? json(nullptr) : json(u.last_error)}};
            if (u.backoff_ms > 0)
                s["retry_in_ms"] = std::max<std::int64_t>(
                    0, std::chrono::duration_cast<std::chrono::milliseconds>(u.down_until - now).count());
            out.push_back(std::move(s));
        }
        return out;
    }

    result generate(const p::worker::run_msg& job, piece_sink& sink) override {
        const std::string body = request_body(job).dump();
        const int attempts = 2 * static_cast<int>(upstreams_.size());
        std::string failures;
        for (int attempt = 0; attempt < attempts; ++attempt) {
            upstream_state& u = pick();
            const auto wait = u.down_until - clock_type::now();
            if (wait > std::chrono::milliseconds(0) && !sleep_unless_cancelled(wait, sink)) return cancelled();
            try {
                u.tried = true;
                socket_fd fd = connect_to(u.url, sink);
                if (fd.get() < 0) return cancelled();
                upstream_link link(std::move(fd), u.url.tls ? tls_.get() : nullptr, u.url);
                u.backoff_ms = 0;
                ++u.requests;
                return stream(u, link, body, job, sink);
            } catch (const connect_failure& f) {
                u.backoff_ms = std::min(u.backoff_ms == 0 ? 250 : 2 * u.backoff_ms, 30000);
                u.down_until = clock_type::now() + std::chrono::milliseconds(u.backoff_ms);
                ++u.failures;
                u.last_error = f.reason;
                failures += (failures.empty() ? "" : "; ") + u.url.text + ": " + f.reason;
            } catch (const generate_error& e) {
                u.last_error = e.what();
                throw;
            }
        }
        throw generate_error(p::error_code::unavailable, "no upstream could be reached (" + failures + ")");
    }

private:
    static result cancelled() {
        result r;
        r.reason = p::finish_reason::cancelled;
        return r;
    }

    static bool sleep_unless_cancelled(clock_type::duration d, piece_sink& sink) {
        const auto until = clock_type::now() + d;
        while (clock_type::now() < until) {
            if (sink.poll()) return false;
            std::this_thread::sleep_for(
                std::min<clock_type::duration>(until - clock_type::now(), std::chrono::milliseconds(poll_ms)));
        }
        return true;
    }

    /// Round robin over the upstreams that are up; when none is, the one back soonest.
    upstream_state& pick() {
        const auto now = clock_type::now();
        for (std::size_t i = 0; i < upstreams_.size(); ++i) {
            upstream_state& u = upstreams_[(next_ + i) % upstreams_.size()];
            if (u.down_until <= now) {
                next_ = (next_ + i + 1) % upstreams_.size();
                return u;
            }
        }
        return *std::min_element(upstreams_.begin(), upstreams_.end(),
                                 [](const auto& a, const auto& b) { return a.down_until < b.down_until; });
    }

    json request_body(const p::worker::run_msg& job) const {
        const p::complete_request& r = job.req;
        // A warm-up (max_tokens 0) asks for one token, unseen: the server's prefix cache keeps the prompt.
        json b = {{"prompt", fim_ ? fim_prompt(r) : r.prompt},
                  {"max_tokens", std::max(r.max_tokens, 1)},
                  {"temperature", r.temperature},
                  {"top_p", r.top_p},
                  {"top_k", r.top_k > 0 ? r.top_k : -1},
                  {"min_p", r.min_p},
                  {"seed", job.seed},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}}}};
        if (!model_.empty()) b["model"] = model_; // else the upstream's own (llama-server, vLLM's only model)
        if (!fim_ && !r.suffix.empty()) b["suffix"] = r.suffix;
        if (!r.stop.empty()) b["stop"] = r.stop;
        if (r.repeat_penalty != 1.0f) b["repetition_penalty"] = r.repeat_penalty;
        return b;
    }

    /// The prompt as text in the model's own template, context files first (laid out as
    /// the engine lays them out: fim.h, build_context_prompt).
    std::string fim_prompt(const p::complete_request& r) const {
        const colibri_fim_text& t = *fim_;
        std::string text;
        const bool repo = *t.repo_name != '\0' && *t.file_sep != '\0';
        if (!r.context.empty() && repo) text = std::string(t.repo_name) + "myproject\n";
        for (const auto& f : r.context) {
            if (repo) text += std::string(t.file_sep) + (f.filename.empty() ? "tmp" : f.filename) + "\n";
            else text += "\n\n--- snippet ---\n\n";
            text += f.text;
        }
        if (!r.context.empty() && repo) text += std::string(t.file_sep) + "filename\n";
        if (r.suffix.empty()) return text + r.prompt;
        if (*t.middle == '\0') return text + t.suffix + r.suffix + t.prefix + r.prompt; // codestral
        return text + t.prefix + r.prompt + t.suffix + r.suffix + t.middle;
    }

    result stream(upstream_state& u, upstream_link& link, const std::string& body, const p::worker::run_msg& job,
                  piece_sink& sink) {
        const auto t0 = clock_type::now();
        std::string head = "POST " + u.url.path + " HTTP/1.1\r\nHost: " + u.url.host + ":" + u.url.port +
                           "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                           "Connection: close\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n";
        if (!key_.empty()) head += "Authorization: Bearer " + key_ + "\r\n";
        if (!link.send_all(head + "\r\n" + body))
            throw generate_error(p::error_code::unavailable, u.url.text + " closed the connection");
        try {
            response_reader in(link, sink);
            if (!in.read_head()) return cancelled();
            if (in.status() != 200) throw generate_error(error_code_for(in.status()), error_message(u, in));
            result r = read_events(in, job, sink, t0);
            if (r.prefill_ms > 0) u.first_piece_ms = r.prefill_ms;
            return r;
        } catch (const p::protocol_error& e) {
            throw generate_error(e.code(), u.url.text + ": " + e.what());
        }
    }

    static p::error_code error_code_for(int status) {
        return status >= 400 && status < 500 && status != 408 && status != 429 ? p::error_code::invalid_request
                                                                               : p::error_code::unavailable;
    }

    static std::string error_message(const upstream_state& u, response_reader& in) {
        std::string body;
        while (body.size() < max_error_body) {
            auto part = in.body_part();
            if (!part || part->empty()) break;
            body += *part;
        }
        std::string message = body;
        const json j = json::parse(body, nullptr, false);
        if (j.is_object() && j.contains("error")) {
            const json& e = j["error"];
            message = e.is_object() ? e.value("message", e.dump()) : e.is_string() ? e.get<std::string>() : e.dump();
        }
        return u.url.text + " answered " + std::to_string(in.status()) + ": " + message.substr(0, 500);
    }

    result read_events(response_reader& in, const p::worker::run_msg& job, piece_sink& sink,
                       clock_type::time_point t0) {
        result r;
        r.reason = p::finish_reason::length;
        line_limits limits(job.req);
        std::string pending;
        bool first = true;
        int texts = 0; // the count of tokens when the upstream reports no usage
        for (;;) {
            auto part = in.body_part();
            if (!part) return finish_cancelled(r);
            if (part->empty()) throw p::protocol_error(p::error_code::unavailable, "the stream ended without [DONE]");
            pending += *part;
            for (auto eol = pending.find('\n'); eol != std::string::npos; eol = pending.find('\n')) {
                std::string line = pending.substr(0, eol);
                pending.erase(0, eol + 1);
                if (!line.empty() && line.back() == '\r') line.pop_back();
                if (line.rfind("data:", 0) != 0) continue;
                const std::string data = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
                if (data == "[DONE]") {
                    if (const std::string rest = limits.finish(); !rest.empty() && !sink.piece(rest))
                        return finish_cancelled(r);
                    if (job.req.max_tokens == 0) r.tokens.completion_tokens = 0;
                    return finished(r, job.req.max_tokens == 0 ? 0 : texts, t0);
                }
                const json event = json::parse(data, nullptr, false);
                if (!event.is_object()) throw p::protocol_error(p::error_code::unavailable, "a malformed event");
                if (event.contains("error")) {
                    const json& e = event["error"];
                    throw p::protocol_error(p::error_code::unavailable,
                                            e.is_object() ? e.value("message", e.dump()) : e.dump());
                }
                if (const auto u = event.find("usage"); u != event.end() && u->is_object()) {
                    r.tokens.prompt_tokens = u->value("prompt_tokens", 0);
                    r.tokens.completion_tokens = u->value("completion_tokens", 0);
                    if (const auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
                        r.tokens.cached_tokens = d->value("cached_tokens", 0);
                }
                const auto choices = event.find("choices");
                if (choices == event.end() || !choices->is_array() || choices->empty()) continue;
                const json& c = (*choices)[0];
                const std::string text = c.is_object() ? c.value("text", "") : "";
                if (!text.empty()) ++texts;
                if (first && !text.empty()) {
                    r.prefill_ms = ms_since(t0); // the upstream's queue and prompt, and the network
                    first = false;
                }
                if (c.is_object() && c.contains("finish_reason") && c["finish_reason"].is_string())
                    r.reason = c["finish_reason"] == "length" ? p::finish_reason::length : p::finish_reason::stop;
                if (job.req.max_tokens == 0) continue; // a warm-up shows nothing
                const std::string shown = limits.push(text);
                if (!shown.empty() && !sink.piece(shown)) return finish_cancelled(r);
                if (limits.ended()) {
                    r.reason = p::finish_reason::stop; // closing the connection ends the upstream's work
                    return finished(r, texts, t0);
                }
            }
        }
    }

    static result finished(result r, int texts, clock_type::time_point t0) {
        if (r.tokens.completion_tokens == 0) r.tokens.completion_tokens = texts;
        r.decode_ms = std::max(0.0, ms_since(t0) - r.prefill_ms);
        return r;
    }

    static result finish_cancelled(result r) {
        r.reason = p::finish_reason::cancelled;
        return r;
    }

    struct ssl_ctx_free {
        void operator()(SSL_CTX* c) const { ::SSL_CTX_free(c); }
    };
    std::unique_ptr<SSL_CTX, ssl_ctx_free> tls_; ///< with any https upstream
    std::optional<colibri_fim_text> fim_;        ///< the prompt built here; nullopt: `suffix` sent
    std::vector<upstream_state> upstreams_;
    std::size_t next_ = 0;
    std::string model_;
    std::string key_;
};

/// The FIM family whose tokens the served model's tokenizer (tokenizer.json, GGUF or
/// .colibri) has; "suffix" when it has none.
std::string fim_family_of(const std::string& tokenizer_file) {
    const char* family = nullptr;
    if (colibri_fim_family_of_tokenizer(tokenizer_file.c_str(), &family) != COLIBRI_OK)
        throw std::invalid_argument("--upstream-tokenizer " + tokenizer_file + ": " + colibri_last_error());
    return std::string(family) == "none" ? "suffix" : family;
}

std::string read_key_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument("cannot read the upstream key file '" + path + "'");
    std::string key;
    std::getline(in, key);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ')) key.pop_back();
    if (key.empty()) throw std::invalid_argument("the upstream key file '" + path + "' is empty");
    return key;
}

} // namespace

upstream_url parse_upstream_url(const std::string& url) {
    upstream_url u;
    u.text = url;
    u.tls = url.rfind("https://", 0) == 0;
    if (!u.tls && url.rfind("http://", 0) != 0)
        throw std::invalid_argument("--upstream must start with http:// or https:// (got '" + url + "')");
    std::string rest = url.substr(u.tls ? 8 : 7);
    const auto slash = rest.find('/');
    std::string path = slash == std::string::npos ? "" : rest.substr(slash);
    rest = rest.substr(0, slash);
    const auto colon = rest.rfind(':');
    const bool bracketed = !rest.empty() && rest.front() == '[';
    if (colon != std::string::npos && (!bracketed || rest.find(']') < colon)) {
        u.host = rest.substr(0, colon);
        u.port = rest.substr(colon + 1);
    } else {
        u.host = rest;
        u.port = u.tls ? "443" : "80";
    }
    if (u.host.size() >= 2 && u.host.front() == '[' && u.host.back() == ']')
        u.host = u.host.substr(1, u.host.size() - 2);
    if (u.host.empty() || u.port.empty() || u.port.find_first_not_of("0123456789") != std::string::npos)
        throw std::invalid_argument("--upstream " + url + ": expected http[s]://HOST[:PORT][/PATH]");
    while (!path.empty() && path.back() == '/') path.pop_back();
    const bool v1 = path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0;
    u.path = path + (v1 ? "/completions" : "/v1/completions");
    return u;
}

std::unique_ptr<generator> make_remote_generator(const worker_options& opts) {
    if (opts.upstreams.empty()) throw std::invalid_argument("--backend openai needs at least one --upstream");
    if ((opts.upstream_fim == "auto") != !opts.upstream_tokenizer.empty())
        throw std::invalid_argument("--upstream-fim auto and --upstream-tokenizer go together");
    std::vector<upstream_url> urls;
    for (const auto& u : opts.upstreams) urls.push_back(parse_upstream_url(u));
    const std::string key = opts.upstream_key_file.empty() ? "" : read_key_file(opts.upstream_key_file);
    return std::make_unique<remote_generator>(std::move(urls), opts.model, key, opts.upstream_ca_file,
                                              opts.upstream_fim == "auto" ? fim_family_of(opts.upstream_tokenizer)
                                                                          : opts.upstream_fim);
}

} // namespace colibri::worker
