// The supervisor and its parts on their own: the worker process, the channel to it, the
// watchdog, and the supervisor running colibri-test-worker with injected faults.

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "colibri/protocol/line_framer.hpp"
#include "colibri/protocol/worker_messages.hpp"
#include "config.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"
#include "job.hpp"
#include "job_sink.hpp"
#include "scheduler.hpp"
#include "supervisor.hpp"
#include "watchdog.hpp"
#include "worker_channel.hpp"
#include "worker_process.hpp"

namespace cd = colibri::daemon;
namespace p = colibri::protocol;
namespace w = colibri::protocol::worker;
using nlohmann::json;
using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

namespace {

/// Runs handlers until `done()` holds; false when `limit` passes first.
template <class Pred>
bool run_until(boost::asio::io_context& io, Pred done, milliseconds limit = milliseconds(10000)) {
    const auto deadline = clock_type::now() + limit;
    while (!done()) {
        if (clock_type::now() >= deadline) return false;
        io.restart();
        io.run_one_for(milliseconds(10));
    }
    return true;
}

/// Runs handlers for `d` (returns early only when there is nothing left to run).
void run_for(boost::asio::io_context& io, milliseconds d) {
    io.restart();
    io.run_for(d);
}

/// true once `pid` is no child of this process any more (reaped).
bool reaped(pid_t pid) { return ::waitpid(pid, nullptr, WNOHANG) == -1 && errno == ECHILD; }

/// All bytes from `fd` until the peer closes it (bounded).
std::string read_to_eof(int fd) {
    std::string out;
    char buf[4096];
    const auto deadline = clock_type::now() + milliseconds(10000);
    while (clock_type::now() < deadline) {
        pollfd pfd{fd, POLLIN, 0};
        if (::poll(&pfd, 1, 100) <= 0) continue;
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
}

cd::worker_launch shell(const std::string& script) { return {"/bin/sh", {"-c", script}}; }

cd::worker_launch test_worker(const std::string& model) {
    return {COLIBRI_TEST_WORKER_EXE, {"--model", model, "--enable-fault-injection"}};
}

/// Fast enough for tests, loose enough for a loaded machine; each test tightens what it checks.
cd::watchdog_config test_watchdog() {
    cd::watchdog_config c;
    c.ping_interval_ms = 20;
    c.liveness_timeout_ms = 5000;
    c.progress_timeout_ms = 10000;
    c.start_timeout_ms = 10000;
    c.restart_backoff_ms = 1;
    c.restart_backoff_max_ms = 10;
    c.crash_loop_threshold = 100;
    c.crash_loop_window_ms = 60000;
    c.crash_loop_retry_ms = 60000;
    return c;
}

struct lost_job {
    std::uint64_t job;
    p::error_code code;
    std::string reason;
};

/// A supervisor of colibri-test-worker (fault injection on) that records every callback.
struct supervisor_test {
    explicit supervisor_test(cd::watchdog_config cfg = test_watchdog(),
                             const std::string& model_content = "fake model\n",
                             std::optional<cd::worker_launch> launch = std::nullopt) {
        model = dir.path() + "/model.colibri";
        std::ofstream(model) << model_content;
        if (!launch) launch = test_worker(model);
        cd::supervisor::handlers h;
        h.on_ready = [this] { ++ready_calls; };
        h.on_piece = [this](std::uint64_t job, std::string_view t) { text[job] += t; };
        h.on_done = [this](const w::done_msg& m) { done.push_back(m); };
        h.on_error = [this](const w::error_msg& m) { errors.push_back(m); };
        h.on_job_lost = [this](std::uint64_t job, p::error_code code, const std::string& reason) {
            lost.push_back({job, code, reason});
        };
        h.on_unavailable = [this](const std::string& reason) { unavailable.push_back(reason); };
        h.on_state = [this](cd::worker_state s) { states.push_back(s); };
        sup = std::make_unique<cd::supervisor>(io, *launch, cfg, std::move(h));
    }

    bool start_and_wait_ready() {
        sup->start();
        return run_until(io, [&] { return sup->state() == cd::worker_state::ready; });
    }

    static w::run_msg job(std::uint64_t n, const std::string& prompt, int max_tokens, p::fault_spec fault = {}) {
        w::run_msg m;
        m.job = n;
        m.req.prompt = prompt;
        m.req.max_tokens = max_tokens;
        m.req.fault = fault;
        m.seed = 5;
        return m;
    }

    colibri::test::temp_dir dir;
    std::string model;
    boost::asio::io_context io;
    int ready_calls = 0;
    std::map<std::uint64_t, std::string> text;
    std::vector<w::done_msg> done;
    std::vector<w::error_msg> errors;
    std::vector<lost_job> lost;
    std::vector<std::string> unavailable;
    std::vector<cd::worker_state> states;
    std::unique_ptr<cd::supervisor> sup;
};

} // namespace

// ---- worker_process

TEST_CASE("worker_process: the child has its socket as fd 3 and no systemd variables") {
    ::setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1);
    ::setenv("LISTEN_FDS", "1", 1);
    ::setenv("COLIBRI_TEST_KEPT", "kept", 1);
    auto proc = cd::worker_process::spawn(
        shell("printf '%s %s %s %s %s' \"$0\" \"$1\" \"${NOTIFY_SOCKET-unset}\" \"${LISTEN_FDS-unset}\" "
              "\"$COLIBRI_TEST_KEPT\" >&3"));
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("LISTEN_FDS");
    ::unsetenv("COLIBRI_TEST_KEPT");
    REQUIRE(proc.running());
    CHECK(proc.exec_error() == 0);
    const int fd = proc.take_socket();
    REQUIRE(fd >= 0);
    CHECK(proc.take_socket() == -1); // one owner
    CHECK(read_to_eof(fd) == "--fd 3 unset unset kept");
    ::close(fd);
    int status = -1;
    REQUIRE(::waitpid(proc.pid(), &status, 0) == proc.pid());
    proc.reaped();
    CHECK(cd::describe_exit_status(status) == "exited with status 0");
    CHECK(proc.pid() == -1);
}

