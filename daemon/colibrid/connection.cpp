#include "connection.hpp"

#include <poll.h>

#include <boost/asio/write.hpp>

#include "colibri/protocol/codec.hpp"
#include "log.hpp"
#include "server.hpp"

namespace colibri::daemon {

namespace asio = boost::asio;
namespace p = protocol;

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("connection");
    return log;
}

} // namespace

connection::connection(socket_type socket, server& srv, std::size_t max_line_bytes, std::size_t max_write_bytes)
    : socket_(std::move(socket)), server_(srv), framer_(max_line_bytes), max_write_bytes_(max_write_bytes),
      close_timer_(socket_.get_executor()) {}

void connection::start() { do_read(); }

void connection::do_read() {
    if (closing_ || stopped_) return;
    socket_.async_read_some(
        asio::buffer(read_buf_), [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
            if (self->stopped_ || self->closing_) return;
            if (ec) {
                // EOF: either the client closed (cancel its work) or it only shut down its
                // sending side, as `nc -N` does after the last request (finish its work).
                if (ec == asio::error::eof && !self->peer_gone() && !self->jobs_.empty()) {
                    self->read_closed_ = true;
                    return;
                }
                self->server_.on_disconnect(self);
                return;
            }
            self->framer_.feed(std::string_view(self->read_buf_.data(), n));
            std::string line;
            for (;;) {
                const auto r = self->framer_.next(line);
                if (r == p::line_framer::result::need_more) break;
                if (r == p::line_framer::result::too_long) {
                    self->send_and_close(p::make_error_event(nullptr, p::error_code::too_large,
                                                             "request line longer than " +
                                                                 std::to_string(self->framer_.max_line_bytes()) +
                                                                 " bytes; closing the connection"));
                    self->server_.cancel_jobs(self);
                    return;
                }
                self->server_.handle_line(self, line);
                if (self->stopped_ || self->closing_) return;
            }
            self->do_read();
        });
}

bool connection::peer_gone() const {
    pollfd pfd{};
    pfd.fd = const_cast<socket_type&>(socket_).native_handle();
    pfd.events = POLLOUT;
    return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR));
}

void connection::send(const nlohmann::json& event) {
    if (stopped_) return;
    std::string line = p::frame(p::dump_line(event));
    out_bytes_ += line.size();
    out_.push_back(std::move(line));
    if (out_bytes_ > max_write_bytes_) {
        logger()->warn("dropping a client that does not read its output ({} bytes pending)", out_bytes_);
        server_.on_disconnect(shared_from_this());
        return;
    }
    if (!write_active_) do_write();
}

void connection::send_and_close(const nlohmann::json& event) {
    send(event);
    close_when_flushed();
}

void connection::close_when_flushed() {
    if (stopped_) return;
    closing_ = true;
    if (!write_active_ && out_.empty()) {
        server_.on_disconnect(shared_from_this());
        return;
    }
    // A client that never reads must not keep the connection forever.
    close_timer_.expires_after(std::chrono::seconds(2));
    close_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->server_.on_disconnect(self);
    });
}

void connection::do_write() {
    if (stopped_) return;
    if (out_.empty()) {
        write_active_ = false;
        if (closing_ || (read_closed_ && jobs_.empty())) server_.on_disconnect(shared_from_this());
        return;
    }
    write_active_ = true;
    writing_.clear();
    for (auto& s : out_) writing_ += s;
    out_.clear();
    asio::async_write(socket_, asio::buffer(writing_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                          if (self->stopped_) return;
                          self->out_bytes_ -= std::min(self->out_bytes_, n);
                          if (ec) {
                              self->server_.on_disconnect(self);
                              return;
                          }
                          self->do_write();
                      });
}

void connection::forget(const std::string& key) {
    jobs_.erase(key);
    if (read_closed_ && jobs_.empty() && !write_active_ && out_.empty() && !stopped_)
        server_.on_disconnect(shared_from_this());
}

void connection::stop() {
    if (stopped_) return;
    stopped_ = true;
    close_timer_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(socket_type::shutdown_both, ignored);
    socket_.close(ignored);
}

} // namespace colibri::daemon
