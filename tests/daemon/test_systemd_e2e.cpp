// End-to-end: colibrid under systemd's protocols, without systemd itself: notifications
// on a datagram socket the test owns (NOTIFY_SOCKET, WATCHDOG_USEC), socket activation
// through systemd-socket-activate, and a wedged event loop that stops the watchdog pings.

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <thread>

#include "colibri/protocol/messages.hpp"
#include "fake_generator.hpp"
#include "harness.hpp"

using namespace colibri::test;
using namespace std::chrono_literals;

namespace {

bool has(const std::string& msg, const std::string& line) {
    const auto at = msg.find(line);
    return at != std::string::npos && (at == 0 || msg[at - 1] == '\n');
}

/// Index of the first notification carrying `line`, or -1.
int first_index(const std::vector<std::string>& msgs, const std::string& line) {
    for (std::size_t i = 0; i < msgs.size(); ++i)
        if (has(msgs[i], line)) return static_cast<int>(i);
    return -1;
}

int count_of(const std::vector<std::string>& msgs, const std::string& line) {
    return static_cast<int>(
        std::count_if(msgs.begin(), msgs.end(), [&](const std::string& m) { return has(m, line); }));
}

/// Reads notifications for `duration`; returns those received.
std::vector<std::string> collect(daemon_process& d, std::chrono::milliseconds duration) {
    std::vector<std::string> got;
    const auto end = std::chrono::steady_clock::now() + duration;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
        if (left <= 0ms) return got;
        if (auto m = d.next_notification(left)) got.push_back(*m);
    }
}

/// Waits for a notification carrying `line`.
bool wait_for(daemon_process& d, const std::string& line, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
        if (left <= 0ms) return false;
        if (auto m = d.next_notification(left); m && has(*m, line)) return true;
    }
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A 200 ms watchdog: colibrid pings every 100 ms.
const daemon_process::launch_options watchdog_200ms{{"WATCHDOG_USEC=200000", "WATCHDOG_PID=$PID"}, {}};

} // namespace

TEST_CASE("notify: STATUS while loading - READY=1 - WATCHDOG=1 pings - STATUS with counts - STOPPING=1") {
    daemon_process d({}, false, "fake model\n", -1, watchdog_200ms);
    REQUIRE(d.wait_ready());
    {
        client c(d.socket_path());
        c.send(complete_request("a", "count me", 4, 1));
        CHECK(c.until_final("a").back()["event"] == "done");
    }
    REQUIRE(
        wait_for(d, "STATUS=serving " + d.model_path() + " (fake none, cpu); 1 request served, 0 worker restarts", 3s));
    collect(d, 500ms);
    REQUIRE(d.stop(SIGTERM).has_value());
    while (d.next_notification(100ms)) {}
    const auto& msgs = d.notifications();
    INFO("notifications: " << nlohmann::json(msgs).dump());

    const int loading = first_index(msgs, "STATUS=loading model " + d.model_path());
    const int ready = first_index(msgs, "READY=1");
    const int stopping = first_index(msgs, "STOPPING=1");
    REQUIRE(loading >= 0);
    REQUIRE(ready >= 0);
    REQUIRE(stopping >= 0);
    CHECK(loading < ready);
    CHECK(ready < stopping);
    CHECK(count_of(msgs, "READY=1") == 1);
    CHECK(count_of(msgs, "STOPPING=1") == 1);
    // READY=1 comes with what the daemon serves: the worker has loaded the model.
    CHECK(has(msgs[static_cast<std::size_t>(ready)], "STATUS=serving " + d.model_path()));
    CHECK(msgs[static_cast<std::size_t>(stopping)].find("STATUS=shutting down") != std::string::npos);
    // Pings while serving (100 ms apart over more than 500 ms), none after STOPPING=1.
    int pings_while_serving = 0, pings_after_stop = 0;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
        if (msgs[i] != "WATCHDOG=1") continue;
        if (static_cast<int>(i) > ready && static_cast<int>(i) < stopping) ++pings_while_serving;
        if (static_cast<int>(i) > stopping) ++pings_after_stop;
    }
    CHECK(pings_while_serving >= 4);
    CHECK(pings_after_stop == 0);
}

