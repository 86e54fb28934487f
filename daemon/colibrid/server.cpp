#include "server.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "colibri/protocol/codec.hpp"
#include "log.hpp"

namespace colibri::daemon {

namespace asio = boost::asio;
namespace p = protocol;
using nlohmann::json;

const char* const daemon_version = "colibrid 0.1.0";

namespace {

std::shared_ptr<spdlog::logger> logger() {
    static const auto log = module_logger("server");
    return log;
}

/// Resident set size of a process in bytes (0 when unknown).
std::uint64_t rss_bytes(pid_t pid) {
    std::ifstream in(pid > 0 ? "/proc/" + std::to_string(pid) + "/statm" : std::string("/proc/self/statm"));
    std::uint64_t size = 0, resident = 0;
    if (!(in >> size >> resident)) return 0;
    return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

} // namespace

server::server(asio::io_context& io, const daemon_config& cfg, listen_socket sock, worker_launch launch,
               peer_policy policy, sd_notifier& notifier, std::optional<int> http_fd)
    : io_(io), cfg_(cfg), listen_(std::move(sock)), acceptor_(io), accept_retry_(io), signals_(io, SIGTERM, SIGINT),
      grace_timer_(io), wedge_signal_(io), policy_(policy),
      reporter_(io, notifier, [this] { return service_status(); }), scheduler_(cfg),
      supervisor_(io, std::move(launch), cfg.watchdog, make_supervisor_handlers()),
      started_(std::chrono::steady_clock::now()), started_unix_(static_cast<std::int64_t>(std::time(nullptr))) {
    acceptor_.assign(asio::local::stream_protocol(), listen_.release_fd());
    if (!cfg.http.empty() || http_fd) http_ = std::make_unique<http_front>(io, cfg, *this, policy, http_fd);
    scheduler_.attach(supervisor_);
    limits_.max_tokens = cfg.max_tokens;
    limits_.allow_fault_injection = cfg.enable_fault_injection;
}

supervisor::handlers server::make_supervisor_handlers() {
    auto h = scheduler_.make_handlers();
    h.on_state = [this](worker_state s) { on_state(s); };
    return h;
}

void server::start() {
    logger()->info("listening on {}{}", listen_.path(), listen_.activated() ? " (socket activation)" : "");
    if (cfg_.enable_fault_injection) {
        logger()->warn("fault injection is enabled: for tests only");
        wait_wedge_signal();
    }
    wait_signals();
    do_accept();
    if (http_) http_->start();
    supervisor_.start();
    reporter_.start();
}

void server::on_state(worker_state s) {
    // READY=1 once the daemon can answer completions: the first worker has loaded the
    // model, or loading keeps failing and requests get `unavailable` with the reason.
    if (s == worker_state::ready || s == worker_state::unavailable) reporter_.ready();
    // idle <-> busy flips with every request: the periodic refresh reports the counts.
    const bool routine = s == worker_state::busy || (s == worker_state::ready && last_state_ == worker_state::busy);
    last_state_ = s;
    if (!routine) reporter_.update();
}

std::string server::service_status() const {
    const auto& st = scheduler_.stats();
    const std::string counts = std::to_string(st.served) + (st.served == 1 ? " request" : " requests") + " served, " +
                               std::to_string(supervisor_.restarts()) + " worker " +
                               (supervisor_.restarts() == 1 ? "restart" : "restarts");
    if (shutting_down_)
        return "shutting down, " + std::to_string(scheduler_.in_flight()) + " requests in flight; " + counts;
    const json& info = supervisor_.model_info();
    switch (supervisor_.state()) {
    case worker_state::starting:
        return (cfg_.backend == "openai" ? "starting the forwarding worker" : "loading model " + cfg_.model) + "; " +
               counts;
    case worker_state::ready:
    case worker_state::busy: {
        if (cfg_.backend == "openai")
            return "forwarding to " + std::to_string(cfg_.upstreams.size()) +
                   (cfg_.upstreams.size() == 1 ? " upstream; " : " upstreams; ") + counts;
        std::string model = cfg_.model;
        if (info.contains("architecture") && info.contains("quant"))
            model += " (" + info["architecture"].get<std::string>() + " " + info["quant"].get<std::string>() + ", " +
                     info.value("backend", cfg_.device) + ")";
        return "serving " + model + "; " + counts;
    }
    case worker_state::restarting:
        return "worker failed (" + supervisor_.last_crash_reason() + "), restarting; " + counts;
    case worker_state::unavailable:
        return "unavailable: the worker keeps failing (" + supervisor_.last_crash_reason() + "), next attempt in " +
               std::to_string(cfg_.watchdog.crash_loop_retry_ms / 1000) + " s; " + counts;
    case worker_state::stopping:
    case worker_state::stopped: break;
    }
    return "stopping; " + counts;
}

void server::wait_wedge_signal() {
    wedge_signal_.add(SIGUSR1);
    wedge_signal_.async_wait([](boost::system::error_code ec, int) {
        if (ec) return;
        logger()->warn("fault injection: SIGUSR1 wedges the event loop; the systemd watchdog pings stop");
        logger()->flush();
        for (;;) ::pause(); // only SIGKILL (or systemd's WatchdogSignal=) ends this
    });
}

void server::wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int signo) {
        if (ec) return;
        begin_shutdown(signo);
        wait_signals();
    });
}

