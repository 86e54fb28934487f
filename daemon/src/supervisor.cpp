#include "supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>

#include "log.hpp"
#include "sd_notify.hpp"

namespace colibri::daemon {

namespace asio = boost::asio;
namespace w = protocol::worker;
using protocol::error_code;

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("supervisor");
    return log;
}

std::chrono::milliseconds ms(int v) { return std::chrono::milliseconds(v); }

} // namespace

std::string_view to_string(worker_state state) {
    switch (state) {
    case worker_state::starting: return "starting";
    case worker_state::ready: return "idle";
    case worker_state::busy: return "busy";
    case worker_state::restarting: return "restarting";
    case worker_state::unavailable: return "unavailable";
    case worker_state::stopping: return "stopping";
    case worker_state::stopped: return "stopped";
    }
    return "unknown";
}

std::string describe_exit_status(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* abbrev = ::sigabbrev_np(sig);
        return "killed by signal " + std::to_string(sig) +
               (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
    }
    return "ended with wait status " + std::to_string(status);
}

supervisor::supervisor(asio::io_context& io, worker_launch launch, watchdog_config cfg, handlers h)
    : io_(io), launch_(std::move(launch)), cfg_(cfg), h_(std::move(h)), sigchld_(io, SIGCHLD),
      start_timer_(io), progress_timer_(io), ping_timer_(io), restart_timer_(io), stop_timer_(io) {}

supervisor::~supervisor() {
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
}

void supervisor::start() {
    wait_sigchld();
    spawn();
}

void supervisor::set_state(worker_state s) {
    if (s == state_) return;
    state_ = s;
    if (h_.on_state) h_.on_state(s);
}

void supervisor::spawn() {
    // Everything the child needs is prepared before fork(): the child only calls
    // async-signal-safe functions.
    std::vector<std::string> args;
    args.push_back(launch_.exe);
    args.insert(args.end(), launch_.args.begin(), launch_.args.end());
    args.push_back("--fd");
    args.push_back("3");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // systemd's notification and activation variables are for the supervisor alone: a
    // worker must never be able to report READY or WATCHDOG in its place.
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) {
        const std::string_view var(*e);
        bool keep = true;
        for (const char* name : service_environment_variables) {
            const std::string_view n(name);
            if (var.size() > n.size() && var.compare(0, n.size(), n) == 0 && var[n.size()] == '=') keep = false;
        }
        if (keep) envp.push_back(*e);
    }
    envp.push_back(nullptr);

    int sv[2];
    int exec_pipe[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ||
        ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
        // Out of descriptors: treat like a crash so that backoff applies.
        logger()->error("cannot create the worker socketpair: {}", std::strerror(errno));
        worker_exited(W_EXITCODE(126, 0));
        return;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::close(sv[0]);
        ::close(exec_pipe[0]);
        if (sv[1] == 3) ::fcntl(3, F_SETFD, 0);
        else ::dup2(sv[1], 3); // dup2 clears FD_CLOEXEC on the copy
        if (exec_pipe[1] != 4) {
            ::dup2(exec_pipe[1], 4);
            ::fcntl(4, F_SETFD, FD_CLOEXEC);
        }
        ::dup2(2, 1); // stray prints from the engine go to the log, never to a client
        ::close_range(5, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(1);
        ::execve(argv[0], argv.data(), envp.data());
        const int err = errno;
        (void)!::write(4, &err, sizeof(err));
        ::_exit(127);
    }
    ::close(sv[1]);
    ::close(exec_pipe[1]);
    if (pid < 0) {
        const int err = errno;
        ::close(sv[0]);
        ::close(exec_pipe[0]);
        logger()->error("cannot fork the worker: {}", std::strerror(err));
        worker_exited(W_EXITCODE(126, 0));
        return;
    }
    // The pipe closes on a successful exec; on failure the child writes errno first.
    int exec_errno = 0;
    ssize_t n;
    do n = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
    while (n < 0 && errno == EINTR);
    ::close(exec_pipe[0]);

    ++generation_;
    pid_ = pid;
    job_ = 0;
    framer_ = protocol::line_framer(protocol::default_max_line_bytes * 16);
    out_.clear();
    writing_.clear();
    write_active_ = false;
    ping_outstanding_ = false;
    kill_reason_.clear();
    kill_code_ = error_code::worker_crashed;
    fatal_message_.clear();
    sock_ = std::make_unique<asio::local::stream_protocol::socket>(io_);
    sock_->assign(asio::local::stream_protocol(), sv[0]);
    set_state(worker_state::starting);

    if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
        fatal_message_ = "cannot execute worker '" + launch_.exe + "': " + std::strerror(exec_errno);
        logger()->error("{}", fatal_message_);
        return; // the child exits with 127; reap() reports it
    }
    logger()->info("worker started (pid {}, restart {})", pid_, restarts_);

    const auto gen = generation_;
    start_timer_.expires_after(ms(cfg_.start_timeout_ms));
    start_timer_.async_wait([this, gen](boost::system::error_code ec) {
        if (ec || gen != generation_ || state_ != worker_state::starting) return;
        kill_worker("did not become ready within " + std::to_string(cfg_.start_timeout_ms) + " ms",
                    error_code::worker_crashed);
    });
    do_read();
}