TEST_CASE("notify: worker restarts show in STATUS") {
    daemon_process d({}, true, "fake model\n", -1, watchdog_200ms);
    client c(d.socket_path());
    json req = complete_request("x", "crash", 10, 1);
    req["debug_fault"] = {{"kind", "crash"}, {"after_tokens", 0}};
    c.send(req);
    CHECK(c.until_final("x").back()["code"] == "worker_crashed");
    CHECK(
        wait_for(d, "STATUS=serving " + d.model_path() + " (fake none, cpu); 0 requests served, 1 worker restart", 3s));
    const auto& msgs = d.notifications();
    INFO("notifications: " << nlohmann::json(msgs).dump());
    CHECK(std::any_of(msgs.begin(), msgs.end(), [](const std::string& m) {
        return m.find("STATUS=worker failed (killed by signal 11 (SIGSEGV)), restarting") != std::string::npos;
    }));
}

TEST_CASE("notify: a model that cannot load still gives READY=1 with the reason in STATUS") {
    daemon_process d({{"--crash-loop-threshold", "2"}, {"--crash-loop-retry-ms", "60000"}}, false, "fail: corrupt\n");
    REQUIRE(d.wait_ready());
    const auto& msgs = d.notifications();
    INFO("notifications: " << nlohmann::json(msgs).dump());
    const auto& ready = msgs.back();
    CHECK(has(ready, "READY=1"));
    CHECK(ready.find("STATUS=unavailable: the worker keeps failing (cannot load model") != std::string::npos);
    CHECK(ready.find("corrupt") != std::string::npos);
}

TEST_CASE("notify: no pings without WATCHDOG_USEC - or when WATCHDOG_PID names another process") {
    daemon_process plain;
    daemon_process other({}, true, "fake model\n", -1, {{"WATCHDOG_USEC=100000", "WATCHDOG_PID=1"}, {}});
    collect(plain, 400ms);
    collect(other, 400ms);
    CHECK(count_of(plain.notifications(), "WATCHDOG=1") == 0);
    CHECK(count_of(other.notifications(), "WATCHDOG=1") == 0);
    CHECK(other.log().find("systemd watchdog") == std::string::npos);
}

TEST_CASE("notify: the worker inherits neither NOTIFY_SOCKET nor WATCHDOG_USEC") {
    daemon_process d({}, true, "fake model\n", -1, watchdog_200ms);
    client c(d.socket_path());
    const int worker = c.call({{"id", "s"}, {"op", "status"}})["worker"]["pid"].get<int>();
    const std::string daemon_env = read_file("/proc/" + std::to_string(d.pid()) + "/environ");
    const std::string worker_env = read_file("/proc/" + std::to_string(worker) + "/environ");
    CHECK(daemon_env.find("NOTIFY_SOCKET=") != std::string::npos);
    REQUIRE_FALSE(worker_env.empty());
    CHECK(worker_env.find("NOTIFY_SOCKET=") == std::string::npos);
    CHECK(worker_env.find("WATCHDOG_USEC=") == std::string::npos);
    CHECK(worker_env.find("WATCHDOG_PID=") == std::string::npos);
}

TEST_CASE("watchdog: a wedged event loop stops pinging (fault injection)") {
    daemon_process d({}, true, "fake model\n", -1, watchdog_200ms);
    REQUIRE(count_of(collect(d, 500ms), "WATCHDOG=1") >= 3);
    REQUIRE(::kill(d.pid(), SIGUSR1) == 0);
    // Give the signal a moment to be handled, then listen: silence.
    collect(d, 200ms);
    const auto after = collect(d, 1000ms);
    CHECK(count_of(after, "WATCHDOG=1") == 0);
    CHECK(d.log().find("fault injection: SIGUSR1 wedges the event loop") != std::string::npos);
    // A wedged daemon answers nobody.
    client c(d.socket_path());
    c.send({{"id", 1}, {"op", "health"}});
    CHECK_THROWS_AS(c.next(300ms), std::runtime_error);
    // What systemd's watchdog does next (SIGABRT by default; SIGKILL here, no core file).
    auto status = d.stop(SIGKILL, 5s);
    REQUIRE(status.has_value());
    CHECK(WIFSIGNALED(*status));
}

TEST_CASE("watchdog: SIGUSR1 does not wedge a daemon without fault injection") {
    daemon_process d({{"--enable-fault-injection", "<remove>"}}, true, "fake model\n", -1, watchdog_200ms);
    // Without the flag SIGUSR1 keeps its default action: it ends the daemon, it never
    // leaves a silent process behind.
    REQUIRE(::kill(d.pid(), SIGUSR1) == 0);
    auto status = d.wait_exit(5s);
    REQUIRE(status.has_value());
    CHECK(WIFSIGNALED(*status));
    CHECK(WTERMSIG(*status) == SIGUSR1);
}

