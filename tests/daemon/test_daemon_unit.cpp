#include <doctest/doctest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "config.hpp"
#include "harness.hpp"
#include "listen_socket.hpp"
#include "sd_notify.hpp"
#include "worker_process.hpp"

namespace cd = colibri::daemon;

namespace {

cd::command_line parse(std::vector<std::string> args) {
    args.insert(args.begin(), "colibrid");
    std::vector<const char*> argv;
    for (auto& a : args) argv.push_back(a.c_str());
    return cd::parse_command_line(static_cast<int>(argv.size()), argv.data());
}

} // namespace

TEST_CASE("command line: defaults and overrides") {
    auto cl = parse({"--model", "m.colibri", "--socket", "/tmp/x.sock", "--threads", "3", "--device", "cuda:1",
                     "--max-queue", "7", "--progress-timeout-ms", "1500"});
    CHECK_FALSE(cl.help);
    CHECK(cl.config.model == "m.colibri");
    CHECK(cl.config.socket == "/tmp/x.sock");
    CHECK(cl.config.threads == 3);
    CHECK(cl.config.device == "cuda:1");
    CHECK(cl.config.max_queue == 7);
    CHECK(cl.config.watchdog.progress_timeout_ms == 1500);
    CHECK(cl.config.watchdog.ping_interval_ms == 1000);
    CHECK(cl.config.max_line_bytes == (1u << 20));
    CHECK_FALSE(cl.config.enable_fault_injection);
    CHECK(cl.config.fim_order == "auto");
    CHECK(cl.config.prompt_batch == 128);
    CHECK(parse({"--model", "m", "--prompt-batch", "32"}).config.prompt_batch == 32);
    CHECK(cl.config.gpu_memory_mib == 0);
    CHECK(parse({"--model", "m", "--gpu-memory", "20480"}).config.gpu_memory_mib == 20480);
}

TEST_CASE("command line: errors are config_error with the option's name") {
    CHECK_THROWS_WITH_AS(parse({}), doctest::Contains("--model"), cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--threads", "lots"}), doctest::Contains("threads"), cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--device", "tpu"}), doctest::Contains("device"), cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--gpu-memory", "-1"}), doctest::Contains("gpu-memory"),
                         cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--max-queue", "0"}), doctest::Contains("max-queue"), cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--default-timeout-ms", "9", "--max-timeout-ms", "5"}),
                         doctest::Contains("default-timeout-ms"), cd::config_error);
    CHECK_THROWS_AS(parse({"--model", "m", "--no-such-flag"}), cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--fim-order", "middle"}), doctest::Contains("'auto', 'psm' or 'spm'"),
                         cd::config_error);
    CHECK(parse({"--model", "m", "--fim-order", "spm"}).config.fim_order == "spm");
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--prompt-batch", "0"}), doctest::Contains("prompt-batch"),
                         cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--prompt-batch", "4097"}), doctest::Contains("prompt-batch"),
                         cd::config_error);
    CHECK(parse({"--help"}).help);
    CHECK(parse({"--help"}).help_text.find("--progress-timeout-ms") != std::string::npos);
}

TEST_CASE("config file uses the flag names - the command line wins") {
    colibri::test::temp_dir dir;
    const std::string path = dir.path() + "/colibrid.conf";
    std::ofstream(path) << "# comment\nmodel = /models/a.colibri\nthreads = 6\nmax-queue = 9\n"
                           "crash-loop-threshold = 2\n";
    auto cl = parse({"--config", path, "--threads", "2"});
    CHECK(cl.config.model == "/models/a.colibri");
    CHECK(cl.config.threads == 2);
    CHECK(cl.config.max_queue == 9);
    CHECK(cl.config.watchdog.crash_loop_threshold == 2);
    CHECK_THROWS_WITH_AS(parse({"--config", dir.path() + "/missing.conf"}), doctest::Contains("missing.conf"),
                         cd::config_error);
    std::ofstream(path) << "model = m\nbogus = 1\n";
    CHECK_THROWS_AS(parse({"--config", path}), cd::config_error);
}

