#include "config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <boost/program_options.hpp>

#include "colibri/protocol/transport.hpp"

namespace colibri::daemon {

namespace po = boost::program_options;

namespace {

template <class T>
void require_range(const char* name, T value, T lo, T hi) {
    if (value < lo || value > hi)
        throw config_error(std::string("--") + name + " must be between " + std::to_string(lo) + " and " +
                           std::to_string(hi) + " (got " + std::to_string(value) + ")");
}

} // namespace

std::string default_socket_path() { return protocol::default_socket_path(); }

http_address parse_http_address(const std::string& spec) {
    http_address a;
    if (spec.rfind("unix:", 0) == 0) {
        a.unix_socket = true;
        a.path = spec.substr(5);
        if (a.path.empty() || a.path[0] != '/') throw config_error("--http unix:PATH needs an absolute path");
        return a;
    }
    const auto colon = spec.rfind(':');
    if (colon == std::string::npos) throw config_error("--http must be HOST:PORT or unix:PATH (got '" + spec + "')");
    a.host = spec.substr(0, colon);
    if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']')
        a.host = a.host.substr(1, a.host.size() - 2);
    if (a.host.empty()) throw config_error("--http needs a host, such as 127.0.0.1:8012 (got '" + spec + "')");
    const std::string port = spec.substr(colon + 1);
    try {
        std::size_t used = 0;
        const int n = std::stoi(port, &used);
        if (used != port.size() || n < 1 || n > 65535) throw std::out_of_range("port");
        a.port = static_cast<unsigned short>(n);
    } catch (const std::exception&) {
        throw config_error("--http: bad port '" + port + "'");
    }
    return a;
}

