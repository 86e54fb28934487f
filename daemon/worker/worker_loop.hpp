#pragma once
/// The worker process's side of the supervisor link, independent of the engine: reads
/// framed messages on an inherited descriptor, runs one job at a time through a
/// `generator`, streams pieces back, answers liveness pings from a reader thread (so a
/// long prefill still looks alive), and applies test-only fault injection.

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "colibri/protocol/errors.hpp"
#include "colibri/protocol/worker_messages.hpp"

namespace colibri::worker {

/// Receives the pieces of one completion.
class piece_sink {
public:
    /// Returns false to stop generation.
    virtual bool piece(std::string_view text) = 0;
    /// true once the job should stop (cancel, deadline, supervisor gone).
    virtual bool cancelled() const = 0;
    /// Called where a generator can between pieces (between prompt chunks): tells the
    /// supervisor's watchdog the job is alive. Returns true when the job should stop.
    virtual bool poll() = 0;

protected:
    ~piece_sink() = default;
};

/// The engine's device failed (a CUDA error): its state is lost. The worker answers the
/// request with the error, tells the supervisor why it is going, and exits with
/// exit_device_failure; the supervisor starts a fresh worker.
class device_failure : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};
inline constexpr int exit_device_failure = 4;

/// A job failed but the worker remains usable (bad argument, prompt too long, ...).
class generate_error : public std::runtime_error {
public:
    generate_error(protocol::error_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
    protocol::error_code code() const noexcept { return code_; }

private:
    protocol::error_code code_;
};

/// What the worker runs: the engine, or a fake in tests.
class generator {
public:
    struct result {
        protocol::finish_reason reason = protocol::finish_reason::stop;
        protocol::usage tokens;
        double prefill_ms = 0;
        double decode_ms = 0;
    };

    virtual ~generator() = default;
    /// Model description for the status op (architecture, backend, n_ctx, ...).
    virtual nlohmann::json info() const = 0;
    /// Runs one completion; throws generate_error when it cannot.
    virtual result generate(const protocol::worker::run_msg& job, piece_sink& sink) = 0;
    /// Prompt-cache counters for the status op (null: the generator keeps no cache).
    virtual nlohmann::json cache_stats() const { return nullptr; }
    /// The upstreams' state for health and status (null: the generator forwards nowhere).
    virtual nlohmann::json upstream_stats() const { return nullptr; }
};

struct worker_options {
    int fd = -1;
    std::string model;
    std::string device = "cpu";
    int gpu_memory_mib = 0; ///< on a GPU: device memory for the weights (0: no limit)
    int threads = 0;
    int slots = 4;                ///< KV-cache slots
    std::int64_t cache_mb = 2048; ///< cap on the memory of all slots' cached tokens
    int fim_spm = -1;             ///< FIM prompts suffix first: 1, 0, or -1 for the model file's order
    int batch = 0;                ///< prompt tokens evaluated at once (0: the engine's default)
    bool fault_injection = false;
    std::string backend = "local";       ///< local (the engine on `model`) or openai (forwarding)
    std::vector<std::string> upstreams;  ///< openai: the servers' URLs
    std::string upstream_key_file;       ///< openai: their Bearer key
    std::string upstream_ca_file;        ///< openai: certificates to trust for https (default: the system's)
    std::string upstream_fim = "suffix"; ///< openai: send `suffix`, or build the prompt in this FIM family's template
    std::string upstream_tokenizer;      ///< openai, upstream_fim auto: the served model's tokenizer.json or GGUF
};

/// Parses `--fd N --model FILE [--device D] [--gpu-memory MIB] [--threads N] [--slots N] [--cache-mb N]
/// [--fim-order psm|spm] [--batch N] [--enable-fault-injection]
/// [--backend local|openai] [--upstream URL ...] [--upstream-key-file F] [--upstream-ca-file F]
/// [--upstream-fim suffix|auto|FAMILY] [--upstream-tokenizer tokenizer.json|GGUF]`.
/// Throws std::invalid_argument.
worker_options parse_worker_args(int argc, const char* const* argv);

using generator_factory = std::function<std::unique_ptr<generator>(const worker_options&)>;

/// Creates the generator (a failure is reported as a fatal message), announces ready,
/// then serves jobs until shutdown or until the supervisor goes away. Returns the exit
/// status for main().
int run_worker(const worker_options& opts, const generator_factory& make);

} // namespace colibri::worker
