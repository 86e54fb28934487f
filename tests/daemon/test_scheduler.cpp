// The scheduler on its own: a fake job runner stands in for the supervisor, the test plays
// the worker through the scheduler's handlers, and recording sinks stand in for clients.

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "config.hpp"
#include "job.hpp"
#include "job_runner.hpp"
#include "job_sink.hpp"
#include "scheduler.hpp"

namespace cd = colibri::daemon;
namespace p = colibri::protocol;
namespace w = colibri::protocol::worker;
using nlohmann::json;

namespace {

/// Runs one job at a time, as the supervisor does: busy from run() until the test answers.
class fake_runner final : public cd::job_runner {
public:
    bool idle() const override { return idle_now; }
    bool unavailable() const override { return down; }
    const std::string& last_crash_reason() const override { return reason; }
    void run(const w::run_msg& msg) override {
        REQUIRE(idle_now); // never two jobs at once
        idle_now = false;
        runs.push_back(msg);
    }
    void cancel(std::uint64_t job) override { cancels.push_back(job); }

    bool idle_now = true;
    bool down = false;
    std::string reason;
    std::vector<w::run_msg> runs;
    std::vector<std::uint64_t> cancels;
};

class recording_sink final : public cd::job_sink {
public:
    void send(const json& event) override { events.push_back(event); }
    void forget(const std::string& key) override { forgotten.push_back(key); }

    std::vector<json> of(const json& id) const {
        std::vector<json> out;
        for (const auto& e : events)
            if (e["id"] == id) out.push_back(e);
        return out;
    }
    int finals(const json& id) const {
        int n = 0;
        for (const auto& e : of(id)) n += e["event"] == "done" || e["event"] == "error";
        return n;
    }

    std::vector<json> events;
    std::vector<std::string> forgotten;
};

struct job_options {
    std::string session;
    std::optional<std::int64_t> timeout_ms;
    bool stream = true;
};

job_options in_session(const std::string& session) {
    job_options o;
    o.session = session;
    return o;
}
job_options with_timeout_ms(std::int64_t ms) {
    job_options o;
    o.timeout_ms = ms;
    return o;
}
job_options not_streamed() {
    job_options o;
    o.stream = false;
    return o;
}

/// A scheduler attached to a fake runner; the worker's side is played through `h`.
struct scheduler_test {
    explicit scheduler_test(std::size_t max_queue = 64) {
        cfg.max_queue = max_queue;
        sched = std::make_unique<cd::scheduler>(cfg);
        sched->attach(runner);
        h = sched->make_handlers();
    }

    std::shared_ptr<cd::job> make(const json& id, const std::shared_ptr<recording_sink>& to,
                                  const job_options& o = {}) {
        auto j = std::make_shared<cd::job>(io);
        j->id = id;
        j->key = id.dump();
        j->req.prompt = "p" + id.dump();
        j->req.seed = 7;
        j->req.session = o.session;
        j->req.timeout_ms = o.timeout_ms;
        j->req.stream = o.stream;
        j->sink = to;
        j->owner = to.get();
        return j;
    }
    std::shared_ptr<cd::job> submit(const json& id, const std::shared_ptr<recording_sink>& to,
                                    const job_options& o = {}) {
        auto j = make(id, to, o);
        const auto err = sched->submit(j);
        REQUIRE_MESSAGE(!err, "rejected: " << err->message);
        return j;
    }

    /// The job the worker runs now (its last run message).
    std::uint64_t running_seq() const {
        REQUIRE(!runner.runs.empty());
        return runner.runs.back().job;
    }
    /// The worker answers with done, then is ready for the next job.
    void worker_done(std::uint64_t seq, int tokens, p::finish_reason reason = p::finish_reason::stop) {
        w::done_msg d;
        d.job = seq;
        d.reason = reason;
        d.tokens.completion_tokens = tokens;
        d.decode_ms = 2.5;
        h.on_done(d);
        worker_ready();
    }
    void worker_ready() {
        runner.idle_now = true;
        h.on_ready();
    }
    /// Runs the handlers that are due (deadlines of 0 ms are).
    void poll() {
        io.restart();
        io.poll();
    }

    boost::asio::io_context io;
    cd::daemon_config cfg;
    fake_runner runner;
    std::unique_ptr<cd::scheduler> sched;
    cd::supervisor::handlers h;
};

} // namespace

