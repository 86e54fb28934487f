// End-to-end: the socket's life cycle: permissions, single instance, stale sockets,
// socket activation, graceful shutdown.

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "harness.hpp"

using namespace colibri::test;

namespace {

/// A socket file with nobody listening: what a killed daemon leaves behind.
void make_stale_socket(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(fd);
}

int listening_socket(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    return fd;
}

} // namespace

TEST_CASE("socket 0600 in a new 0700 directory") {
    daemon_process d;
    struct stat st {};
    REQUIRE(::stat(d.socket_path().c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
    REQUIRE(::stat((d.dir() + "/run").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("socket group mode: 0660 with the group") {
    daemon_process d(daemon_process::options{{"--socket-group", "0"}});
    struct stat st {};
    REQUIRE(::stat(d.socket_path().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0660);
    CHECK(st.st_gid == 0);
}

TEST_CASE("a second daemon on the same path refuses to start and the first keeps serving") {
    daemon_process d;
    auto r = run_command(
        {COLIBRID_EXE, "--model", d.model_path(), "--socket", d.socket_path(), "--worker-exe", COLIBRI_TEST_WORKER_EXE},
        std::chrono::seconds(10));
    CHECK(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 1);
    CHECK(r.err.find("refusing to take over") != std::string::npos);
    CHECK(r.err.find(std::to_string(d.pid())) != std::string::npos);
    client c(d.socket_path());
    CHECK(c.call({{"id", 1}, {"op", "health"}})["status"] == "ok");
}

TEST_CASE("a stale socket file from a dead daemon is replaced") {
    temp_dir dir;
    const std::string path = dir.path() + "/stale.sock";
    make_stale_socket(path);
    daemon_process d(daemon_process::options{{"--socket", path}});
    client c(path);
    CHECK(c.call({{"id", 1}, {"op", "health"}})["status"] == "ok");
}

TEST_CASE("a live server without the lock (another program) is not hijacked") {
    temp_dir dir;
    const std::string path = dir.path() + "/live.sock";
    const int fd = listening_socket(path);
    auto r = run_command(
        {COLIBRID_EXE, "--model", "/proc/self/exe", "--socket", path, "--worker-exe", COLIBRI_TEST_WORKER_EXE},
        std::chrono::seconds(10));
    ::close(fd);
    CHECK(WEXITSTATUS(r.status) == 1);
    CHECK(r.err.find("already listening") != std::string::npos);
}

TEST_CASE("socket activation: serves on an inherited listening socket (LISTEN_FDS)") {
    temp_dir dir;
    const std::string path = dir.path() + "/activated.sock";
    const int fd = listening_socket(path);
    {
        daemon_process d({}, true, "fake model\n", fd);
        client c(path);
        CHECK(c.call({{"id", 1}, {"op", "health"}})["status"] == "ok");
        auto status = d.stop(SIGTERM);
        REQUIRE(status.has_value());
        CHECK(WIFEXITED(*status));
        CHECK(WEXITSTATUS(*status) == 0);
    }
    ::close(fd);
    // The socket belongs to systemd: the daemon must not remove it.
    CHECK(std::filesystem::exists(path));
}

TEST_CASE("SIGTERM: in-flight work finishes - the socket is removed - exit 0") {
    daemon_process d;
    client c(d.socket_path());
    json slow = complete_request("w", "finish me", 20, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 10}};
    c.send(slow);
    REQUIRE(c.next().has_value()); // running
    ::kill(d.pid(), SIGTERM);
    auto events = c.until_final("w");
    CHECK(events.back()["event"] == "done");
    CHECK(events.back()["finish_reason"] == "length");
    CHECK(concat_pieces(events).size() > 0);
    auto status = d.wait_exit(std::chrono::seconds(10));
    REQUIRE(status.has_value());
    CHECK(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 0);
    CHECK_FALSE(std::filesystem::exists(d.socket_path()));
}

TEST_CASE("SIGTERM: work beyond the grace period is cancelled") {
    daemon_process d(daemon_process::options{{"--shutdown-grace-ms", "200"}});
    client c(d.socket_path());
    json slow = complete_request("w", "too long", 2000, 1);
    slow["debug_fault"] = {{"kind", "slow"}, {"delay_ms", 10}};
    c.send(slow);
    REQUIRE(c.next().has_value());
    ::kill(d.pid(), SIGTERM);
    auto events = c.until_final("w", std::chrono::seconds(5));
    CHECK(events.back()["event"] == "done");
    CHECK(events.back()["finish_reason"] == "cancelled");
    auto status = d.wait_exit(std::chrono::seconds(10));
    REQUIRE(status.has_value());
    CHECK(WEXITSTATUS(*status) == 0);
}

TEST_CASE("a flood of idle connections beyond the limit is refused with busy - others still served") {
    daemon_process d(daemon_process::options{{"--max-connections", "8"}});
    std::vector<std::unique_ptr<client>> idle;
    for (int i = 0; i < 7; ++i) idle.push_back(std::make_unique<client>(d.socket_path()));
    client c(d.socket_path()); // the 8th: within the limit
    client extra(d.socket_path());
    auto ev = extra.next();
    REQUIRE(ev.has_value());
    CHECK((*ev)["code"] == "busy");
    CHECK(extra.wait_closed());
    CHECK(c.call({{"id", 1}, {"op", "health"}})["status"] == "ok");
}
