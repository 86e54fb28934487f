#pragma once
/// colibrid's optional HTTP listener (--http): a TCP address or a Unix socket, who may
/// use it (loopback, a Bearer key, peer credentials on a Unix socket), and its sessions.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "colibri/protocol/messages.hpp"
#include "config.hpp"
#include "listen_socket.hpp"

namespace colibri::daemon {

class server;
class http_session;

class http_front {
public:
    /// Takes `activated` (a listening socket systemd passed) or binds --http now, so that a
    /// bad address fails at startup. Throws startup_error.
    http_front(boost::asio::io_context& io, const daemon_config& cfg, server& srv, const peer_policy& policy,
               std::optional<int> activated = std::nullopt);
    ~http_front();
    http_front(const http_front&) = delete;
    http_front& operator=(const http_front&) = delete;

    void start();
    /// Stops accepting; with `close_sessions` every session closes now.
    void stop(bool close_sessions);

    // For sessions.
    server& srv() { return server_; }
    boost::asio::io_context& io() { return io_; }
    const daemon_config& cfg() const { return cfg_; }
    const protocol::request_limits& limits() const { return limits_; }
    /// Ids for HTTP completions, unique among them (they appear in the daemon's logs).
    std::uint64_t next_job_id() { return next_job_id_++; }
    /// The request carries the configured Bearer key (always true without one).
    bool authorized(const boost::beast::http::request<boost::beast::http::string_body>& req) const;
    void on_closed(const std::shared_ptr<http_session>& s) { sessions_.erase(s); }
    std::size_t sessions() const { return sessions_.size(); }
    /// What it listens on, for logs and status ("127.0.0.1:8012", "unix:/run/...").
    const std::string& where() const { return where_; }

private:
    void do_accept();
    bool peer_ok(int fd) const;

    boost::asio::io_context& io_;
    const daemon_config& cfg_;
    server& server_;
    peer_policy policy_;
    http_address address_;
    boost::asio::basic_socket_acceptor<boost::asio::generic::stream_protocol> acceptor_;
    boost::asio::steady_timer accept_retry_;
    protocol::request_limits limits_;
    std::optional<std::string> api_key_;
    std::string where_;
    std::uint64_t next_job_id_ = 1;
    bool activated_ = false;
    bool stopped_ = false;
    std::set<std::shared_ptr<http_session>> sessions_;
};

} // namespace colibri::daemon