TEST_CASE("scheduler: a job runs on an idle worker and ends with one done event carrying the worker's counts") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto j = t.submit("a", client);
    REQUIRE(t.runner.runs.size() == 1);
    CHECK(t.runner.runs[0].job == j->seq);
    CHECK(t.runner.runs[0].seed == 7);
    CHECK(t.runner.runs[0].req.prompt == "p\"a\"");
    CHECK(t.sched->in_flight() == 1);
    CHECK(t.sched->queue_depth() == 0);

    t.h.on_piece(j->seq, "ab");
    t.h.on_piece(j->seq, "c");
    t.worker_done(j->seq, 2);

    const auto ev = client->of("a");
    REQUIRE(ev.size() == 3);
    CHECK(ev[0]["event"] == "piece");
    CHECK(ev[0]["text"] == "ab");
    CHECK(ev[1]["text"] == "c");
    CHECK(ev[2]["event"] == "done");
    CHECK(ev[2]["finish_reason"] == "stop");
    CHECK(ev[2]["usage"]["completion_tokens"] == 2);
    CHECK(ev[2]["timings"]["decode_ms"] == 2.5);
    CHECK(ev[2]["seed"] == 7);
    CHECK_FALSE(ev[2].contains("text")); // streamed: the text came in pieces
    CHECK(client->forgotten == std::vector<std::string>{"\"a\""});
    CHECK(t.sched->in_flight() == 0);
    CHECK(t.sched->stats().served == 1);
    CHECK(t.sched->stats().tokens_generated == 2);
}

TEST_CASE("scheduler: a job that does not stream gets its text in the done event") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto j = t.submit(1, client, not_streamed());
    t.h.on_piece(j->seq, "x = ");
    t.h.on_piece(j->seq, "1;");
    t.worker_done(j->seq, 2, p::finish_reason::length);
    REQUIRE(client->events.size() == 1);
    CHECK(client->events[0]["event"] == "done");
    CHECK(client->events[0]["finish_reason"] == "length");
    CHECK(client->events[0]["text"] == "x = 1;");
}

TEST_CASE("scheduler: connections take turns - one job each in round-robin") {
    scheduler_test t;
    t.runner.idle_now = false; // the worker is still starting
    auto a = std::make_shared<recording_sink>();
    auto b = std::make_shared<recording_sink>();
    t.submit("a1", a);
    t.submit("a2", a);
    t.submit("a3", a);
    t.submit("b1", b);
    t.submit("b2", b);
    CHECK(t.sched->queue_depth() == 5);
    CHECK(t.runner.runs.empty());

    t.worker_ready();
    std::vector<std::string> order;
    for (int i = 0; i < 5; ++i) {
        REQUIRE(t.runner.runs.size() == static_cast<std::size_t>(i + 1));
        order.push_back(t.runner.runs.back().req.prompt);
        t.worker_done(t.running_seq(), 1);
    }
    CHECK(order == std::vector<std::string>{"p\"a1\"", "p\"b1\"", "p\"a2\"", "p\"b2\"", "p\"a3\""});
    CHECK(t.sched->stats().served == 5);
}

TEST_CASE("scheduler: a full queue answers busy and keeps nothing") {
    scheduler_test t(2);
    t.runner.idle_now = false;
    auto client = std::make_shared<recording_sink>();
    t.submit(1, client);
    t.submit(2, client);
    auto third = t.make(3, client);
    const auto err = t.sched->submit(third);
    REQUIRE(err);
    CHECK(err->code == p::error_code::busy);
    CHECK(err->message == "the queue is full (2 requests)");
    CHECK(err->id == 3);
    CHECK(t.sched->queue_depth() == 2);
    CHECK(t.sched->stats().rejected == 1);
    CHECK(client->events.empty()); // the caller answers a rejection
}

TEST_CASE("scheduler: an unavailable worker or a shutdown refuses new work with the reason") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    t.runner.down = true;
    t.runner.reason = "exited with status 3";
    auto err = t.sched->submit(t.make(1, client));
    REQUIRE(err);
    CHECK(err->code == p::error_code::unavailable);
    CHECK(err->message == "the engine worker keeps failing (exited with status 3); try again later");

    t.runner.down = false;
    t.sched->stop_accepting();
    err = t.sched->submit(t.make(2, client));
    REQUIRE(err);
    CHECK(err->code == p::error_code::unavailable);
    CHECK(err->message == "the daemon is shutting down");
    CHECK(t.sched->stats().rejected == 2);
    CHECK(t.runner.runs.empty());
}

TEST_CASE("scheduler: deadlines end queued and running jobs with timeout - the worker's late answer is dropped") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto running = t.submit("r", client, with_timeout_ms(0));
    auto queued = t.submit("q", client, with_timeout_ms(0));
    REQUIRE(t.runner.runs.size() == 1);
    t.h.on_piece(running->seq, "ab");
    t.poll();

    CHECK(t.runner.cancels == std::vector<std::uint64_t>{running->seq}); // only the running one was on the worker
    const auto r = client->of("r");
    REQUIRE(r.size() == 2);
    CHECK(r[1]["event"] == "done");
    CHECK(r[1]["finish_reason"] == "timeout");
    CHECK(r[1]["usage"]["completion_tokens"] == 1);
    const auto q = client->of("q");
    REQUIRE(q.size() == 1);
    CHECK(q[0]["finish_reason"] == "timeout");
    CHECK(t.sched->stats().timed_out == 2);

    // The worker stops the cancelled job and answers: nothing more reaches the client.
    t.h.on_piece(running->seq, "late");
    t.worker_done(running->seq, 2, p::finish_reason::cancelled);
    CHECK(client->events.size() == 3);
    CHECK(t.sched->stats().served == 0);
    CHECK(t.sched->in_flight() == 0);
}

