#include "scheduler.hpp"

#include <algorithm>

#include "log.hpp"

namespace colibri::daemon {

namespace p = protocol;
namespace w = protocol::worker;
using clock = std::chrono::steady_clock;

namespace {

double ms_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("scheduler");
    return log;
}

} // namespace

scheduler::scheduler(const daemon_config& cfg) : cfg_(cfg), seed_rng_(std::random_device{}()) {}

supervisor::handlers scheduler::make_handlers() {
    supervisor::handlers h;
    h.on_ready = [this] { pump(); };
    h.on_piece = [this](std::uint64_t seq, std::string_view text) { on_piece(seq, text); };
    h.on_done = [this](const w::done_msg& m) { on_done(m); };
    h.on_error = [this](const w::error_msg& m) { on_error(m); };
    h.on_job_lost = [this](std::uint64_t seq, p::error_code code, const std::string& reason) {
        on_job_lost(seq, code, reason);
    };
    h.on_unavailable = [this](const std::string& reason) { on_unavailable(reason); };
    return h;
}

std::optional<p::request_error> scheduler::submit(const std::shared_ptr<job>& j) {
    if (!accepting_) {
        ++stats_.rejected;
        return p::request_error{j->id, p::error_code::unavailable, "the daemon is shutting down"};
    }
    if (runner_->unavailable()) {
        ++stats_.rejected;
        return p::request_error{j->id, p::error_code::unavailable,
                                "the engine worker keeps failing (" + runner_->last_crash_reason() +
                                    "); try again later"};
    }
    if (queued_ >= cfg_.max_queue) {
        ++stats_.rejected;
        return p::request_error{j->id, p::error_code::busy,
                                "the queue is full (" + std::to_string(cfg_.max_queue) + " requests)"};
    }
    if (!j->req.session.empty()) {
        // A newer keystroke in the same editor buffer: the older completion is stale.
        if (auto it = sessions_.find(j->req.session); it != sessions_.end()) {
            if (auto older = it->second.lock(); older && older->st != job::state::finished) {
                ++stats_.superseded;
                logger()->debug("job {} superseded in session '{}'", older->seq, j->req.session);
                cancel(older, true); // forgets the session's entry
            }
        }
        sessions_[j->req.session] = j;
    }
    j->seq = next_seq_++;
    j->seed = j->req.seed ? *j->req.seed : seed_rng_();
    j->accepted = clock::now();
    j->st = job::state::queued;
    const std::int64_t timeout = std::min(j->req.timeout_ms.value_or(cfg_.default_timeout_ms), cfg_.max_timeout_ms);
    j->deadline.expires_after(std::chrono::milliseconds(timeout));
    std::weak_ptr<job> weak = j;
    j->deadline.async_wait([this, weak](boost::system::error_code ec) {
        if (ec) return;
        if (auto jj = weak.lock()) on_deadline(jj);
    });
    auto& q = queues_[j->owner];
    if (q.empty()) order_.push_back(j->owner);
    q.push_back(j);
    ++queued_;
    logger()->debug("job {} queued (depth {})", j->seq, queued_);
    pump();
    return std::nullopt;
}

void scheduler::pump() {
    while (runner_ && runner_->idle() && !running_ && !order_.empty()) {
        const void* owner = order_.front();
        order_.pop_front();
        auto it = queues_.find(owner);
        if (it == queues_.end() || it->second.empty()) continue;
        auto j = it->second.front();
        it->second.pop_front();
        --queued_;
        if (it->second.empty()) queues_.erase(it);
        else order_.push_back(owner); // round-robin: this connection goes to the back
        j->st = job::state::running;
        j->started = clock::now();
        running_ = j;
        logger()->debug("job {} starts after {:.1f} ms in the queue", j->seq, ms_between(j->accepted, j->started));
        runner_->run(w::run_msg{j->seq, j->req, j->seed});
    }
}

void scheduler::remove_from_queue(const std::shared_ptr<job>& j) {
    auto it = queues_.find(j->owner);
    if (it == queues_.end()) return;
    auto& q = it->second;
    auto pos = std::find(q.begin(), q.end(), j);
    if (pos == q.end()) return;
    q.erase(pos);
    --queued_;
    if (q.empty()) {
        queues_.erase(it);
        order_.erase(std::remove(order_.begin(), order_.end(), j->owner), order_.end());
    }
}

void scheduler::finish(const std::shared_ptr<job>& j, const nlohmann::json& final_event) {
    if (j->st == job::state::finished) return;
    if (j->st == job::state::queued) remove_from_queue(j);
    if (running_ == j) running_.reset();
    j->st = job::state::finished;
    j->deadline.cancel();
    if (!j->req.session.empty()) {
        auto it = sessions_.find(j->req.session);
        if (it != sessions_.end() && it->second.lock() == j) sessions_.erase(it);
    }
    if (auto c = j->sink.lock()) {
        if (!final_event.is_null()) c->send(final_event);
        c->forget(j->key);
    }
    if (in_flight() == 0 && on_drained) on_drained();
}

