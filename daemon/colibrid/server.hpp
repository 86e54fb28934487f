#pragma once
/// colibrid's front half: accepts connections (peer-credential check, connection limit),
/// dispatches requests, owns the scheduler and the worker supervisor, answers health and
/// status, and shuts down gracefully on SIGTERM/SIGINT. Never includes engine headers.

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "colibri/protocol/messages.hpp"
#include "config.hpp"
#include "connection.hpp"
#include "http_front.hpp"
#include "listen_socket.hpp"
#include "scheduler.hpp"
#include "sd_notify.hpp"
#include "service_reporter.hpp"
#include "supervisor.hpp"

namespace colibri::daemon {

/// The daemon's version string, as reported by hello and status.
extern const char* const daemon_version;

class server {
public:
    /// `http_fd`: a listening socket systemd passed for HTTP (else --http binds one).
    server(boost::asio::io_context& io, const daemon_config& cfg, listen_socket sock, worker_launch launch,
           peer_policy policy, sd_notifier& notifier, std::optional<int> http_fd = std::nullopt);
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    void start();

    // Called by connections.
    void handle_line(const std::shared_ptr<connection>& conn, std::string_view line);
    void on_disconnect(const std::shared_ptr<connection>& conn);
    void cancel_jobs(const std::shared_ptr<connection>& conn);

    // Called by HTTP sessions.
    /// Queues a completion; on rejection returns the error and keeps nothing.
    std::optional<protocol::request_error> submit_job(const std::shared_ptr<job>& j);
    /// `notify` false: its client is gone, end it silently.
    void cancel_job(const std::shared_ptr<job>& j, bool notify) { scheduler_.cancel(j, notify); }
    /// Ends a job that has given its client enough (finish_reason length).
    void end_job(const std::shared_ptr<job>& j) { scheduler_.end_early(j); }
    nlohmann::json health_event(const nlohmann::json& id) const;
    /// The model's name for clients: its file name without the extension (remote: the
    /// upstream model's name, or "upstream").
    std::string model_name() const;
    const nlohmann::json& model_info() const { return supervisor_.model_info(); }
    /// Unix time the daemon started.
    std::int64_t started_at() const { return started_unix_; }

private:
    supervisor::handlers make_supervisor_handlers();
    void do_accept();
    void accept_one(boost::asio::local::stream_protocol::socket sock);
    void wait_signals();
    void begin_shutdown(int signo);
    void finish_shutdown();
    void on_state(worker_state s);
    /// The STATUS= line for systemd.
    std::string service_status() const;
    /// Fault injection (tests only): SIGUSR1 wedges the event loop for good.
    void wait_wedge_signal();

    void handle_complete(const std::shared_ptr<connection>& conn, const nlohmann::json& id,
                         protocol::complete_request req);
    void handle_cancel(const std::shared_ptr<connection>& conn, const nlohmann::json& id, const nlohmann::json& target);
    nlohmann::json status_event(const nlohmann::json& id) const;

    boost::asio::io_context& io_;
    const daemon_config& cfg_;
    listen_socket listen_;
    boost::asio::local::stream_protocol::acceptor acceptor_;
    boost::asio::steady_timer accept_retry_;
    boost::asio::signal_set signals_;
    boost::asio::steady_timer grace_timer_;
    boost::asio::signal_set wedge_signal_;
    peer_policy policy_;
    service_reporter reporter_;
    protocol::request_limits limits_;
    scheduler scheduler_;
    supervisor supervisor_;
    std::set<std::shared_ptr<connection>> connections_;
    std::unique_ptr<http_front> http_;
    std::chrono::steady_clock::time_point started_;
    std::int64_t started_unix_ = 0;
    bool shutting_down_ = false;
    bool finished_ = false;
    worker_state last_state_ = worker_state::stopped;
};

} // namespace colibri::daemon
