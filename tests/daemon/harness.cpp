#include "harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

namespace colibri::test {

namespace {

using clock_type = std::chrono::steady_clock;

sockaddr_un unix_addr(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) throw std::runtime_error("socket path too long: " + path);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return addr;
}

int remaining_ms(clock_type::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    return left > 0 ? static_cast<int>(left) : 0;
}

std::optional<int> wait_pid(pid_t pid, std::chrono::milliseconds timeout) {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (r < 0) return std::nullopt;
        if (clock_type::now() >= deadline) return std::nullopt;
        // Polling a child's exit: there is no portable fd to wait on in this harness.
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

} // namespace

temp_dir::temp_dir() {
    char tmpl[] = "/tmp/colibri-test-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
}

temp_dir::~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

daemon_process::daemon_process(const options& overrides, bool wait, const std::string& model_content, int listen_fd,
                               const launch_options& launch) {
    socket_ = dir_.path() + "/run/colibri.sock";
    model_ = dir_.path() + "/model.colibri";
    log_path_ = dir_.path() + "/colibrid.log";
    std::ofstream(model_) << model_content;

    notify_path_ = dir_.path() + "/notify";
    notify_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    const sockaddr_un naddr = unix_addr(notify_path_);
    if (::bind(notify_fd_, reinterpret_cast<const sockaddr*>(&naddr), sizeof(naddr)) != 0)
        throw std::runtime_error("cannot bind the notify socket");

    options opts = {
        {"--model", model_},
        {"--socket", socket_},
        {"--worker-exe", COLIBRI_TEST_WORKER_EXE},
        {"--enable-fault-injection", ""},
        {"--log-level", "debug"},
        {"--ping-interval-ms", "50"},
        {"--liveness-timeout-ms", "2000"},
        {"--progress-timeout-ms", "2000"},
        {"--restart-backoff-ms", "10"},
        {"--restart-backoff-max-ms", "100"},
        {"--crash-loop-threshold", "50"},
        {"--shutdown-grace-ms", "2000"},
    };
    for (const auto& [k, v] : overrides) {
        if (v == "<remove>") opts.erase(k);
        else opts[k] = v;
    }
    if (opts.count("--socket")) socket_ = opts["--socket"];
    if (listen_fd >= 0) opts.erase("--socket");
    std::vector<std::string> args = launch.wrapper;
    args.push_back(COLIBRID_EXE);
    for (const auto& [k, v] : opts) {
        args.push_back(k);
        if (!v.empty()) args.push_back(v);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string notify_env = "NOTIFY_SOCKET=" + notify_path_;
    std::vector<std::pair<std::string, std::string>> env;
    for (const auto& e : launch.env) {
        const auto eq = e.find('=');
        env.emplace_back(e.substr(0, eq), eq == std::string::npos ? "" : e.substr(eq + 1));
    }

    pid_ = ::fork();
    if (pid_ == 0) {
        const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(log, 2);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM); // never outlive a test binary killed by ctest
        ::putenv(const_cast<char*>(notify_env.c_str()));
        const std::string self = std::to_string(::getpid());
        for (auto& [name, value] : env) {
            if (value == "$PID") value = self;
            ::setenv(name.c_str(), value.c_str(), 1);
        }
        if (listen_fd >= 0) {
            ::dup2(listen_fd, 3);
            const std::string pid = std::to_string(::getpid());
            ::setenv("LISTEN_PID", pid.c_str(), 1);
            ::setenv("LISTEN_FDS", "1", 1);
        }
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    if (wait && !wait_ready()) throw std::runtime_error("colibrid did not become ready; log:\n" + log());
}

daemon_process::~daemon_process() {
    if (pid_ > 0 && !stop(SIGTERM, std::chrono::seconds(5))) {
        ::kill(pid_, SIGKILL);
        wait_pid(pid_, std::chrono::seconds(5));
    }
    if (notify_fd_ >= 0) ::close(notify_fd_);
}

bool daemon_process::wait_ready(std::chrono::milliseconds timeout) {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
        const int left = remaining_ms(deadline);
        if (auto msg = next_notification(std::chrono::milliseconds(std::min(left, 100)))) {
            if (msg->find("READY=1") != std::string::npos) return true;
        }
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            return false;
        }
        if (left == 0) return false;
    }
}

