#pragma once
/// colibrid settings: command line and config file share the same option names.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace colibri::daemon {

/// Watchdog and restart policy of the worker supervisor.
struct watchdog_config {
    int ping_interval_ms = 1000;      ///< liveness probe period
    int liveness_timeout_ms = 5000;   ///< a ping unanswered this long kills the worker
    int progress_timeout_ms = 120000; ///< a busy worker silent this long is killed (timeout);
                                      ///< the worker reports progress between prompt chunks
    int start_timeout_ms = 120000;    ///< spawn to ready
    int restart_backoff_ms = 100;     ///< first restart delay, doubled per consecutive crash
    int restart_backoff_max_ms = 10000;
    int crash_loop_threshold = 5; ///< this many crashes within the window...
    int crash_loop_window_ms = 60000;
    int crash_loop_retry_ms = 30000; ///< ...make the daemon unavailable this long
};

struct daemon_config {
    std::string model;                   ///< local: the .colibri file; openai: the upstream's model name ("" its own)
    std::string backend = "local";       ///< local (the engine) or openai (forwarding to --upstream)
    std::vector<std::string> upstreams;  ///< openai: http://HOST:PORT of each server
    std::string upstream_key_file;       ///< openai: the Bearer key the servers want
    std::string upstream_ca_file;        ///< openai: certificates to trust for https upstreams
    std::string upstream_fim = "suffix"; ///< openai: send `suffix`, or build the FIM prompt in this family's template
    std::string upstream_tokenizer;      ///< openai, upstream_fim auto: the served model's tokenizer.json or GGUF
    std::string socket;                  ///< empty: default_socket_path()
    std::string socket_group;            ///< name or numeric gid; empty: owner only
    std::string device = "cpu";
    int gpu_memory_mib = 0; ///< on a GPU: device memory for the weights (0: no limit)
    int threads = 0;
    std::string log_level = "info";

    int cache_slots = 4;                 ///< KV-cache slots the worker keeps
    std::int64_t cache_memory_mb = 2048; ///< cap on the memory of all slots' cached tokens
    std::string fim_order = "auto";      ///< auto (the model file's), psm, or spm (suffix first) for models trained so
    int prompt_batch = 128;              ///< prompt tokens evaluated at once (cancellation waits for the current batch)
    bool speculative = true;             ///< drafts from the context unless a request turns them off

    std::string http;            ///< HOST:PORT or unix:PATH; empty: no HTTP
    std::string api_key_file;    ///< the Bearer key HTTP clients must send; empty: none
    int http_timeout_ms = 10000; ///< to receive a whole request; also the keep-alive idle time

    std::size_t max_connections = 256;
    std::size_t max_queue = 64;
    std::size_t max_inflight_per_connection = 16;
    std::size_t max_line_bytes = 1u << 20;
    std::size_t max_write_buffer_bytes = 8u << 20;
    int max_tokens = 4096;
    std::int64_t default_timeout_ms = 60000;
    std::int64_t max_timeout_ms = 600000;
    int shutdown_grace_ms = 5000;

    watchdog_config watchdog;

    std::string worker_exe; ///< empty: colibri-worker next to colibrid
    bool enable_fault_injection = false;
};

/// Bad command line or config file; the message is meant for the user.
class config_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Where --http listens.
struct http_address {
    bool unix_socket = false;
    std::string path; ///< unix:PATH
    std::string host; ///< otherwise HOST:PORT ([v6]:PORT)
    unsigned short port = 0;
};

/// Parses --http. Throws config_error.
http_address parse_http_address(const std::string& spec);

/// What parse_command_line decided.
struct command_line {
    daemon_config config;
    bool help = false;
    bool version = false;
    std::string help_text;
};

/// Parses argv and the config file it names (--config). Throws config_error.
command_line parse_command_line(int argc, const char* const* argv);

/// $XDG_RUNTIME_DIR/colibri/colibri.sock, or /tmp/colibri-$UID/colibri.sock when unset.
std::string default_socket_path();

} // namespace colibri::daemon
