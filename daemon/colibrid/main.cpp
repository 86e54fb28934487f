// colibrid: the resident completion daemon (front half; the engine runs in colibri-worker).

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "config.hpp"
#include "listen_socket.hpp"
#include "sd_notify.hpp"
#include "server.hpp"

namespace cd = colibri::daemon;

namespace {

void setup_logging(const std::string& level) {
    auto log = spdlog::stderr_color_mt("colibrid");
    // Under journald timestamps are added by the journal itself.
    if (std::getenv("JOURNAL_STREAM")) log->set_pattern("[%n] %l: %v");
    else log->set_pattern("%Y-%m-%d %H:%M:%S.%e [%n] %l: %v");
    log->set_level(spdlog::level::from_str(level));
    spdlog::set_default_logger(log);
}

std::string default_worker_exe() {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return "colibri-worker";
    return (self.parent_path() / "colibri-worker").string();
}

} // namespace

int main(int argc, char** argv) {
    cd::command_line cl;
    try {
        cl = cd::parse_command_line(argc, argv);
    } catch (const cd::config_error& e) {
        std::cerr << "colibrid: " << e.what() << "\nTry 'colibrid --help'.\n";
        return 2;
    }
    if (cl.help) {
        std::cout << cl.help_text;
        return 0;
    }
    if (cl.version) {
        std::cout << cd::daemon_version << " (protocol " << colibri::protocol::protocol_version << ")\n";
        return 0;
    }
    cd::daemon_config& cfg = cl.config;
    if (cfg.log_level != "trace" && cfg.log_level != "debug" && cfg.log_level != "info" && cfg.log_level != "warn" &&
        cfg.log_level != "error" && cfg.log_level != "off") {
        std::cerr << "colibrid: unknown --log-level '" << cfg.log_level << "'\n";
        return 2;
    }
    setup_logging(cfg.log_level);

    struct stat st {};
    if (cfg.backend == "local" &&
        (::stat(cfg.model.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ::access(cfg.model.c_str(), R_OK) != 0)) {
        std::cerr << "colibrid: model file '" << cfg.model << "' is not a readable regular file\n";
        return 1;
    }
    cd::worker_launch launch;
    launch.exe = cfg.worker_exe.empty() ? default_worker_exe() : cfg.worker_exe;
    if (::access(launch.exe.c_str(), X_OK) != 0) {
        std::cerr << "colibrid: worker executable '" << launch.exe << "' is missing or not executable\n";
        return 1;
    }
    launch.args = {"--model",      cfg.model,
                   "--device",     cfg.device,
                   "--gpu-memory", std::to_string(cfg.gpu_memory_mib),
                   "--threads",    std::to_string(cfg.threads),
                   "--slots",      std::to_string(cfg.cache_slots),
                   "--cache-mb",   std::to_string(cfg.cache_memory_mb),
                   "--fim-order",  cfg.fim_order,
                   "--batch",      std::to_string(cfg.prompt_batch)};
    if (cfg.enable_fault_injection) launch.args.push_back("--enable-fault-injection");
    if (cfg.backend == "openai") {
        launch.args.insert(launch.args.end(), {"--backend", "openai"});
        for (const auto& u : cfg.upstreams) launch.args.insert(launch.args.end(), {"--upstream", u});
        if (!cfg.upstream_key_file.empty())
            launch.args.insert(launch.args.end(), {"--upstream-key-file", cfg.upstream_key_file});
        if (!cfg.upstream_ca_file.empty())
            launch.args.insert(launch.args.end(), {"--upstream-ca-file", cfg.upstream_ca_file});
        launch.args.insert(launch.args.end(), {"--upstream-fim", cfg.upstream_fim});
        if (!cfg.upstream_tokenizer.empty())
            launch.args.insert(launch.args.end(), {"--upstream-tokenizer", cfg.upstream_tokenizer});
    }

    ::signal(SIGPIPE, SIG_IGN);
    try {
        std::optional<gid_t> group;
        if (!cfg.socket_group.empty()) group = cd::resolve_group(cfg.socket_group);

        cd::sd_notifier notifier;
        const cd::activated_sockets activated = cd::take_activated_sockets();
        if (!cfg.api_key_file.empty() && cfg.http.empty() && !activated.http) {
            std::cerr << "colibrid: --api-key-file is for HTTP, which is off: give --http, or a socket systemd "
                         "passes as 'http'\nTry 'colibrid --help'.\n";
            return 2;
        }
        auto sock = cd::listen_socket::open(cfg.socket, group, activated.protocol);
        cd::peer_policy policy;
        policy.owner = ::geteuid();
        if (sock.activated()) {
            // The socket unit decided who may connect (SocketMode=, SocketGroup=).
            policy.group = sock.file_group();
            policy.anyone = sock.file_world();
            if (group && group != policy.group)
                spdlog::warn("--socket-group is ignored under socket activation: the socket unit's "
                             "SocketGroup= and SocketMode= decide who may connect");
        } else {
            policy.group = group;
        }
        boost::asio::io_context io;
        cd::server srv(io, cfg, std::move(sock), std::move(launch), policy, notifier, activated.http);
        srv.start();
        io.run();
        spdlog::info("stopped");
    } catch (const cd::startup_error& e) {
        std::cerr << "colibrid: " << e.what() << "\n";
        return 1;
    } catch (const std::exception& e) {
        spdlog::critical("fatal: {}", e.what());
        return 1;
    }
    return 0;
}