std::optional<std::string> daemon_process::next_notification(std::chrono::milliseconds timeout) {
    pollfd pfd{notify_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::recv(notify_fd_, buf, sizeof(buf), 0);
    if (n < 0) return std::nullopt;
    notifications_.emplace_back(buf, static_cast<std::size_t>(n));
    return notifications_.back();
}

std::optional<int> daemon_process::stop(int sig, std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    ::kill(pid_, sig);
    return wait_exit(timeout);
}

std::optional<int> daemon_process::wait_exit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    auto status = wait_pid(pid_, timeout);
    if (status) pid_ = -1;
    return status;
}

std::string daemon_process::log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

run_result run_command(const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                       const std::string& input) {
    temp_dir dir;
    const std::string err_path = dir.path() + "/stderr";
    const std::string out_path = dir.path() + "/stdout";
    const std::string in_path = dir.path() + "/stdin";
    std::ofstream(in_path) << input;
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        const int in = ::open(in_path.c_str(), O_RDONLY);
        ::dup2(err, 2);
        ::dup2(out, 1);
        ::dup2(in, 0);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    run_result r;
    auto status = wait_pid(pid, timeout);
    if (!status) {
        ::kill(pid, SIGKILL);
        wait_pid(pid, std::chrono::seconds(5));
        throw std::runtime_error("command timed out: " + args[0]);
    }
    r.status = *status;
    auto slurp = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
    };
    r.err = slurp(err_path);
    r.out = slurp(out_path);
    return r;
}

client::client(const std::string& socket_path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_un addr = unix_addr(socket_path);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        const int err = errno;
        ::close(fd_);
        fd_ = -1;
        throw std::runtime_error("cannot connect to " + socket_path + ": " + std::strerror(err));
    }
}

client::~client() { close(); }

void client::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

void client::send_raw(const std::string& bytes) {
    std::size_t off = 0;
    while (off < bytes.size()) {
        const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw std::runtime_error(std::string("send failed: ") + std::strerror(errno));
        }
        off += static_cast<std::size_t>(n);
    }
}

std::optional<json> client::read_line(std::chrono::milliseconds timeout) {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
        const auto nl = buf_.find('\n');
        if (nl != std::string::npos) {
            const std::string line = buf_.substr(0, nl);
            buf_.erase(0, nl + 1);
            return json::parse(line);
        }
        pollfd pfd{fd_, POLLIN, 0};
        const int left = remaining_ms(deadline);
        if (left == 0 || ::poll(&pfd, 1, left) == 0) throw std::runtime_error("timed out waiting for the daemon");
        char tmp[65536];
        const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return std::nullopt;
        buf_.append(tmp, static_cast<std::size_t>(n));
    }
}

std::optional<json> client::next(std::chrono::milliseconds timeout) {
    if (!stash_.empty()) {
        json j = std::move(stash_.front());
        stash_.pop_front();
        return j;
    }
    return read_line(timeout);
}

std::vector<json> client::until_final(const json& id, std::chrono::milliseconds timeout) {
    std::vector<json> events;
    const auto deadline = clock_type::now() + timeout;
    // Stashed events of this id first, in order.
    for (auto it = stash_.begin(); it != stash_.end();) {
        if ((*it)["id"] == id) {
            events.push_back(std::move(*it));
            it = stash_.erase(it);
            if (is_final(events.back())) return events;
        } else {
            ++it;
        }
    }
    for (;;) {
        auto ev = read_line(std::chrono::milliseconds(std::max(1, remaining_ms(deadline))));
        if (!ev) throw std::runtime_error("the daemon closed the connection before the final event of " + id.dump());
        if ((*ev)["id"] == id) {
            events.push_back(std::move(*ev));
            if (is_final(events.back())) return events;
        } else {
            stash_.push_back(std::move(*ev));
        }
    }
}

json client::call(const json& request) {
    send(request);
    auto events = until_final(request["id"]);
    return events.back();
}

bool client::wait_closed(std::chrono::milliseconds timeout) {
    const auto deadline = clock_type::now() + timeout;
    try {
        for (;;) {
            if (!read_line(std::chrono::milliseconds(std::max(1, remaining_ms(deadline))))) return true;
        }
    } catch (const std::runtime_error&) {
        return false;
    }
}