TEST_CASE("scheduler: a newer request in the same session supersedes the older one") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto older = t.submit("k1", client, in_session("main.py"));
    auto newer = t.submit("k2", client, in_session("main.py"));
    const auto k1 = client->of("k1");
    REQUIRE(k1.size() == 1);
    CHECK(k1[0]["finish_reason"] == "cancelled");
    CHECK(t.runner.cancels == std::vector<std::uint64_t>{older->seq});
    CHECK(t.sched->stats().superseded == 1);
    CHECK(t.sched->stats().cancelled == 1);

    // The worker is busy until it answers for the older job; then the newer one runs.
    CHECK(t.runner.runs.size() == 1);
    t.worker_done(older->seq, 1, p::finish_reason::cancelled);
    REQUIRE(t.runner.runs.size() == 2);
    CHECK(t.runner.runs[1].job == newer->seq);
    t.worker_done(newer->seq, 3);
    CHECK(client->finals("k1") == 1);
    CHECK(client->finals("k2") == 1);
    CHECK(client->of("k2").back()["finish_reason"] == "stop");
}

TEST_CASE("scheduler: a worker crash fails the running job - the queued job runs on the restarted worker") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto first = t.submit(1, client);
    auto second = t.submit(2, client);
    t.h.on_job_lost(first->seq, p::error_code::worker_crashed, "killed by signal 11 (SIGSEGV)");
    const auto e1 = client->of(1);
    REQUIRE(e1.size() == 1);
    CHECK(e1[0]["event"] == "error");
    CHECK(e1[0]["code"] == "worker_crashed");
    CHECK(e1[0]["finish_reason"] == "error");
    CHECK(e1[0]["message"] == "the engine worker crashed: killed by signal 11 (SIGSEGV)");
    CHECK(client->of(2).empty());

    t.worker_ready(); // the restarted worker
    REQUIRE(t.runner.runs.size() == 2);
    CHECK(t.runner.runs[1].job == second->seq);
    t.h.on_job_lost(second->seq, p::error_code::timeout, "no progress for 300 ms");
    const auto e2 = client->of(2);
    REQUIRE(e2.size() == 1);
    CHECK(e2[0]["code"] == "timeout");
    CHECK(e2[0]["finish_reason"] == "timeout");
    CHECK(e2[0]["message"] == "the engine worker stopped making progress: no progress for 300 ms");
    CHECK(t.sched->stats().failed == 2);
}

TEST_CASE("scheduler: a job the worker refuses ends with the worker's error code and message") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto j = t.submit(1, client);
    t.h.on_error(w::error_msg{j->seq, p::error_code::invalid_request, "prompt too long", nullptr});
    const auto ev = client->of(1);
    REQUIRE(ev.size() == 1);
    CHECK(ev[0]["code"] == "invalid_request");
    CHECK(ev[0]["message"] == "prompt too long");
    CHECK(ev[0]["finish_reason"] == "error");
    CHECK(t.sched->stats().failed == 1);
}

TEST_CASE("scheduler: a crash loop fails the queued jobs once - not the running one") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto running = t.submit(1, client);
    t.submit(2, client);
    t.submit(3, client);
    t.runner.down = true;
    t.h.on_unavailable("cannot load model");
    for (int id : {2, 3}) {
        const auto ev = client->of(id);
        REQUIRE(ev.size() == 1);
        CHECK(ev[0]["code"] == "unavailable");
        CHECK(ev[0]["message"] == "the engine worker keeps failing (cannot load model); try again later");
    }
    CHECK(client->of(1).empty());
    CHECK(t.sched->queue_depth() == 0);
    CHECK(t.sched->in_flight() == 1);
    CHECK(t.running_seq() == running->seq);
}

