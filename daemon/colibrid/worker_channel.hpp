#pragma once
/// Owns the supervisor's end of the worker's socketpair: reads and decodes framed
/// worker messages, and queues encoded ones for writing. One channel outlives many
/// workers; each open() starts a fresh connection and silences the previous one's handlers.

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "colibri/protocol/line_framer.hpp"
#include "colibri/protocol/worker_messages.hpp"

namespace colibri::daemon {

class worker_channel {
public:
    struct handlers {
        /// One decoded message from the worker.
        std::function<void(protocol::worker::from_worker& msg)> on_message;
        /// The worker broke the protocol (a malformed or oversized message); `reason` says how.
        std::function<void(const std::string& reason)> on_violation;
        /// End of file, or a read or write error: the worker is dying or broken.
        std::function<void()> on_broken;
    };

    worker_channel(boost::asio::io_context& io, handlers h);
    worker_channel(const worker_channel&) = delete;
    worker_channel& operator=(const worker_channel&) = delete;

    /// Takes ownership of a connected stream socket; nothing is read until start().
    void open(int fd);
    void start() { do_read(); }
    /// Frames and queues `msg`; dropped when the channel is closed.
    void send(const protocol::worker::to_worker& msg);
    /// Closes the socket; pending reads and writes end without calling any handler.
    void close();
    bool is_open() const { return sock_ != nullptr; }

private:
    void do_read();
    void do_write();

    boost::asio::io_context& io_;
    handlers h_;
    std::unique_ptr<boost::asio::local::stream_protocol::socket> sock_;
    std::uint64_t generation_ = 0; ///< bumped per open and close; stale async handlers compare it
    protocol::line_framer framer_;
    std::array<char, 16384> read_buf_{};
    std::deque<std::string> out_;
    std::string writing_;
    bool write_active_ = false;
};

} // namespace colibri::daemon
