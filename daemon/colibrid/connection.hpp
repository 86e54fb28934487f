#pragma once
/// One client connection: reads NDJSON request lines, hands them to the server, and
/// writes events back through a bounded output queue. A client that stops reading is
/// dropped once its unsent output exceeds the limit, so it cannot stall anyone else.

#include <array>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "colibri/protocol/line_framer.hpp"
#include "job.hpp"
#include "job_sink.hpp"

namespace colibri::daemon {

class server;

class connection final : public job_sink, public std::enable_shared_from_this<connection> {
public:
    using socket_type = boost::asio::local::stream_protocol::socket;

    connection(socket_type socket, server& srv, std::size_t max_line_bytes, std::size_t max_write_bytes);
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    void start();
    /// Queues one event line.
    void send(const nlohmann::json& event) override;
    /// Sends a last event, then closes (too_large, forbidden, connection limit).
    void send_and_close(const nlohmann::json& event);
    /// Closes now; unfinished jobs are cancelled silently by the server.
    void stop();

    /// The connection's unfinished completions, by id.dump().
    std::unordered_map<std::string, std::shared_ptr<job>>& jobs() { return jobs_; }
    void forget(const std::string& key) override;
    bool stopped() const { return stopped_; }

private:
    void do_read();
    void do_write();
    void close_when_flushed();
    bool peer_gone() const;

    socket_type socket_;
    server& server_;
    protocol::line_framer framer_;
    std::array<char, 16384> read_buf_{};
    std::deque<std::string> out_;
    std::size_t out_bytes_ = 0;
    std::size_t max_write_bytes_;
    std::string writing_;
    bool write_active_ = false;
    bool closing_ = false;     ///< no more reads; close once the output is flushed
    bool read_closed_ = false; ///< the client half-closed: finish its jobs, then close
    bool stopped_ = false;
    boost::asio::steady_timer close_timer_;
    std::unordered_map<std::string, std::shared_ptr<job>> jobs_;
};

} // namespace colibri::daemon