std::string client::read_until(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
        const auto at = buf_.find(needle);
        if (at != std::string::npos) {
            std::string out = buf_.substr(0, at + needle.size());
            buf_.erase(0, at + needle.size());
            return out;
        }
        pollfd pfd{fd_, POLLIN, 0};
        const int left = remaining_ms(deadline);
        if (left == 0 || ::poll(&pfd, 1, left) == 0) throw std::runtime_error("timed out waiting for '" + needle + "'");
        char tmp[65536];
        const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw std::runtime_error("the connection closed before '" + needle + "'; got: " + buf_);
        buf_.append(tmp, static_cast<std::size_t>(n));
    }
}

std::string client::read_to_eof(std::chrono::milliseconds timeout) {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
        pollfd pfd{fd_, POLLIN, 0};
        const int left = remaining_ms(deadline);
        if (left == 0 || ::poll(&pfd, 1, left) == 0) throw std::runtime_error("timed out waiting for the close");
        char tmp[65536];
        const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        buf_.append(tmp, static_cast<std::size_t>(n));
    }
    return std::exchange(buf_, {});
}

std::vector<http_response> parse_http_responses(const std::string& raw) {
    std::vector<http_response> out;
    std::size_t at = 0;
    while (at < raw.size()) {
        const auto head_end = raw.find("\r\n\r\n", at);
        if (head_end == std::string::npos) throw std::runtime_error("incomplete HTTP headers: " + raw.substr(at));
        std::istringstream head(raw.substr(at, head_end - at));
        http_response r;
        std::string line, version;
        std::getline(head, line);
        std::istringstream status(line);
        status >> version >> r.status;
        while (std::getline(head, line)) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            const auto colon = line.find(':');
            if (colon == std::string::npos) continue;
            std::string name = line.substr(0, colon);
            for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
        }
        at = head_end + 4;
        if (r.headers["transfer-encoding"] == "chunked") {
            for (;;) {
                const auto eol = raw.find("\r\n", at);
                if (eol == std::string::npos) throw std::runtime_error("incomplete chunk");
                const std::size_t size = std::stoul(raw.substr(at, eol - at), nullptr, 16);
                at = eol + 2;
                if (size == 0) {
                    at += 2;
                    break;
                }
                r.body += raw.substr(at, size);
                at += size + 2;
            }
        } else if (r.headers.count("content-length")) {
            const std::size_t size = std::stoul(r.headers["content-length"]);
            r.body = raw.substr(at, size);
            at += size;
        } else {
            r.body = raw.substr(at);
            at = raw.size();
        }
        out.push_back(std::move(r));
    }
    return out;
}

std::string http_request_bytes(const std::string& method, const std::string& target, const std::string& body,
                               bool keep_alive, const std::vector<std::string>& headers) {
    std::string req = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n";
    if (!keep_alive) req += "Connection: close\r\n";
    if (!body.empty() || method == "POST") {
        req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    for (const auto& h : headers) req += h + "\r\n";
    return req + "\r\n" + body;
}

http_response http_call(const std::string& path, const std::string& method, const std::string& target,
                        const std::string& body, const std::vector<std::string>& headers,
                        std::chrono::milliseconds timeout) {
    client c(path);
    c.send_raw(http_request_bytes(method, target, body, false, headers));
    const auto responses = parse_http_responses(c.read_to_eof(timeout));
    if (responses.size() != 1)
        throw std::runtime_error("expected one HTTP response, got " + std::to_string(responses.size()));
    return responses[0];
}

std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> out;
    std::istringstream in(body);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    }
    return out;
}

bool is_final(const json& event) {
    const auto& e = event["event"];
    return e != "piece";
}

std::string concat_pieces(const std::vector<json>& events) {
    std::string text;
    for (const auto& e : events)
        if (e["event"] == "piece") text += e["text"].get<std::string>();
    return text;
}

json complete_request(const json& id, const std::string& prompt, int max_tokens, std::uint64_t seed) {
    return {{"id", id}, {"op", "complete"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"seed", seed}};
}

} // namespace colibri::test