void server::do_accept() {
    if (shutting_down_) return;
    acceptor_.async_accept([this](boost::system::error_code ec, asio::local::stream_protocol::socket sock) {
        if (shutting_down_) return;
        if (ec) {
            if (ec == asio::error::operation_aborted) return;
            // Typically EMFILE under a connection flood: back off briefly instead of spinning.
            logger()->warn("accept failed: {}", ec.message());
            accept_retry_.expires_after(std::chrono::milliseconds(50));
            accept_retry_.async_wait([this](boost::system::error_code e) {
                if (!e) do_accept();
            });
            return;
        }
        accept_one(std::move(sock));
        do_accept();
    });
}

void server::accept_one(asio::local::stream_protocol::socket sock) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    const bool have_cred = ::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    auto conn = std::make_shared<connection>(std::move(sock), *this, cfg_.max_line_bytes, cfg_.max_write_buffer_bytes);
    connections_.insert(conn);
    if (!have_cred || !peer_allowed(cred.uid, cred.gid,
                                    policy_.group ? groups_of(cred.uid, cred.gid) : std::vector<gid_t>{}, policy_)) {
        logger()->warn("refused a connection from uid {} pid {}", cred.uid, cred.pid);
        conn->send_and_close(
            p::make_error_event(nullptr, p::error_code::forbidden, "this user may not use this colibrid"));
        return;
    }
    if (connections_.size() > cfg_.max_connections) {
        logger()->warn("connection limit ({}) reached", cfg_.max_connections);
        conn->send_and_close(p::make_error_event(nullptr, p::error_code::busy, "too many connections"));
        return;
    }
    logger()->debug("client connected (uid {}, pid {})", cred.uid, cred.pid);
    conn->start();
}

void server::on_disconnect(const std::shared_ptr<connection>& conn) {
    if (connections_.erase(conn) == 0) return;
    cancel_jobs(conn);
    conn->stop();
    logger()->debug("client disconnected");
    if (finished_ && connections_.empty() && supervisor_.state() == worker_state::stopped) io_.stop();
}

void server::cancel_jobs(const std::shared_ptr<connection>& conn) {
    auto jobs = std::move(conn->jobs());
    conn->jobs().clear();
    for (auto& [key, j] : jobs) scheduler_.cancel(j, false);
}