command_line parse_command_line(int argc, const char* const* argv) {
    command_line out;
    daemon_config& c = out.config;
    watchdog_config& w = c.watchdog;
    std::string config_file;

    po::options_description general("General");
    // clang-format off
    general.add_options()
        ("help,h", "print this help and exit")
        ("version", "print the version and exit")
        ("config", po::value(&config_file), "config file (INI: option = value, same names as the flags)")
        ("model", po::value(&c.model), "the .colibri model file (required); with --backend openai, the model "
                                       "name to ask the upstream for (default: its own)")
        ("socket", po::value(&c.socket), "Unix socket path (default: $XDG_RUNTIME_DIR/colibri/colibri.sock, "
                                         "or /tmp/colibri-$UID/colibri.sock when XDG_RUNTIME_DIR is unset)")
        ("socket-group", po::value(&c.socket_group), "group (name or gid) allowed to connect; the socket becomes 0660")
        ("device", po::value(&c.device)->default_value(c.device), "cpu or cuda:N")
        ("gpu-memory", po::value(&c.gpu_memory_mib)->default_value(c.gpu_memory_mib),
         "on a GPU: MiB of device memory for the weights; 0: no limit (routed experts that do not fit are copied in when used)")
        ("threads", po::value(&c.threads)->default_value(c.threads), "engine threads; 0: the CPUs this process may use")
        ("log-level", po::value(&c.log_level)->default_value(c.log_level), "trace, debug, info, warn, error, off");
    // clang-format on

    po::options_description limits("Limits");
    // clang-format off
    limits.add_options()
        ("max-connections", po::value(&c.max_connections)->default_value(c.max_connections), "concurrent client connections")
        ("max-queue", po::value(&c.max_queue)->default_value(c.max_queue), "queued completions before 'busy'")
        ("max-inflight-per-connection", po::value(&c.max_inflight_per_connection)->default_value(c.max_inflight_per_connection), "unfinished completions on one connection")
        ("max-line-bytes", po::value(&c.max_line_bytes)->default_value(c.max_line_bytes), "longest request line")
        ("max-write-buffer-bytes", po::value(&c.max_write_buffer_bytes)->default_value(c.max_write_buffer_bytes), "unsent output before a slow client is dropped")
        ("max-tokens", po::value(&c.max_tokens)->default_value(c.max_tokens), "largest max_tokens a request may ask")
        ("default-timeout-ms", po::value(&c.default_timeout_ms)->default_value(c.default_timeout_ms), "deadline of a request without timeout_ms")
        ("max-timeout-ms", po::value(&c.max_timeout_ms)->default_value(c.max_timeout_ms), "cap on a request's timeout_ms")
        ("shutdown-grace-ms", po::value(&c.shutdown_grace_ms)->default_value(c.shutdown_grace_ms), "on SIGTERM, time to finish in-flight work");
    // clang-format on

    po::options_description cache("Prompt cache");
    // clang-format off
    cache.add_options()
        ("cache-slots", po::value(&c.cache_slots)->default_value(c.cache_slots), "KV caches the worker keeps; a request reuses the one sharing the longest prefix with its prompt")
        ("cache-memory-mb", po::value(&c.cache_memory_mb)->default_value(c.cache_memory_mb), "memory all cached tokens may take; least recently used slots are emptied first")
        ("prompt-batch", po::value(&c.prompt_batch)->default_value(c.prompt_batch), "prompt tokens evaluated at once, 1..4096: larger batches read the weights less often (prefill is faster); a cancelled or superseded completion stops between the layers of a batch")
        ("speculative", po::value(&c.speculative)->default_value(c.speculative),
         "speculative decoding with drafts from the context (the same tokens, fewer steps where a completion "
         "repeats its context); false turns it off for every request, true leaves it to each request's 'speculative'")
        ("fim-order", po::value(&c.fim_order)->default_value(c.fim_order), "fill-in-the-middle prompt order: auto (the order the model file records: spm for Colibri's default model, else psm), psm (prefix, suffix, middle), or spm (suffix first: keeps the cache valid up to the cursor; only for models trained with it, such as StarCoder and CodeLlama)");
    // clang-format on

    po::options_description http("HTTP (llama-server's /infill and /completion, OpenAI's /v1/completions)");
    // clang-format off
    http.add_options()
        ("http", po::value(&c.http), "also answer HTTP on HOST:PORT (such as 127.0.0.1:8012) or unix:PATH; off unless given (or a "
                                     "socket systemd passes as 'http'). An address other machines can reach needs --api-key-file")
        ("api-key-file", po::value(&c.api_key_file), "file holding the key HTTP clients must send (Authorization: Bearer KEY)")
        ("http-timeout-ms", po::value(&c.http_timeout_ms)->default_value(c.http_timeout_ms),
         "time a client may take to send a whole request, and that an idle keep-alive connection stays open");
    // clang-format on

    po::options_description remote(
        "Remote backend (complete on OpenAI-compatible servers: vLLM, SGLang, llama-server)");
    // clang-format off
    remote.add_options()
        ("backend", po::value(&c.backend)->default_value(c.backend), "local (the engine on --model) or openai (forward to --upstream)")
        ("upstream", po::value(&c.upstreams)->composing(), "with --backend openai: a server's URL, http[s]://HOST[:PORT][/PATH]; "
                                                           "repeat for several (load is spread, an unreachable one is skipped and retried later)")
        ("upstream-key-file", po::value(&c.upstream_key_file), "with --backend openai: file holding the Bearer key the servers want")
        ("upstream-ca-file", po::value(&c.upstream_ca_file), "with --backend openai: PEM certificates to trust for https upstreams "
                                                             "(default: the system's)")
        ("upstream-fim", po::value(&c.upstream_fim)->default_value(c.upstream_fim),
         "with --backend openai: fill-in-the-middle by the servers' `suffix` field (suffix), or a prompt built here in the "
         "model's template for servers without it: starcoder, qwen, deepseek, codellama, codestral, or auto (the "
         "template --upstream-tokenizer spells); context files then reach the model too")
        ("upstream-tokenizer", po::value(&c.upstream_tokenizer),
         "with --upstream-fim auto: the served model's tokenizer: its Hugging Face tokenizer.json, or its GGUF file");
    // clang-format on

    po::options_description watchdog("Watchdog");
    // clang-format off
    watchdog.add_options()
        ("ping-interval-ms", po::value(&w.ping_interval_ms)->default_value(w.ping_interval_ms), "worker liveness probe period")
        ("liveness-timeout-ms", po::value(&w.liveness_timeout_ms)->default_value(w.liveness_timeout_ms), "unanswered probe time before the worker is killed")
        ("progress-timeout-ms", po::value(&w.progress_timeout_ms)->default_value(w.progress_timeout_ms), "time a busy worker may go without output")
        ("start-timeout-ms", po::value(&w.start_timeout_ms)->default_value(w.start_timeout_ms), "time a worker may take to load the model")
        ("restart-backoff-ms", po::value(&w.restart_backoff_ms)->default_value(w.restart_backoff_ms), "first restart delay (doubles per consecutive crash)")
        ("restart-backoff-max-ms", po::value(&w.restart_backoff_max_ms)->default_value(w.restart_backoff_max_ms), "largest restart delay")
        ("crash-loop-threshold", po::value(&w.crash_loop_threshold)->default_value(w.crash_loop_threshold), "crashes within the window that make the daemon unavailable")
        ("crash-loop-window-ms", po::value(&w.crash_loop_window_ms)->default_value(w.crash_loop_window_ms), "crash counting window")
        ("crash-loop-retry-ms", po::value(&w.crash_loop_retry_ms)->default_value(w.crash_loop_retry_ms), "time unavailable before the next attempt");
    // clang-format on

    po::options_description advanced("Advanced and testing");
    // clang-format off
    advanced.add_options()
        ("worker-exe", po::value(&c.worker_exe), "worker executable (default: colibri-worker next to colibrid)")
        ("enable-fault-injection", po::bool_switch(&c.enable_fault_injection), "accept the debug_fault request field, and let SIGUSR1 wedge the event loop (tests only)");
    // clang-format on

    po::options_description all("colibrid: the Colibri completion daemon\n\nUsage: colibrid --model FILE [options]");
    all.add(general).add(limits).add(cache).add(http).add(remote).add(watchdog).add(advanced);

    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, all), vm);
        if (vm.count("config")) {
            const std::string path = vm["config"].as<std::string>();
            std::ifstream in(path);
            if (!in) throw config_error("cannot read config file '" + path + "'");
            po::store(po::parse_config_file(in, all), vm);
        }
        po::notify(vm);
    } catch (const po::error& e) {
        throw config_error(e.what());
    }

    std::ostringstream help;
    help << all;
    out.help_text = help.str();
    out.help = vm.count("help") > 0;
    out.version = vm.count("version") > 0;
    if (out.help || out.version) return out;

    if (c.backend != "local" && c.backend != "openai")
        throw config_error("--backend must be 'local' or 'openai' (got '" + c.backend + "')");
    if (c.backend == "local" && c.model.empty()) throw config_error("--model is required");
    if (c.backend == "openai" && c.upstreams.empty()) throw config_error("--backend openai needs --upstream URL");
    if ((c.upstream_fim == "auto") != !c.upstream_tokenizer.empty())
        throw config_error("--upstream-fim auto and --upstream-tokenizer go together");
    if (c.backend == "local" && (!c.upstreams.empty() || !c.upstream_key_file.empty() || !c.upstream_ca_file.empty() ||
                                 c.upstream_fim != "suffix" || !c.upstream_tokenizer.empty()))
        throw config_error("--upstream is for --backend openai");
    if (c.socket.empty()) c.socket = default_socket_path();
    require_range<std::size_t>("max-connections", c.max_connections, 1, 1u << 20);
    require_range<std::size_t>("max-queue", c.max_queue, 1, 1u << 20);
    require_range<std::size_t>("max-inflight-per-connection", c.max_inflight_per_connection, 1, 1u << 16);
    require_range<std::size_t>("max-line-bytes", c.max_line_bytes, 1024, std::size_t{1} << 30);
    require_range<std::size_t>("max-write-buffer-bytes", c.max_write_buffer_bytes, 4096, std::size_t{1} << 32);
    require_range("threads", c.threads, 0, 4096);
    require_range("max-tokens", c.max_tokens, 1, 1 << 24);
    require_range("cache-slots", c.cache_slots, 1, 256);
    require_range("prompt-batch", c.prompt_batch, 1, 4096);
    require_range<std::int64_t>("cache-memory-mb", c.cache_memory_mb, 1, INT64_C(1) << 30);
    require_range<std::int64_t>("max-timeout-ms", c.max_timeout_ms, 1, INT64_C(1) << 40);
    require_range<std::int64_t>("default-timeout-ms", c.default_timeout_ms, 1, c.max_timeout_ms);
    require_range("shutdown-grace-ms", c.shutdown_grace_ms, 0, 3600000);
    require_range("http-timeout-ms", c.http_timeout_ms, 100, 3600000);
    if (!c.http.empty()) parse_http_address(c.http);
    require_range("ping-interval-ms", w.ping_interval_ms, 1, 3600000);
    require_range("liveness-timeout-ms", w.liveness_timeout_ms, 1, 3600000);
    require_range("progress-timeout-ms", w.progress_timeout_ms, 1, 86400000);
    require_range("start-timeout-ms", w.start_timeout_ms, 1, 86400000);
    require_range("restart-backoff-ms", w.restart_backoff_ms, 0, 3600000);
    require_range("restart-backoff-max-ms", w.restart_backoff_max_ms, w.restart_backoff_ms, 3600000);
    require_range("crash-loop-threshold", w.crash_loop_threshold, 1, 1000);
    require_range("crash-loop-window-ms", w.crash_loop_window_ms, 1, 86400000);
    require_range("crash-loop-retry-ms", w.crash_loop_retry_ms, 0, 86400000);
    if (c.fim_order != "auto" && c.fim_order != "psm" && c.fim_order != "spm")
        throw config_error("--fim-order must be 'auto', 'psm' or 'spm' (got '" + c.fim_order + "')");
    if (c.gpu_memory_mib < 0) throw config_error("--gpu-memory must not be negative");
    if (c.device != "cpu" && c.device.rfind("cuda:", 0) != 0)
        throw config_error("--device must be 'cpu' or 'cuda:N' (got '" + c.device + "')");
    return out;
}

} // namespace colibri::daemon