nlohmann::json scheduler::done_event_for(const job& j, p::finish_reason reason, const w::done_msg* result) const {
    p::done_event d;
    d.reason = reason;
    d.seed = j.seed;
    const auto now = clock::now();
    const bool started = j.st == job::state::running;
    d.timings.queued_ms = ms_between(j.accepted, started ? j.started : now);
    if (j.pieces > 0) d.timings.ttft_ms = ms_between(j.accepted, j.first_piece);
    if (result) {
        d.usage = result->tokens;
        d.timings.prefill_ms = result->prefill_ms;
        d.timings.decode_ms = result->decode_ms;
    } else {
        d.usage.completion_tokens = j.pieces;
    }
    if (!j.req.stream) d.text = j.text;
    return p::make_done_event(j.id, d);
}

void scheduler::cancel(const std::shared_ptr<job>& j, bool notify) {
    if (j->st == job::state::finished) return;
    if (j->st == job::state::running) runner_->cancel(j->seq);
    ++stats_.cancelled;
    logger()->debug("job {} cancelled{}", j->seq, notify ? "" : " (client gone)");
    finish(j, notify ? done_event_for(*j, p::finish_reason::cancelled, nullptr) : nlohmann::json());
    pump();
}

void scheduler::end_early(const std::shared_ptr<job>& j) {
    if (j->st == job::state::finished) return;
    if (j->st == job::state::running) runner_->cancel(j->seq);
    ++stats_.served;
    stats_.tokens_generated += static_cast<std::uint64_t>(std::max(0, j->pieces));
    logger()->debug("job {} ended early by its client's limit", j->seq);
    finish(j, done_event_for(*j, p::finish_reason::length, nullptr));
    pump();
}

void scheduler::cancel_all() {
    std::vector<std::shared_ptr<job>> all;
    if (running_) all.push_back(running_);
    for (auto& [owner, q] : queues_) all.insert(all.end(), q.begin(), q.end());
    for (auto& j : all) cancel(j, true);
}

void scheduler::on_deadline(const std::shared_ptr<job>& j) {
    if (j->st == job::state::finished) return;
    if (j->st == job::state::running) runner_->cancel(j->seq);
    ++stats_.timed_out;
    logger()->debug("job {} reached its deadline", j->seq);
    finish(j, done_event_for(*j, p::finish_reason::timeout, nullptr));
    pump();
}

void scheduler::on_piece(std::uint64_t seq, std::string_view text) {
    if (!running_ || running_->seq != seq) return; // its client already has a final line
    const auto keep = running_;                    // send() may drop a slow client, which finishes the job
    job& j = *keep;
    if (j.pieces++ == 0) j.first_piece = clock::now();
    if (j.req.stream) {
        if (auto c = j.sink.lock()) c->send(p::make_piece_event(j.id, text));
    } else {
        j.text.append(text);
    }
}

void scheduler::on_done(const w::done_msg& msg) {
    if (running_ && running_->seq == msg.job) {
        auto j = running_;
        ++stats_.served;
        stats_.tokens_generated += static_cast<std::uint64_t>(std::max(0, msg.tokens.completion_tokens));
        stats_.tokens_drafted += static_cast<std::uint64_t>(std::max(0, msg.tokens.drafted_tokens));
        stats_.tokens_accepted += static_cast<std::uint64_t>(std::max(0, msg.tokens.accepted_tokens));
        stats_.decode_ms += msg.decode_ms;
        finish(j, done_event_for(*j, msg.reason, &msg));
    }
    // The supervisor calls on_ready next, which pumps.
}

void scheduler::on_error(const w::error_msg& msg) {
    if (running_ && running_->seq == msg.job) {
        auto j = running_;
        ++stats_.failed;
        finish(j, p::make_error_event(j->id, msg.code, msg.message, p::finish_reason::error));
    }
}

void scheduler::on_job_lost(std::uint64_t seq, p::error_code code, const std::string& reason) {
    if (!running_ || running_->seq != seq) return;
    auto j = running_;
    ++stats_.failed;
    const bool timeout = code == p::error_code::timeout;
    const std::string message =
        (timeout ? "the engine worker stopped making progress: " : "the engine worker crashed: ") + reason;
    finish(j, p::make_error_event(j->id, code, message, timeout ? p::finish_reason::timeout : p::finish_reason::error));
}

void scheduler::on_unavailable(const std::string& reason) {
    std::vector<std::shared_ptr<job>> queued;
    for (auto& [owner, q] : queues_) queued.insert(queued.end(), q.begin(), q.end());
    for (auto& j : queued) {
        ++stats_.failed;
        finish(j, p::make_error_event(j->id, p::error_code::unavailable,
                                      "the engine worker keeps failing (" + reason + "); try again later",
                                      p::finish_reason::error));
    }
}

} // namespace colibri::daemon