void server::handle_line(const std::shared_ptr<connection>& conn, std::string_view line) {
    auto parsed = p::parse_request(line, limits_);
    if (auto* err = std::get_if<p::request_error>(&parsed)) {
        logger()->debug("rejected a request: {} ({})", p::to_string(err->code), err->message);
        conn->send(p::make_error_event(err->id, err->code, err->message));
        return;
    }
    auto& req = std::get<p::request>(parsed);
    std::visit(
        [&](auto& body) {
            using T = std::decay_t<decltype(body)>;
            if constexpr (std::is_same_v<T, p::hello_request>) {
                logger()->debug("hello from '{}'", body.client);
                conn->send(p::make_hello_event(req.id, daemon_version));
            } else if constexpr (std::is_same_v<T, p::health_request>) {
                conn->send(health_event(req.id));
            } else if constexpr (std::is_same_v<T, p::status_request>) {
                conn->send(status_event(req.id));
            } else if constexpr (std::is_same_v<T, p::cancel_request>) {
                handle_cancel(conn, req.id, body.target);
            } else {
                handle_complete(conn, req.id, std::move(body));
            }
        },
        req.body);
}

std::optional<p::request_error> server::submit_job(const std::shared_ptr<job>& j) {
    if (!cfg_.speculative) j->req.speculative = false;
    return scheduler_.submit(j);
}

std::string server::model_name() const {
    if (cfg_.backend == "openai") return cfg_.model.empty() ? "upstream" : cfg_.model;
    std::string name = std::filesystem::path(cfg_.model).filename().string();
    if (const auto dot = name.rfind(".colibri"); dot != std::string::npos && dot + 8 == name.size()) name.resize(dot);
    return name;
}

void server::handle_complete(const std::shared_ptr<connection>& conn, const json& id, p::complete_request req) {
    std::string key = id.dump();
    auto& jobs = conn->jobs();
    if (jobs.count(key)) {
        conn->send(p::make_error_event(id, p::error_code::invalid_request,
                                       "a request with id " + key + " is still in flight on this connection"));
        return;
    }
    if (jobs.size() >= cfg_.max_inflight_per_connection) {
        conn->send(
            p::make_error_event(id, p::error_code::busy,
                                "this connection already has " + std::to_string(jobs.size()) + " unfinished requests"));
        return;
    }
    logger()->debug("complete {}: {} prompt bytes, {} suffix bytes, max_tokens {}", key, req.prompt.size(),
                    req.suffix.size(), req.max_tokens);
    auto j = std::make_shared<job>(io_);
    j->id = id;
    j->key = key;
    j->req = std::move(req);
    j->sink = conn;
    j->owner = conn.get();
    jobs.emplace(key, j);
    if (auto err = submit_job(j)) {
        jobs.erase(key);
        conn->send(p::make_error_event(err->id, err->code, err->message));
    }
}

void server::handle_cancel(const std::shared_ptr<connection>& conn, const json& id, const json& target) {
    auto& jobs = conn->jobs();
    auto it = jobs.find(target.dump());
    const bool found = it != jobs.end();
    if (found) scheduler_.cancel(it->second, true); // sends the target's final line first
    conn->send(p::make_cancel_event(id, target, found));
}

json server::health_event(const json& id) const {
    const worker_state s = supervisor_.state();
    std::string status;
    if (shutting_down_) status = "stopping";
    else if (s == worker_state::ready || s == worker_state::busy) status = "ok";
    else if (s == worker_state::starting) status = "starting";
    else if (s == worker_state::restarting) status = "restarting";
    else if (s == worker_state::unavailable) status = "unavailable";
    else status = "stopping";
    json j = {{"id", id}, {"event", p::event::health}, {"status", status}, {"worker", to_string(s)}};
    if (s == worker_state::unavailable || s == worker_state::restarting)
        j["message"] = "the engine worker failed: " + supervisor_.last_crash_reason();
    if (const json& up = supervisor_.upstream_stats(); up.is_array()) {
        json states = json::array();
        for (const auto& u : up) states.push_back({{"url", u.value("url", "")}, {"state", u.value("state", "")}});
        j["upstreams"] = std::move(states);
    }
    return j;
}