void supervisor::do_read() {
    const auto gen = generation_;
    sock_->async_read_some(asio::buffer(read_buf_), [this, gen](boost::system::error_code ec, std::size_t n) {
        if (gen != generation_ || !sock_) return;
        if (ec) {
            // EOF or error: the worker is dying or broken. Make sure it is dead; the
            // SIGCHLD handler reports why.
            if (pid_ > 0) ::kill(pid_, SIGKILL);
            return;
        }
        framer_.feed(std::string_view(read_buf_.data(), n));
        std::string line;
        for (;;) {
            const auto r = framer_.next(line);
            if (r == protocol::line_framer::result::need_more) break;
            if (r == protocol::line_framer::result::too_long) {
                kill_worker("sent an oversized message", error_code::worker_crashed);
                return;
            }
            handle_line(line);
            if (gen != generation_) return;
        }
        do_read();
    });
}

void supervisor::handle_line(std::string_view line) {
    w::from_worker msg;
    try {
        msg = w::decode_from_worker(line);
    } catch (const protocol::protocol_error& e) {
        kill_worker(std::string("sent a malformed message: ") + e.what(), error_code::worker_crashed);
        return;
    }
    std::visit(
        [this](auto& m) {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, w::ready_msg>) {
                if (state_ != worker_state::starting) return;
                start_timer_.cancel();
                model_info_ = std::move(m.info);
                // The cache counters change with every job: kept apart from the model's description.
                cache_stats_ = model_info_.value("cache", nlohmann::json());
                model_info_.erase("cache");
                set_state(worker_state::ready);
                logger()->info("worker ready (pid {})", pid_);
                schedule_ping();
                if (h_.on_ready) h_.on_ready();
            } else if constexpr (std::is_same_v<T, w::piece_msg>) {
                if (m.job != job_) return;
                arm_progress();
                if (h_.on_piece) h_.on_piece(m.job, m.text);
            } else if constexpr (std::is_same_v<T, w::done_msg> || std::is_same_v<T, w::error_msg>) {
                if (m.job != job_ || job_ == 0) return;
                job_ = 0;
                progress_timer_.cancel();
                if constexpr (std::is_same_v<T, w::done_msg>) consecutive_failures_ = 0;
                // a worker that said it is going (fatal) takes no more work: the queue waits
                // for its successor
                if (state_ == worker_state::busy && fatal_message_.empty()) set_state(worker_state::ready);
                if (!m.upstreams.is_null()) upstream_stats_ = m.upstreams;
                if constexpr (std::is_same_v<T, w::done_msg>) {
                    if (!m.cache.is_null()) cache_stats_ = m.cache;
                    if (h_.on_done) h_.on_done(m);
                } else {
                    if (h_.on_error) h_.on_error(m);
                }
                if (state_ == worker_state::ready && h_.on_ready) h_.on_ready();
            } else if constexpr (std::is_same_v<T, w::pong_msg>) {
                if (m.n == ping_n_) ping_outstanding_ = false;
            } else if constexpr (std::is_same_v<T, w::progress_msg>) {
                if (m.job == job_ && job_ != 0) arm_progress();
            } else {
                fatal_message_ = m.message;
                if (state_ == worker_state::starting) logger()->error("worker cannot start: {}", m.message);
                else logger()->error("worker is going: {}", m.message);
            }
        },
        msg);
}

void supervisor::send(const w::to_worker& msg) {
    if (!sock_) return;
    out_.push_back(protocol::frame(w::encode(msg)));
    if (!write_active_) do_write();
}

void supervisor::do_write() {
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
        if (gen != generation_) return;
        if (ec) {
            write_active_ = false;
            if (pid_ > 0) ::kill(pid_, SIGKILL);
            return;
        }
        do_write();
    });
}

void supervisor::run(const w::run_msg& msg) {
    job_ = msg.job;
    set_state(worker_state::busy);
    send(msg);
    arm_progress();
}

void supervisor::cancel(std::uint64_t job) {
    if (job != 0 && job == job_) send(w::cancel_msg{job});
}

void supervisor::arm_progress() {
    const auto gen = generation_;
    const auto job = job_;
    progress_timer_.expires_after(ms(cfg_.progress_timeout_ms));
    progress_timer_.async_wait([this, gen, job](boost::system::error_code ec) {
        if (ec || gen != generation_ || job != job_ || job_ == 0) return;
        kill_worker("no progress for " + std::to_string(cfg_.progress_timeout_ms) + " ms", error_code::timeout);
    });
}

