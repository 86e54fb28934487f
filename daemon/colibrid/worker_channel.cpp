// The worker channel: framed, decoded worker messages over the supervisor's socket.
#include "worker_channel.hpp"

#include <boost/asio/write.hpp>

namespace colibri::daemon {

namespace asio = boost::asio;
namespace w = protocol::worker;

worker_channel::worker_channel(asio::io_context& io, handlers h) : io_(io), h_(std::move(h)) {}

void worker_channel::open(int fd) {
    close();
    // Worker messages carry whole completions and model descriptions: a larger limit than clients'.
    framer_ = protocol::line_framer(protocol::default_max_line_bytes * 16);
    sock_ = std::make_unique<asio::local::stream_protocol::socket>(io_);
    sock_->assign(asio::local::stream_protocol(), fd);
}

void worker_channel::close() {
    ++generation_;
    if (sock_) {
        boost::system::error_code ignored;
        sock_->close(ignored); // aborts the pending write before its buffer is cleared
        sock_.reset();
    }
    out_.clear();
    writing_.clear();
    write_active_ = false;
}

void worker_channel::do_read() {
    const auto gen = generation_;
    sock_->async_read_some(asio::buffer(read_buf_), [this, gen](boost::system::error_code ec, std::size_t n) {
        // operation_aborted first: after close() (or destruction) `this` may be gone.
        if (ec == asio::error::operation_aborted || gen != generation_ || !sock_) return;
        if (ec) {
            if (h_.on_broken) h_.on_broken();
            return;
        }
        framer_.feed(std::string_view(read_buf_.data(), n));
        std::string line;
        for (;;) {
            const auto r = framer_.next(line);
            if (r == protocol::line_framer::result::need_more) break;
            if (r == protocol::line_framer::result::too_long) {
                if (h_.on_violation) h_.on_violation("sent an oversized message");
                return; // the stream cannot be resynchronised: stop reading
            }
            w::from_worker msg;
            try {
                msg = w::decode_from_worker(line);
            } catch (const protocol::protocol_error& e) {
                if (h_.on_violation) h_.on_violation(std::string("sent a malformed message: ") + e.what());
                continue;
            }
            if (h_.on_message) h_.on_message(msg);
            if (gen != generation_) return;
        }
        do_read();
    });
}

void worker_channel::send(const w::to_worker& msg) {
    if (!sock_) return;
    out_.push_back(protocol::frame(w::encode(msg)));
    if (!write_active_) do_write();
}

void worker_channel::do_write() {
    if (out_.empty() || !sock_) {
        write_active_ = false;
        return;
    }
    write_active_ = true;
    writing_.clear();
    for (auto& s : out_) writing_ += s;
    out_.clear();
    const auto gen = generation_;
    asio::async_write(*sock_, asio::buffer(writing_), [this, gen](boost::system::error_code ec, std::size_t) {
        if (ec == asio::error::operation_aborted || gen != generation_) return;
        if (ec) {
            write_active_ = false;
            if (h_.on_broken) h_.on_broken();
            return;
        }
        do_write();
    });
}

} // namespace colibri::daemon