TEST_CASE("socket activation with systemd-socket-activate: started by the first client - which completes") {
    REQUIRE_MESSAGE(std::string(COLIBRI_SOCKET_ACTIVATE_EXE) != "",
                    "systemd-socket-activate not found: install Debian's systemd package (scripts/deps)");
    temp_dir dir;
    const std::string path = dir.path() + "/activated.sock";
    daemon_process d({{"--socket", path}}, false, "fake model\n", -1,
                     {{}, {COLIBRI_SOCKET_ACTIVATE_EXE, "--listen=" + path, "--setenv=NOTIFY_SOCKET"}});
    // systemd-socket-activate listens; colibrid is not started until someone connects.
    for (int i = 0; i < 200 && ::access(path.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(::access(path.c_str(), F_OK) == 0);
    CHECK_FALSE(d.next_notification(200ms).has_value());

    auto r = run_command({COLIBRI_CLIENT_EXE, "--socket", path, "--max_tokens", "12", "--seed", "5", "def f(x):"}, 10s);
    CHECK(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 0);
    CHECK(r.out == fake_text("def f(x):", 12, 5));
    REQUIRE(d.wait_ready());
    CHECK(d.log().find("listening on " + path + " (socket activation)") != std::string::npos);

    client c(path);
    CHECK(c.call({{"id", 1}, {"op", "health"}})["status"] == "ok");
    c.close();
    auto status = d.stop(SIGTERM);
    REQUIRE(status.has_value());
    CHECK(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 0);
}

TEST_CASE("socket activation of HTTP too: the socket named 'http' is the HTTP front's") {
    REQUIRE_MESSAGE(std::string(COLIBRI_SOCKET_ACTIVATE_EXE) != "",
                    "systemd-socket-activate not found: install Debian's systemd package (scripts/deps)");
    temp_dir dir;
    const std::string path = dir.path() + "/activated.sock", http = dir.path() + "/http.sock";
    daemon_process d({{"--socket", path}}, false, "fake model\n", -1,
                     {{},
                      {COLIBRI_SOCKET_ACTIVATE_EXE, "--listen=" + path, "--listen=" + http,
                       "--fdname=colibrid.socket:http", "--setenv=NOTIFY_SOCKET"}});
    for (int i = 0; i < 200 && ::access(http.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(::access(http.c_str(), F_OK) == 0);
    // The first HTTP request starts colibrid, which takes both sockets.
    const auto r = http_call(http, "POST", "/completion", R"({"prompt":"def f(x):","n_predict":12,"seed":5})", {}, 10s);
    CHECK(r.status == 200);
    CHECK(r.json_body()["content"] == fake_text("def f(x):", 12, 5));
    REQUIRE(d.wait_ready());
    client c(path);
    const json status = c.call({{"id", 1}, {"op", "status"}});
    CHECK(status["http"]["listen"] == "unix:" + http);
    c.close();
    auto exit = d.stop(SIGTERM);
    REQUIRE(exit.has_value());
    CHECK(WIFEXITED(*exit));
    CHECK(WEXITSTATUS(*exit) == 0);
    CHECK(::access(http.c_str(), F_OK) == 0); // systemd's socket: colibrid leaves it in place
}

TEST_CASE("socket activation of HTTP with an API key and no --http: the key guards the socket systemd passes") {
    REQUIRE_MESSAGE(std::string(COLIBRI_SOCKET_ACTIVATE_EXE) != "",
                    "systemd-socket-activate not found: install Debian's systemd package (scripts/deps)");
    temp_dir dir;
    const std::string path = dir.path() + "/activated.sock", http = dir.path() + "/http.sock";
    const std::string key_file = dir.path() + "/key";
    std::ofstream(key_file) << "s3cret-key\n";
    daemon_process d({{"--socket", path}, {"--api-key-file", key_file}}, false, "fake model\n", -1,
                     {{},
                      {COLIBRI_SOCKET_ACTIVATE_EXE, "--listen=" + path, "--listen=" + http,
                       "--fdname=colibrid.socket:http", "--setenv=NOTIFY_SOCKET"}});
    for (int i = 0; i < 200 && ::access(http.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(::access(http.c_str(), F_OK) == 0);
    const std::string body = R"({"prompt":"def f(x):","n_predict":12,"seed":5})";
    CHECK(http_call(http, "POST", "/completion", body, {}, 10s).status == 401);
    const auto r = http_call(http, "POST", "/completion", body, {"Authorization: Bearer s3cret-key"}, 10s);
    CHECK(r.status == 200);
    CHECK(r.json_body()["content"] == fake_text("def f(x):", 12, 5));
    auto exit = d.stop(SIGTERM);
    REQUIRE(exit.has_value());
    CHECK(WIFEXITED(*exit));
    CHECK(WEXITSTATUS(*exit) == 0);
}
