#pragma once
/// One accepted completion request, shared by its connection and the scheduler.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "colibri/protocol/messages.hpp"
#include "job_sink.hpp"

namespace colibri::daemon {

struct job {
    using clock = std::chrono::steady_clock;
    enum class state { queued, running, finished };

    explicit job(boost::asio::io_context& io) : deadline(io) {}

    std::uint64_t seq = 0; ///< daemon-wide sequence number; the worker's job id
    nlohmann::json id;     ///< the client's id, echoed in every event
    std::string key;       ///< id.dump(): unique among the connection's jobs
    protocol::complete_request req;
    std::uint64_t seed = 0;
    std::weak_ptr<job_sink> sink; ///< where its events go
    const void* owner = nullptr;  ///< the client (connection or HTTP peer), as the fairness key of the queue
    state st = state::queued;
    clock::time_point accepted;
    clock::time_point started;
    clock::time_point first_piece;
    boost::asio::steady_timer deadline;
    std::string text; ///< accumulated completion when !req.stream
    int pieces = 0;
};

} // namespace colibri::daemon
