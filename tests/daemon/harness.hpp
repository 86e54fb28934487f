#pragma once
/// End-to-end test harness: a real colibrid process on a temporary socket (with the fake
/// test worker unless told otherwise) and a minimal NDJSON client. Every wait is bounded.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace colibri::test {

using nlohmann::json;

/// A private temporary directory, removed with everything in it.
class temp_dir {
public:
    temp_dir();
    ~temp_dir();
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

/// colibrid started with test-friendly watchdog settings. Options override by name.
class daemon_process {
public:
    using options = std::map<std::string, std::string>; ///< "--flag" -> value ("" for a switch)

    /// How the process is started, beyond colibrid's options.
    struct launch_options {
        /// "NAME=VALUE" set in colibrid's environment; "$PID" in VALUE becomes its pid.
        std::vector<std::string> env;
        /// A program (and its arguments) that runs colibrid's command line, such as
        /// systemd-socket-activate.
        std::vector<std::string> wrapper;
    };

    /// `listen_fd` >= 0: hand colibrid this listening socket the systemd way (LISTEN_FDS).
    explicit daemon_process(const options& overrides = {}, bool wait_ready = true,
                            const std::string& model_content = "fake model\n", int listen_fd = -1,
                            const launch_options& launch = {});
    ~daemon_process();
    daemon_process(const daemon_process&) = delete;
    daemon_process& operator=(const daemon_process&) = delete;

    const std::string& socket_path() const { return socket_; }
    const std::string& dir() const { return dir_.path(); }
    const std::string& model_path() const { return model_; }
    pid_t pid() const { return pid_; }

    /// Waits for READY=1 on the notify socket.
    bool wait_ready(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// The next datagram on the notify socket (recorded in notifications()); nullopt on timeout.
    std::optional<std::string> next_notification(std::chrono::milliseconds timeout);
    /// Every datagram received on the notify socket so far, in order.
    const std::vector<std::string>& notifications() const { return notifications_; }
    /// The path of the notify socket (NOTIFY_SOCKET).
    const std::string& notify_path() const { return notify_path_; }
    /// Sends `sig` and waits for the exit; returns the wait status (nullopt: still running).
    std::optional<int> stop(int sig = 15, std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// Waits for the process to exit on its own.
    std::optional<int> wait_exit(std::chrono::milliseconds timeout);
    /// The daemon's stderr so far.
    std::string log() const;

private:
    temp_dir dir_;
    std::string socket_;
    std::string model_;
    std::string log_path_;
    std::string notify_path_;
    std::vector<std::string> notifications_;
    int notify_fd_ = -1;
    pid_t pid_ = -1;
};

/// Runs `exe args...` to completion with a bound, `input` on its stdin; returns the
/// exit status, stdout and stderr.
struct run_result {
    int status = -1;
    std::string out;
    std::string err;
};
run_result run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                       const std::string& input = "");

/// A blocking NDJSON client with timeouts.
class client {
public:
    explicit client(const std::string& socket_path);
    ~client();
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    void send_raw(const std::string& bytes);
    void send(const json& request) { send_raw(request.dump() + "\n"); }
    /// Next event (stashed ones first); nullopt on EOF; throws on timeout.
    std::optional<json> next(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// Events of `id` up to and including its final line (done or error, or the one
    /// reply of other ops); events for other ids are stashed for later.
    std::vector<json> until_final(const json& id, std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// One-reply request: sends and returns the reply.
    json call(const json& request);
    /// true when the daemon closes the connection within the timeout.
    bool wait_closed(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// Raw bytes up to and including the first `needle` (for HTTP); throws on timeout or EOF.
    std::string read_until(const std::string& needle, std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// Raw bytes until the daemon closes the connection; throws on timeout.
    std::string read_to_eof(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    void close();
    int fd() const { return fd_; }

private:
    std::optional<json> read_line(std::chrono::milliseconds timeout);
    int fd_ = -1;
    std::string buf_;
    std::deque<json> stash_;
};

/// One HTTP response: header names lowercased, a chunked body joined.
struct http_response {
    int status = 0;
    std::map<std::string, std::string> headers;
    std::string body;
    json json_body() const { return json::parse(body); }
};

/// Splits raw bytes into the HTTP responses they hold, in order.
std::vector<http_response> parse_http_responses(const std::string& raw);

/// One HTTP request (Connection: close) on the Unix socket at `path`; reads the response to
/// the connection's end. `headers`: extra "Name: value" lines.
http_response http_call(const std::string& path, const std::string& method, const std::string& target,
                        const std::string& body = "", const std::vector<std::string>& headers = {},
                        std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// The bytes of an HTTP/1.1 request.
std::string http_request_bytes(const std::string& method, const std::string& target, const std::string& body,
                               bool keep_alive, const std::vector<std::string>& headers = {});

/// The payloads of a Server-Sent Events body's "data:" lines, in order.
std::vector<std::string> sse_data(const std::string& body);

/// A final event ends a request: done, error, or the reply of a non-streaming op.
bool is_final(const json& event);

/// The text of the piece events in `events`, concatenated.
std::string concat_pieces(const std::vector<json>& events);

/// A complete request with the test defaults.
json complete_request(const json& id, const std::string& prompt, int max_tokens = 8, std::uint64_t seed = 1);

} // namespace colibri::test