TEST_CASE("default socket path follows XDG_RUNTIME_DIR - else /tmp/colibri-UID") {
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    const std::string saved = old ? old : "";
    ::setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    CHECK(cd::default_socket_path() == "/run/user/1234/colibri/colibri.sock");
    ::unsetenv("XDG_RUNTIME_DIR");
    CHECK(cd::default_socket_path() == "/tmp/colibri-" + std::to_string(::getuid()) + "/colibri.sock");
    if (old) ::setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST_CASE("peer policy: owner - root - and the configured group") {
    cd::peer_policy owner_only{1000, std::nullopt};
    CHECK(cd::peer_allowed(1000, 1000, {}, owner_only));
    CHECK(cd::peer_allowed(0, 0, {}, owner_only));
    CHECK_FALSE(cd::peer_allowed(1001, 1000, {1000}, owner_only));

    cd::peer_policy with_group{1000, gid_t{2000}};
    CHECK(cd::peer_allowed(1001, 2000, {}, with_group));        // primary group
    CHECK(cd::peer_allowed(1001, 1001, {5, 2000}, with_group)); // supplementary group
    CHECK_FALSE(cd::peer_allowed(1001, 1001, {5, 6}, with_group));

    cd::peer_policy world{1000, std::nullopt, true}; // an activated socket with mode 0666
    CHECK(cd::peer_allowed(1001, 1001, {}, world));
}

TEST_CASE("resolve_group accepts names and numbers") {
    CHECK(cd::resolve_group("0") == 0);
    CHECK(cd::resolve_group("root") == 0);
    CHECK_THROWS_AS(cd::resolve_group("no-such-group-colibri"), cd::startup_error);
}

TEST_CASE("exit statuses are described with the signal name") {
    CHECK(cd::describe_exit_status(W_EXITCODE(3, 0)) == "exited with status 3");
    CHECK(cd::describe_exit_status(W_EXITCODE(0, SIGSEGV)) == "killed by signal 11 (SIGSEGV)");
    CHECK(cd::describe_exit_status(W_EXITCODE(0, SIGKILL)) == "killed by signal 9 (SIGKILL)");
}

TEST_CASE("listen_socket refuses a path that is not a socket and a path too long") {
    colibri::test::temp_dir dir;
    const std::string path = dir.path() + "/file";
    std::ofstream(path) << "x";
    CHECK_THROWS_WITH_AS(cd::listen_socket::open(path, std::nullopt), doctest::Contains("not a socket"),
                         cd::startup_error);
    CHECK_THROWS_WITH_AS(cd::listen_socket::open(dir.path() + "/" + std::string(120, 'a'), std::nullopt),
                         doctest::Contains("longer than"), cd::startup_error);
}

TEST_CASE("the example config file parses and sets the model") {
    auto cl = parse({"--config", std::string(COLIBRI_SOURCE_DIR) + "/daemon/colibrid.conf.example"});
    CHECK(cl.config.model == "/var/lib/colibri/model.colibri");
    CHECK(cl.config.watchdog.progress_timeout_ms == 120000);
}

#include "slot_policy.hpp"

namespace cw = colibri::worker;

TEST_CASE("slot choice: the longest reusable prefix wins when it covers half the slot") {
    // slot 0: 100 cached, 80 reusable; slot 1: 400 cached, 150 reusable (< half); slot 2: empty
    std::vector<cw::slot_state> s = {{100, 80, 5}, {400, 150, 9}, {0, 0, 0}};
    CHECK(cw::choose_slot(s) == 0);
    s[0].reusable = 10; // no slot mostly about this prompt: an empty one
    CHECK(cw::choose_slot(s) == 2);
    s[2] = {50, 0, 1}; // none empty: the least recently used
    CHECK(cw::choose_slot(s) == 2);
    s[1].reusable = 200; // exactly half
    CHECK(cw::choose_slot(s) == 1);
    std::vector<cw::slot_state> tie = {{10, 8, 3}, {10, 8, 7}};
    CHECK(cw::choose_slot(tie) == 1); // most recently used of equals
}

TEST_CASE("slot choice: the request's own session keeps its slot even when it reuses less than half") {
    // a short prefix before a long suffix: each keystroke reuses only the prefix
    std::vector<cw::slot_state> s = {{74, 20, 5, true}, {0, 0, 0, false}};
    CHECK(cw::choose_slot(s) == 0);
    s[0].same_session = false; // another buffer's slot is kept for it
    CHECK(cw::choose_slot(s) == 1);
    s = {{74, 20, 5, true}, {100, 60, 2, false}}; // a longer reuse elsewhere still wins
    CHECK(cw::choose_slot(s) == 1);
}

TEST_CASE("eviction under the memory cap: least recently used first - only what is needed") {
    const std::vector<cw::slot_state> s = {{100, 0, 5}, {100, 0, 2}, {100, 0, 9}, {0, 0, 0}};
    // 100 bytes per token; chosen slot 3 needs 150 tokens
    CHECK(cw::slots_to_evict(s, 3, 150, 100, 45000).empty());                        // 450 tokens fit
    CHECK(cw::slots_to_evict(s, 3, 150, 100, 40000) == std::vector<std::size_t>{1}); // oldest first
    CHECK(cw::slots_to_evict(s, 3, 150, 100, 25000) == std::vector<std::size_t>{1, 0});
    CHECK(cw::slots_to_evict(s, 3, 150, 100, 100) == std::vector<std::size_t>{1, 0, 2}); // all others
    CHECK(cw::slots_to_evict(s, 0, 150, 100, 25000) == std::vector<std::size_t>{1});     // never the chosen one
}

TEST_CASE("sd_notifier never blocks when nobody reads the notify socket") {
    colibri::test::temp_dir dir;
    const std::string path = dir.path() + "/notify";
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
    cd::sd_notifier notifier;
    ::unsetenv("NOTIFY_SOCKET");
    REQUIRE(notifier.enabled());
    CHECK(notifier.notify("STATUS=first"));
    char buf[64] = {};
    CHECK(::recv(fd, buf, sizeof(buf) - 1, 0) == 12);
    CHECK(std::string(buf) == "STATUS=first");
    // Far more than the receive queue holds: the surplus is dropped, nothing waits.
    const auto start = std::chrono::steady_clock::now();
    int sent = 0;
    for (int i = 0; i < 5000; ++i) sent += notifier.notify("WATCHDOG=1") ? 1 : 0;
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
    CHECK(sent > 0);
    CHECK(sent < 5000);
    ::close(fd);
}

TEST_CASE("sd_notifier: watchdog only for this process - half the period") {
    ::setenv("WATCHDOG_USEC", "3000000", 1);
    ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
    {
        cd::sd_notifier mine;
        REQUIRE(mine.watchdog_interval().has_value());
        CHECK(mine.watchdog_interval()->count() == 1500000);
        CHECK_FALSE(mine.enabled());
    }
    ::setenv("WATCHDOG_USEC", "3000000", 1);
    ::setenv("WATCHDOG_PID", "1", 1);
    {
        cd::sd_notifier other;
        CHECK_FALSE(other.watchdog_interval().has_value());
    }
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("WATCHDOG_PID");
}

TEST_CASE("command line: the remote backend needs upstreams, and --model becomes optional") {
    auto cl = parse({"--backend", "openai", "--upstream", "http://a:8000", "--upstream", "http://b:8000"});
    CHECK(cl.config.backend == "openai");
    CHECK(cl.config.upstreams == std::vector<std::string>{"http://a:8000", "http://b:8000"});
    CHECK(cl.config.model.empty());
    CHECK_THROWS_WITH_AS(parse({"--backend", "openai"}), doctest::Contains("--upstream"), cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--upstream", "http://a:8000"}), doctest::Contains("--backend openai"),
                         cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--backend", "remote", "--upstream", "http://a:8000"}), doctest::Contains("--backend"),
                         cd::config_error);
    CHECK_THROWS_WITH_AS(parse({"--model", "m", "--http", "8012"}), doctest::Contains("--http"), cd::config_error);
    // a key file without --http is checked at start, where a socket systemd passes as 'http' counts too
    CHECK(parse({"--model", "m", "--api-key-file", "k"}).config.api_key_file == "k");
}