void supervisor::schedule_ping() {
    const auto gen = generation_;
    ping_timer_.expires_after(ms(cfg_.ping_interval_ms));
    ping_timer_.async_wait([this, gen](boost::system::error_code ec) {
        if (ec || gen != generation_) return;
        on_ping_tick();
    });
}

void supervisor::on_ping_tick() {
    if (state_ != worker_state::ready && state_ != worker_state::busy) return;
    const auto now = clock::now();
    if (ping_outstanding_) {
        if (now - ping_sent_ >= ms(cfg_.liveness_timeout_ms)) {
            kill_worker("no answer to the liveness probe for " + std::to_string(cfg_.liveness_timeout_ms) + " ms",
                        error_code::timeout);
            return;
        }
    } else {
        ping_outstanding_ = true;
        ping_sent_ = now;
        send(w::ping_msg{++ping_n_});
    }
    schedule_ping();
}

void supervisor::kill_worker(const std::string& reason, error_code code) {
    if (pid_ <= 0) return;
    if (kill_reason_.empty()) {
        kill_reason_ = reason;
        kill_code_ = code;
        logger()->warn("killing worker (pid {}): {}", pid_, reason);
    }
    ::kill(pid_, SIGKILL);
}

void supervisor::wait_sigchld() {
    sigchld_.async_wait([this](boost::system::error_code ec, int) {
        if (ec) return;
        reap();
        wait_sigchld();
    });
}

void supervisor::reap() {
    // Signals coalesce: reap every child that is ready.
    for (;;) {
        int status = 0;
        const pid_t p = ::waitpid(-1, &status, WNOHANG);
        if (p <= 0) return;
        if (p == pid_) worker_exited(status);
    }
}

void supervisor::worker_exited(int status) {
    const pid_t old_pid = pid_;
    pid_ = -1;
    ++generation_; // invalidates every handler of the dead worker
    if (sock_) {
        boost::system::error_code ignored;
        sock_->close(ignored);
        sock_.reset();
    }
    start_timer_.cancel();
    progress_timer_.cancel();
    ping_timer_.cancel();
    const std::uint64_t lost_job = job_;
    job_ = 0;

    if (state_ == worker_state::stopping) {
        logger()->info("worker (pid {}) stopped: {}", old_pid, describe_exit_status(status));
        stop_timer_.cancel();
        set_state(worker_state::stopped);
        if (auto done = std::move(on_stopped_)) done();
        return;
    }

    std::string reason = !kill_reason_.empty() ? kill_reason_ : describe_exit_status(status);
    if (!fatal_message_.empty()) reason = fatal_message_ + " (" + reason + ")";
    const error_code code = kill_reason_.empty() ? error_code::worker_crashed : kill_code_;
    last_crash_reason_ = reason;
    const auto now = clock::now();
    last_crash_time_ = now;
    crash_times_.push_back(now);
    while (!crash_times_.empty() && now - crash_times_.front() > ms(cfg_.crash_loop_window_ms))
        crash_times_.pop_front();
    ++consecutive_failures_;
    ++restarts_;
    logger()->error("worker (pid {}) failed: {}", old_pid, reason);

    if (lost_job != 0 && h_.on_job_lost) h_.on_job_lost(lost_job, code, reason);

    int delay_ms;
    if (static_cast<int>(crash_times_.size()) >= cfg_.crash_loop_threshold) {
        set_state(worker_state::unavailable);
        delay_ms = cfg_.crash_loop_retry_ms;
        logger()->error("worker failed {} times within {} ms; unavailable, next attempt in {} ms",
                        crash_times_.size(), cfg_.crash_loop_window_ms, delay_ms);
        if (h_.on_unavailable) h_.on_unavailable(reason);
    } else {
        set_state(worker_state::restarting);
        const int shift = std::min(consecutive_failures_ - 1, 20);
        delay_ms = static_cast<int>(
            std::min<long long>(static_cast<long long>(cfg_.restart_backoff_ms) << shift, cfg_.restart_backoff_max_ms));
        logger()->info("restarting worker in {} ms", delay_ms);
    }
    restart_timer_.expires_after(ms(delay_ms));
    restart_timer_.async_wait([this](boost::system::error_code ec) {
        if (ec || (state_ != worker_state::restarting && state_ != worker_state::unavailable)) return;
        spawn();
    });
}

void supervisor::shutdown(std::function<void()> done) {
    restart_timer_.cancel();
    if (pid_ <= 0) {
        set_state(worker_state::stopped);
        if (done) done();
        return;
    }
    on_stopped_ = std::move(done);
    set_state(worker_state::stopping);
    send(w::shutdown_msg{});
    const auto gen = generation_;
    stop_timer_.expires_after(ms(2000));
    stop_timer_.async_wait([this, gen](boost::system::error_code ec) {
        if (ec || gen != generation_ || pid_ <= 0) return;
        logger()->warn("worker (pid {}) did not exit; killing it", pid_);
        ::kill(pid_, SIGKILL);
    });
}

} // namespace colibri::daemon