TEST_CASE("scheduler: cancel - end_early and cancel_all each give one final event - a gone client gets none") {
    scheduler_test t;
    auto client = std::make_shared<recording_sink>();
    auto gone = std::make_shared<recording_sink>();
    auto a = t.submit("a", client);
    auto b = t.submit("b", client);
    auto c = t.submit("c", client);
    auto g = t.submit("g", gone);
    bool drained = false;
    t.sched->on_drained = [&] { drained = true; };

    t.h.on_piece(a->seq, "xy");
    t.sched->end_early(a);
    t.sched->cancel(g, false);
    t.sched->cancel(b, true);
    CHECK_FALSE(drained);
    t.sched->cancel_all();
    CHECK(drained);

    CHECK(client->of("a").back()["finish_reason"] == "length");
    CHECK(client->of("b").back()["finish_reason"] == "cancelled");
    CHECK(client->of("c").back()["finish_reason"] == "cancelled");
    for (const char* id : {"a", "b", "c"}) CHECK(client->finals(id) == 1);
    CHECK(gone->events.empty());
    CHECK(gone->forgotten == std::vector<std::string>{"\"g\""});
    CHECK(t.sched->stats().served == 1);
    CHECK(t.sched->stats().cancelled == 3);
    CHECK(t.runner.cancels == std::vector<std::uint64_t>{a->seq}); // only a reached the worker
}

TEST_CASE("scheduler: through any mix of outcomes every accepted job ends with exactly one final event") {
    scheduler_test t(8);
    std::mt19937 rng(20240531);
    std::vector<std::shared_ptr<recording_sink>> clients;
    for (int i = 0; i < 3; ++i) clients.push_back(std::make_shared<recording_sink>());
    std::vector<std::shared_ptr<cd::job>> accepted;
    std::set<std::string> silent; ///< cancelled with notify false: no final event
    std::uint64_t worker_job = 0; ///< the job the fake worker runs until it answers
    int next_id = 0;
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    auto any_accepted = [&]() -> std::shared_ptr<cd::job>& {
        return accepted[static_cast<std::size_t>(pick(static_cast<int>(accepted.size())))];
    };

    for (int step = 0; step < 2000; ++step) {
        if (!t.runner.idle_now && worker_job == 0 && !t.runner.runs.empty()) worker_job = t.running_seq();
        switch (pick(10)) {
        case 0:
        case 1:
        case 2: { // a client submits
            const auto& to = clients[static_cast<std::size_t>(pick(3))];
            static const char* const sessions[] = {"", "", "s1", "s2"};
            job_options o{.session = sessions[pick(4)],
                          .timeout_ms = pick(6) == 0 ? std::optional<std::int64_t>(0) : std::nullopt,
                          .stream = pick(2) == 0};
            auto j = t.make(next_id++, to, o);
            if (!t.sched->submit(j)) accepted.push_back(j);
            break;
        }
        case 3: // the worker sends a piece of the job it runs (perhaps one already ended for its client)
            if (worker_job) t.h.on_piece(worker_job, "z");
            break;
        case 4: // the worker answers
            if (worker_job) {
                const auto seq = std::exchange(worker_job, 0);
                if (pick(3) == 0) {
                    t.h.on_error(w::error_msg{seq, p::error_code::internal, "no", nullptr});
                    t.worker_ready();
                } else {
                    t.worker_done(seq, 1);
                }
            }
            break;
        case 5: // the worker dies; sometimes the crash loop follows
            if (worker_job) {
                t.runner.idle_now = false;
                t.h.on_job_lost(std::exchange(worker_job, 0), p::error_code::worker_crashed, "SIGSEGV");
                if (pick(4) == 0) {
                    t.runner.down = true;
                    t.h.on_unavailable("SIGSEGV");
                    t.runner.down = false;
                }
                t.worker_ready();
            }
            break;
        case 6: // a client cancels, or goes away
            if (!accepted.empty()) {
                auto& j = any_accepted();
                const bool notify = pick(2) == 0;
                if (!notify && j->st != cd::job::state::finished) silent.insert(j->key);
                t.sched->cancel(j, notify);
            }
            break;
        case 7:
            if (!accepted.empty()) t.sched->end_early(any_accepted());
            break;
        default: // deadlines of 0 ms fire
            t.poll();
            break;
        }
    }
    t.sched->cancel_all();
    t.poll();

    CHECK(accepted.size() > 200);
    const auto& s = t.sched->stats();
    CHECK(s.served + s.cancelled + s.timed_out + s.failed == accepted.size());
    CHECK(t.sched->in_flight() == 0);
    for (const auto& j : accepted) {
        const auto to = std::static_pointer_cast<recording_sink>(j->sink.lock());
        REQUIRE(to);
        CHECK(j->st == cd::job::state::finished);
        const int finals = to->finals(j->id);
        CHECK_MESSAGE(finals == (silent.count(j->key) ? 0 : 1), "job " << j->key);
        int forgotten = 0;
        for (const auto& k : to->forgotten) forgotten += k == j->key;
        CHECK_MESSAGE(forgotten == 1, "job " << j->key);
        // Nothing follows a final event.
        const auto ev = to->of(j->id);
        if (!ev.empty() && finals == 1) CHECK(ev.back()["event"] != "piece");
    }
}