TEST_CASE("worker_process: the owner's end kills and reaps a child that still runs - a move hands it on") {
    pid_t pid = -1;
    {
        auto first = cd::worker_process::spawn(shell("exec sleep 30"));
        pid = first.pid();
        REQUIRE(pid > 0);
        cd::worker_process second = std::move(first);
        CHECK(first.pid() == -1);
        CHECK(second.pid() == pid);
        CHECK(::kill(pid, 0) == 0);
    }
    CHECK(reaped(pid));
}

TEST_CASE("worker_process: a program that cannot be executed gives its errno and exit status 127") {
    auto proc = cd::worker_process::spawn({"/nonexistent/colibri-worker", {}});
    REQUIRE(proc.running());
    CHECK(proc.exec_error() == ENOENT);
    int status = -1;
    REQUIRE(::waitpid(proc.pid(), &status, 0) == proc.pid());
    proc.reaped();
    CHECK(cd::describe_exit_status(status) == "exited with status 127");
}

// ---- worker_channel

namespace {

struct channel_test {
    channel_test() {
        int sv[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
        peer = sv[1];
        channel.open(sv[0]);
        channel.start();
    }
    ~channel_test() {
        if (peer >= 0) ::close(peer);
    }
    void peer_write(const std::string& bytes) const {
        REQUIRE(::write(peer, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    }

    boost::asio::io_context io;
    std::vector<w::from_worker> messages;
    std::vector<std::string> violations;
    int broken = 0;
    cd::worker_channel channel{io,
                               {.on_message = [this](w::from_worker& m) { messages.push_back(m); },
                                .on_violation = [this](const std::string& r) { violations.push_back(r); },
                                .on_broken = [this] { ++broken; }}};
    int peer = -1;
};

} // namespace

TEST_CASE("worker_channel: a message split across reads arrives whole - sends arrive framed in order") {
    channel_test t;
    const std::string line = w::encode(w::from_worker(w::piece_msg{3, "h\xc3\xa9llo"})) + "\n";
    t.peer_write(line.substr(0, 7));
    run_for(t.io, milliseconds(20));
    CHECK(t.messages.empty());
    t.peer_write(line.substr(7));
    REQUIRE(run_until(t.io, [&] { return !t.messages.empty(); }));
    REQUIRE(t.messages.size() == 1);
    const auto* piece = std::get_if<w::piece_msg>(&t.messages[0]);
    REQUIRE(piece);
    CHECK(piece->job == 3);
    CHECK(piece->text == "h\xc3\xa9llo");

    t.channel.send(w::ping_msg{9});
    t.channel.send(w::cancel_msg{3});
    std::string got;
    REQUIRE(run_until(t.io, [&] {
        char buf[256];
        const ssize_t n = ::recv(t.peer, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) got.append(buf, static_cast<std::size_t>(n));
        return std::count(got.begin(), got.end(), '\n') == 2;
    }));
    const auto nl = got.find('\n');
    const auto ping = w::decode_to_worker(got.substr(0, nl));
    REQUIRE(std::holds_alternative<w::ping_msg>(ping));
    CHECK(std::get<w::ping_msg>(ping).n == 9);
    const auto cancel = w::decode_to_worker(got.substr(nl + 1, got.size() - nl - 2));
    REQUIRE(std::holds_alternative<w::cancel_msg>(cancel));
    CHECK(std::get<w::cancel_msg>(cancel).job == 3);
    CHECK(t.violations.empty());
    CHECK(t.broken == 0);
}

TEST_CASE("worker_channel: a malformed line is reported and reading goes on - an oversized one ends reading") {
    channel_test t;
    t.peer_write("{\"t\":\"nonsense\"}\n" + w::encode(w::from_worker(w::pong_msg{4})) + "\n");
    REQUIRE(run_until(t.io, [&] { return t.messages.size() == 1; }));
    REQUIRE(t.violations.size() == 1);
    CHECK(t.violations[0].rfind("sent a malformed message: ", 0) == 0);
    CHECK(std::get<w::pong_msg>(t.messages[0]).n == 4);

    // More than the 16 MiB limit without a newline, written as fast as the channel reads.
    REQUIRE(::fcntl(t.peer, F_SETFL, O_NONBLOCK) == 0);
    const std::string chunk(1 << 16, 'x');
    std::size_t sent = 0;
    REQUIRE(run_until(t.io, [&] {
        if (sent <= (std::size_t(16) << 20)) {
            const ssize_t n = ::write(t.peer, chunk.data(), chunk.size());
            if (n > 0) sent += static_cast<std::size_t>(n);
        }
        return t.violations.size() == 2;
    }));
    CHECK(t.violations[1] == "sent an oversized message");
    CHECK(t.messages.size() == 1);
    CHECK(t.broken == 0);
}

TEST_CASE("worker_channel: end of file is reported once - after close nothing is") {
    channel_test t;
    ::close(std::exchange(t.peer, -1));
    REQUIRE(run_until(t.io, [&] { return t.broken == 1; }));
    run_for(t.io, milliseconds(20));
    CHECK(t.broken == 1);

    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    t.channel.open(sv[0]);
    t.channel.start();
    CHECK(t.channel.is_open());
    t.channel.close();
    CHECK_FALSE(t.channel.is_open());
    t.channel.send(w::ping_msg{1}); // dropped
    const std::string line = w::encode(w::from_worker(w::pong_msg{1})) + "\n";
    CHECK(::send(sv[1], line.data(), line.size(), MSG_NOSIGNAL) == -1); // the channel's end is closed
    ::close(sv[1]);
    run_for(t.io, milliseconds(20));
    CHECK(t.messages.empty());
    CHECK(t.broken == 1);
}

// ---- watchdog

namespace {

struct watchdog_test {
    explicit watchdog_test(cd::watchdog_config c) : cfg(c) {}

    boost::asio::io_context io;
    cd::watchdog_config cfg;
    std::vector<std::uint64_t> pings;
    bool answer_pings = false;
    std::vector<std::pair<std::string, p::error_code>> hangs;
    cd::watchdog wd{io,
                    cfg,
                    {.send_ping =
                         [this](const w::ping_msg& m) {
                             pings.push_back(m.n);
                             if (answer_pings) wd.pong(m.n);
                         },
                     .on_hang = [this](const std::string& r, p::error_code c) { hangs.emplace_back(r, c); }}};
};

cd::watchdog_config quiet_watchdog() {
    cd::watchdog_config c;
    c.ping_interval_ms = 60000;
    c.liveness_timeout_ms = 60000;
    c.progress_timeout_ms = 60000;
    c.start_timeout_ms = 60000;
    return c;
}

} // namespace

TEST_CASE("watchdog: a worker not ready in time is reported as crashed - one ready in time is not") {
    auto c = quiet_watchdog();
    c.start_timeout_ms = 30;
    watchdog_test t(c);
    const auto began = clock_type::now();
    t.wd.worker_started();
    REQUIRE(run_until(t.io, [&] { return !t.hangs.empty(); }));
    CHECK(clock_type::now() - began >= milliseconds(30));
    CHECK(t.hangs[0].first == "did not become ready within 30 ms");
    CHECK(t.hangs[0].second == p::error_code::worker_crashed);

    t.hangs.clear();
    t.wd.worker_started();
    t.wd.worker_ready();
    run_for(t.io, milliseconds(100));
    CHECK(t.hangs.empty());
}

TEST_CASE("watchdog: an unanswered probe is a hang after the liveness timeout - answered probes never are") {
    auto c = quiet_watchdog();
    c.ping_interval_ms = 5;
    c.liveness_timeout_ms = 60;
    {
        watchdog_test t(c);
        t.answer_pings = true;
        t.wd.worker_started();
        t.wd.worker_ready();
        REQUIRE(run_until(t.io, [&] { return t.pings.size() >= 30; }));
        CHECK(t.hangs.empty());
        CHECK(t.pings[0] == 1);
        CHECK(t.pings[29] == 30);
    }
    watchdog_test t(c);
    t.wd.worker_started();
    t.wd.worker_ready();
    const auto began = clock_type::now();
    REQUIRE(run_until(t.io, [&] { return !t.hangs.empty(); }));
    CHECK(clock_type::now() - began >= milliseconds(60));
    CHECK(t.pings == std::vector<std::uint64_t>{1}); // no second probe while one is outstanding
    CHECK(t.hangs[0].first == "no answer to the liveness probe for 60 ms");
    CHECK(t.hangs[0].second == p::error_code::timeout);
    run_for(t.io, milliseconds(30));
    CHECK(t.hangs.size() == 1); // reported once: the supervisor kills
}

TEST_CASE("watchdog: a job without progress is a hang - its end or its worker's end stops the check") {
    auto c = quiet_watchdog();
    c.progress_timeout_ms = 30;
    watchdog_test t(c);
    t.wd.worker_started();
    t.wd.worker_ready();
    t.wd.job_alive(4);
    REQUIRE(run_until(t.io, [&] { return !t.hangs.empty(); }));
    CHECK(t.hangs[0].first == "no progress for 30 ms");
    CHECK(t.hangs[0].second == p::error_code::timeout);

    t.hangs.clear();
    t.wd.job_alive(5);
    t.wd.job_ended();
    t.wd.job_alive(6);
    t.wd.worker_gone();
    run_for(t.io, milliseconds(100));
    CHECK(t.hangs.empty());

    // Asked to exit, the worker still has to finish its job.
    t.wd.worker_started();
    t.wd.worker_ready();
    t.wd.job_alive(7);
    t.wd.worker_stopping();
    REQUIRE(run_until(t.io, [&] { return !t.hangs.empty(); }));
    CHECK(t.hangs[0].first == "no progress for 30 ms");
}

// ---- supervisor

TEST_CASE("supervisor: a crash mid-job loses the job as worker_crashed - the restarted worker runs the next job") {
    supervisor_test t;
    REQUIRE(t.start_and_wait_ready());
    CHECK(t.ready_calls == 1);
    const pid_t first_pid = t.sup->pid();
    const auto crashing = supervisor_test::job(1, "crash here", 10, {p::fault_kind::crash, 2, 0});
    t.sup->run(crashing);
    REQUIRE(run_until(t.io, [&] { return !t.lost.empty(); }));
    REQUIRE(t.lost.size() == 1);
    CHECK(t.lost[0].job == 1);
    CHECK(t.lost[0].code == p::error_code::worker_crashed);
    CHECK(t.lost[0].reason == "killed by signal 11 (SIGSEGV)");
    // Two pieces were sent before the crash; the exit may be noticed before the last is read.
    const auto pieces = colibri::test::make_fake_completion(crashing.req, crashing.seed).pieces;
    CHECK((pieces[0] + pieces[1]).rfind(t.text[1], 0) == 0);
    CHECK(t.sup->restarts() == 1);
    CHECK(t.sup->last_crash_reason() == "killed by signal 11 (SIGSEGV)");
    CHECK(t.sup->last_crash_time().has_value());

    REQUIRE(run_until(t.io, [&] { return t.sup->idle(); }));
    CHECK(t.sup->pid() != first_pid);
    CHECK(reaped(first_pid));
    t.sup->run(supervisor_test::job(2, "recovered", 6));
    REQUIRE(run_until(t.io, [&] { return !t.done.empty(); }));
    CHECK(t.done[0].job == 2);
    CHECK(t.done[0].reason == p::finish_reason::length);
    CHECK(t.done[0].tokens.completion_tokens == 6);
    CHECK(t.text[2] == colibri::test::fake_text("recovered", 6, 5));
    CHECK(t.errors.empty());
    CHECK(t.lost.size() == 1);
    using s = cd::worker_state;
    CHECK(t.states ==
          std::vector<s>{s::starting, s::ready, s::busy, s::restarting, s::starting, s::ready, s::busy, s::ready});
}

TEST_CASE("supervisor: a hung job is killed after the progress timeout - timeout - and the worker replaced") {
    auto cfg = test_watchdog();
    cfg.progress_timeout_ms = 300;
    supervisor_test t(cfg);
    REQUIRE(t.start_and_wait_ready());
    const pid_t hung_pid = t.sup->pid();
    const auto began = clock_type::now();
    const auto hanging = supervisor_test::job(1, "hang", 10, {p::fault_kind::hang, 1, 0});
    t.sup->run(hanging);
    REQUIRE(run_until(t.io, [&] { return !t.lost.empty(); }));
    CHECK(clock_type::now() - began >= milliseconds(300));
    CHECK(t.lost[0].job == 1);
    CHECK(t.lost[0].code == p::error_code::timeout);
    CHECK(t.lost[0].reason == "no progress for 300 ms");
    CHECK(t.text[1] == colibri::test::make_fake_completion(hanging.req, hanging.seed).pieces[0]); // before the hang
    CHECK(t.sup->restarts() == 1);
    REQUIRE(run_until(t.io, [&] { return t.sup->idle(); }));
    CHECK(reaped(hung_pid));
    CHECK(t.done.empty());
}

TEST_CASE("supervisor: a frozen worker fails the liveness probe and is replaced - no job is lost") {
    auto cfg = test_watchdog();
    cfg.liveness_timeout_ms = 200;
    supervisor_test t(cfg);
    REQUIRE(t.start_and_wait_ready());
    const pid_t frozen = t.sup->pid();
    REQUIRE(::kill(frozen, SIGSTOP) == 0);
    REQUIRE(run_until(t.io, [&] { return t.sup->restarts() == 1; }));
    CHECK(t.sup->last_crash_reason() == "no answer to the liveness probe for 200 ms");
    CHECK(t.lost.empty());
    REQUIRE(run_until(t.io, [&] { return t.sup->idle(); }));
    CHECK(t.sup->pid() != frozen);
    CHECK(t.ready_calls == 2);
}

TEST_CASE("supervisor: a worker that never becomes ready is killed after the start timeout") {
    auto cfg = test_watchdog();
    cfg.start_timeout_ms = 200;
    supervisor_test t(cfg, "fake model\n", shell("exec sleep 30"));
    t.sup->start();
    CHECK(t.sup->state() == cd::worker_state::starting);
    REQUIRE(run_until(t.io, [&] { return t.sup->restarts() == 1; }));
    CHECK(t.sup->last_crash_reason() == "did not become ready within 200 ms");
    CHECK(t.ready_calls == 0);
}

TEST_CASE("supervisor: a worker that cannot load its model ends in the crash loop state with the reason") {
    auto cfg = test_watchdog();
    cfg.crash_loop_threshold = 2;
    supervisor_test t(cfg, "fail: corrupt\n");
    t.sup->start();
    REQUIRE(run_until(t.io, [&] { return !t.unavailable.empty(); }));
    const std::string reason = "cannot load model '" + t.model + "': corrupt (exited with status 2)";
    CHECK(t.unavailable == std::vector<std::string>{reason});
    CHECK(t.sup->last_crash_reason() == reason);
    CHECK(t.sup->state() == cd::worker_state::unavailable);
    CHECK(t.sup->unavailable());
    CHECK_FALSE(t.sup->idle());
    CHECK(t.sup->restarts() == 2);
    CHECK(t.sup->pid() == -1);
    CHECK(t.ready_calls == 0);
}

TEST_CASE("supervisor: a worker program that cannot be executed is reported with its errno") {
    supervisor_test t(test_watchdog(), "fake model\n", cd::worker_launch{"/nonexistent/colibri-worker", {}});
    t.sup->start();
    REQUIRE(run_until(t.io, [&] { return t.sup->restarts() >= 1; }));
    CHECK(t.sup->last_crash_reason() ==
          "cannot execute worker '/nonexistent/colibri-worker': No such file or directory (exited with status 127)");
}

TEST_CASE("supervisor: cancel stops the running job at its next piece - done with reason cancelled") {
    supervisor_test t;
    REQUIRE(t.start_and_wait_ready());
    t.sup->run(supervisor_test::job(1, "slowly", 100, {p::fault_kind::slow, 0, 20}));
    REQUIRE(run_until(t.io, [&] { return !t.text[1].empty(); }));
    t.sup->cancel(1);
    REQUIRE(run_until(t.io, [&] { return !t.done.empty(); }));
    CHECK(t.done[0].job == 1);
    CHECK(t.done[0].reason == p::finish_reason::cancelled);
    CHECK(t.done[0].tokens.completion_tokens < 100);
    CHECK(t.sup->idle());
    CHECK(t.sup->restarts() == 0);
}

TEST_CASE("supervisor: shutdown lets the worker exit and reports once it is reaped") {
    supervisor_test t;
    REQUIRE(t.start_and_wait_ready());
    const pid_t pid = t.sup->pid();
    bool stopped = false;
    t.sup->shutdown([&] { stopped = true; });
    CHECK(t.sup->state() == cd::worker_state::stopping);
    REQUIRE(run_until(t.io, [&] { return stopped; }));
    CHECK(t.sup->state() == cd::worker_state::stopped);
    CHECK(t.sup->pid() == -1);
    CHECK(t.sup->restarts() == 0);
    CHECK(reaped(pid));
}

TEST_CASE("supervisor: destroying it kills and reaps its worker") {
    supervisor_test t;
    REQUIRE(t.start_and_wait_ready());
    const pid_t pid = t.sup->pid();
    REQUIRE(pid > 0);
    t.sup.reset();
    CHECK(reaped(pid));
}

// ---- the scheduler on a real supervisor

namespace {

class recording_sink final : public cd::job_sink {
public:
    void send(const json& event) override { events.push_back(event); }
    void forget(const std::string&) override {}
    std::vector<json> finals(const json& id) const {
        std::vector<json> out;
        for (const auto& e : events)
            if (e["id"] == id && (e["event"] == "done" || e["event"] == "error")) out.push_back(e);
        return out;
    }
    std::vector<json> events;
};

} // namespace

TEST_CASE("supervisor and scheduler: through crashes - hangs and refusals each request gets one final answer") {
    auto wd = test_watchdog();
    wd.progress_timeout_ms = 300;
    boost::asio::io_context io;
    cd::daemon_config cfg;
    cfg.watchdog = wd;
    colibri::test::temp_dir dir;
    const std::string model = dir.path() + "/model.colibri";
    std::ofstream(model) << "fake model\n";
    cd::scheduler sched(cfg);
    cd::supervisor sup(io, test_worker(model), wd, sched.make_handlers());
    sched.attach(sup);
    sup.start();

    auto client = std::make_shared<recording_sink>();
    std::vector<std::shared_ptr<cd::job>> jobs;
    auto submit = [&](int id, const std::string& prompt, p::fault_spec fault = {}) {
        auto j = std::make_shared<cd::job>(io);
        j->id = id;
        j->key = std::to_string(id);
        j->req.prompt = prompt;
        j->req.max_tokens = 4;
        j->req.seed = 1;
        j->req.fault = fault;
        j->sink = client;
        j->owner = client.get();
        REQUIRE_FALSE(sched.submit(j));
        jobs.push_back(j);
    };
    submit(1, "plain");
    submit(2, "crash", {p::fault_kind::crash, 1, 0});
    submit(3, "reject me");
    submit(4, "hang", {p::fault_kind::hang, 0, 0});
    submit(5, "never runs");
    submit(6, "device", {p::fault_kind::device_error, 1, 0});
    submit(7, "after all that");
    sched.cancel(jobs[4], true);
    REQUIRE(run_until(
        io, [&] { return sched.in_flight() == 0; }, milliseconds(20000)));
    run_for(io, milliseconds(50)); // anything late would arrive now

    for (int id = 1; id <= 7; ++id) REQUIRE_MESSAGE(client->finals(id).size() == 1, "request " << id);
    CHECK(client->finals(1)[0]["event"] == "done");
    CHECK(client->finals(2)[0]["code"] == "worker_crashed");
    CHECK(client->finals(3)[0]["code"] == "invalid_request");
    CHECK(client->finals(4)[0]["code"] == "timeout");
    CHECK(client->finals(5)[0]["finish_reason"] == "cancelled");
    CHECK(client->finals(6)[0]["code"] == "worker_crashed");
    CHECK(client->finals(6)[0]["message"] == "the device failed: injected device error; the worker restarts");
    const auto last = client->finals(7)[0];
    CHECK(last["event"] == "done");
    std::string text;
    for (const auto& e : client->events)
        if (e["id"] == 7 && e["event"] == "piece") text += e["text"].get<std::string>();
    CHECK(text == colibri::test::fake_text("after all that", 4, 1));
    CHECK(sup.restarts() == 3);
    CHECK(sched.stats().served == 2);
    CHECK(sched.stats().failed == 4);
    CHECK(sched.stats().cancelled == 1);
}
