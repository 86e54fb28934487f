#pragma once
/// One HTTP connection: reads requests (with size limits and a timeout), routes them, and
/// runs at most one completion at a time, answering with one JSON body or Server-Sent
/// Events. The next request is read while a completion runs, so a client that closes the
/// connection cancels its completion at once, as on the socket.

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>

#include "http_api.hpp"
#include "job.hpp"
#include "job_sink.hpp"

namespace colibri::daemon {

class http_front;

class http_session final : public job_sink, public std::enable_shared_from_this<http_session> {
public:
    using socket_type = boost::asio::generic::stream_protocol::socket;
    using request_type = boost::beast::http::request<boost::beast::http::string_body>;

    http_session(socket_type socket, http_front& front);
    http_session(const http_session&) = delete;
    http_session& operator=(const http_session&) = delete;

    void start();
    /// Closes now; a running completion is cancelled without a reply.
    void stop();

    void send(const nlohmann::json& event) override;
    void forget(const std::string& key) override;

private:
    using clock = std::chrono::steady_clock;

    void read_next();
    void on_read(boost::system::error_code ec);
    void serve(request_type req);
    void serve_completion(http_api api, const request_type& req);
    void on_piece(std::string_view text);
    void on_done(const nlohmann::json& event);
    void on_error(const nlohmann::json& event);
    /// A whole response with a JSON body.
    void respond(unsigned status, const nlohmann::json& body);
    void respond_error(unsigned status, std::string_view type, std::string_view message);
    /// Streaming: the status line and headers, then each event as one chunk.
    void begin_stream();
    void stream_chunk(const std::string& data);
    void end_stream();
    /// The response is written: serve a held request, read the next, or close.
    void response_done();
    void write(std::string bytes);
    void do_write();
    void arm_timeout();

    socket_type socket_;
    http_front& front_;
    boost::beast::flat_buffer buffer_;
    std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
    bool reading_ = false;
    std::optional<request_type> held_; ///< a pipelined request, served after the current one
    boost::asio::steady_timer timer_;

    // The request being answered.
    bool responding_ = false;
    bool keep_alive_ = true;
    unsigned version_ = 11;
    std::shared_ptr<job> job_;
    http_completion completion_;
    http_reply reply_;
    http_outcome outcome_;
    bool headers_sent_ = false;
    bool chunked_ = false;
    clock::time_point first_piece_;

    std::deque<std::string> out_;
    std::size_t out_bytes_ = 0;
    std::string writing_;
    bool write_active_ = false;
    bool pending_done_ = false; ///< the response is complete once the queue is written
    bool close_after_write_ = false;
    bool stopped_ = false;
};

} // namespace colibri::daemon