json server::status_event(const json& id) const {
    using namespace std::chrono;
    const auto now = steady_clock::now();
    const auto& st = scheduler_.stats();
    const json& info = supervisor_.model_info();
    json model = info;
    model["path"] = cfg_.model;
    json worker = {{"state", to_string(supervisor_.state())},
                   {"pid", supervisor_.pid() > 0 ? json(supervisor_.pid()) : json(nullptr)},
                   {"restarts", supervisor_.restarts()},
                   {"last_crash_reason",
                    supervisor_.last_crash_reason().empty() ? json(nullptr) : json(supervisor_.last_crash_reason())}};
    if (auto t = supervisor_.last_crash_time()) worker["last_crash_age_s"] = duration<double>(now - *t).count();
    return {
        {"id", id},
        {"event", p::event::status},
        {"protocol", p::protocol_version},
        {"version", daemon_version},
        {"pid", ::getpid()},
        {"uptime_s", duration<double>(now - started_).count()},
        {"model", std::move(model)},
        {"backend", info.value("backend", cfg_.device)},
        {"worker", std::move(worker)},
        {"queue_depth", scheduler_.queue_depth()},
        {"in_flight", scheduler_.in_flight()},
        {"connections", connections_.size()},
        {"http", http_ ? json{{"listen", http_->where()}, {"connections", http_->sessions()}} : json(nullptr)},
        {"requests",
         {{"served", st.served},
          {"cancelled", st.cancelled},
          {"superseded", st.superseded},
          {"timed_out", st.timed_out},
          {"failed", st.failed},
          {"rejected", st.rejected}}},
        {"cache", supervisor_.cache_stats()},
        {"upstreams", supervisor_.upstream_stats()},
        {"tokens",
         {{"generated", st.tokens_generated},
          {"per_second", st.decode_ms > 0 ? st.tokens_generated / (st.decode_ms / 1000.0) : 0.0},
          {"drafted", st.tokens_drafted},
          {"accepted", st.tokens_accepted},
          {"acceptance_rate", st.tokens_drafted > 0 ? double(st.tokens_accepted) / double(st.tokens_drafted) : 0.0}}},
        {"memory",
         {{"daemon_rss_bytes", rss_bytes(0)},
          {"worker_rss_bytes", supervisor_.pid() > 0 ? rss_bytes(supervisor_.pid()) : 0}}}};
}

void server::begin_shutdown(int signo) {
    if (shutting_down_) {
        logger()->info("second signal: stopping now");
        finish_shutdown();
        return;
    }
    shutting_down_ = true;
    logger()->info("signal {}: shutting down ({} requests in flight, grace {} ms)", signo, scheduler_.in_flight(),
                   cfg_.shutdown_grace_ms);
    reporter_.stopping();
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
    listen_.remove_file();
    if (http_) http_->stop(false); // running HTTP completions finish within the grace period
    scheduler_.stop_accepting();
    if (scheduler_.in_flight() == 0) {
        finish_shutdown();
        return;
    }
    scheduler_.on_drained = [this] { asio::post(io_, [this] { finish_shutdown(); }); };
    grace_timer_.expires_after(std::chrono::milliseconds(cfg_.shutdown_grace_ms));
    grace_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) finish_shutdown();
    });
}

void server::finish_shutdown() {
    if (finished_) return;
    finished_ = true;
    grace_timer_.cancel();
    reporter_.stopping();
    wedge_signal_.cancel();
    scheduler_.on_drained = nullptr;
    scheduler_.cancel_all();
    // Close every connection once its last events are written.
    auto conns = connections_;
    for (auto& c : conns)
        c->send_and_close(p::make_error_event(nullptr, p::error_code::unavailable, "the daemon is shutting down"));
    if (http_) http_->stop(true);
    supervisor_.shutdown([this] {
        if (connections_.empty()) io_.stop();
    });
    // Bound the wait for clients that do not read their last lines.
    grace_timer_.expires_after(std::chrono::seconds(3));
    grace_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) io_.stop();
    });
}

} // namespace colibri::daemon
