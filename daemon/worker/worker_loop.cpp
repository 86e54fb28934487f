#include "worker_loop.hpp"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "colibri/protocol/line_framer.hpp"

namespace colibri::worker {

namespace p = protocol;
namespace w = protocol::worker;

namespace {

/// The socket to the supervisor; writes come from two threads, whole lines at a time.
class channel {
public:
    explicit channel(int fd) : fd_(fd) {}

    bool send(const w::from_worker& msg) {
        const std::string line = p::frame(w::encode(msg));
        std::lock_guard lock(mu_);
        const char* data = line.data();
        std::size_t left = line.size();
        while (left > 0) {
            const ssize_t n = ::send(fd_, data, left, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR) continue;
                return false;
            }
            data += n;
            left -= static_cast<std::size_t>(n);
        }
        return true;
    }

    int fd() const { return fd_; }

private:
    int fd_;
    std::mutex mu_;
};

/// State shared by the reader thread and the job loop.
struct shared_state {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<w::run_msg> pending;
    bool quit = false;
    std::atomic<std::uint64_t> current{0};   ///< job being generated
    std::atomic<std::uint64_t> cancelled{0}; ///< job asked to stop
    std::atomic<bool> stopping{false};
};

/// What the reader thread and the job loop share. The reader is detached (it may block in
/// read() until the process exits) and holds its own reference: the job loop may return
/// while it still runs, as after a device failure, when the reader wakes only once the
/// supervisor closes the socket.
struct worker_link {
    explicit worker_link(int fd) : ch(fd) {}
    channel ch;
    shared_state st;
};

void reader_loop(channel& ch, shared_state& st) {
    p::line_framer framer(p::default_max_line_bytes * 16);
    char buf[16384];
    std::string line;
    for (;;) {
        const ssize_t n = ::read(ch.fd(), buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; // the supervisor is gone
        framer.feed(std::string_view(buf, static_cast<std::size_t>(n)));
        for (;;) {
            const auto r = framer.next(line);
            if (r == p::line_framer::result::need_more) break;
            if (r == p::line_framer::result::too_long) {
                std::cerr << "colibri-worker: oversized message from the supervisor\n";
                goto out;
            }
            w::to_worker msg;
            try {
                msg = w::decode_to_worker(line);
            } catch (const p::protocol_error& e) {
                std::cerr << "colibri-worker: " << e.what() << "\n";
                goto out;
            }
            if (auto* run = std::get_if<w::run_msg>(&msg)) {
                std::lock_guard lock(st.mu);
                st.pending = std::move(*run);
                st.cv.notify_all();
            } else if (auto* c = std::get_if<w::cancel_msg>(&msg)) {
                st.cancelled = c->job;
            } else if (auto* ping = std::get_if<w::ping_msg>(&msg)) {
                ch.send(w::pong_msg{ping->n});
            } else {
                goto out; // shutdown
            }
        }
    }
out:
    std::lock_guard lock(st.mu);
    st.quit = true;
    st.stopping = true;
    st.cancelled = st.current.load();
    st.cv.notify_all();
}

[[noreturn]] void trigger_fault(p::fault_kind kind) {
    // Default dispositions first, so that a handler (a sanitizer's, the engine's) cannot
    // turn the injected signal into something else.
    switch (kind) {
    case p::fault_kind::crash:
        ::signal(SIGSEGV, SIG_DFL);
        ::raise(SIGSEGV);
        break;
    case p::fault_kind::abort:
        ::signal(SIGABRT, SIG_DFL);
        ::raise(SIGABRT);
        break;
    case p::fault_kind::kill: ::raise(SIGKILL); break;
    case p::fault_kind::exit: ::_exit(3);
    default: break;
    }
    // hang (or a signal that did not kill): stop making progress for good. The reader
    // thread keeps answering pings, so only the progress watchdog can catch this.
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

/// Forwards pieces to the supervisor; applies cancellation and fault injection.
class forwarding_sink final : public piece_sink {
public:
    forwarding_sink(channel& ch, shared_state& st, const w::run_msg& job, bool faults)
        : ch_(ch), st_(st), job_(job.job), fault_(faults ? job.req.fault : p::fault_spec{}) {}

    bool piece(std::string_view text) override {
        if (fault_.kind == p::fault_kind::device_error && emitted_ >= fault_.after_tokens) {
            device_fault_ = true; // the generation stops here, as an engine call that failed
            return false;
        }
        if (fault_.kind != p::fault_kind::none && fault_.kind != p::fault_kind::slow && emitted_ >= fault_.after_tokens)
            trigger_fault(fault_.kind);
        if (fault_.kind == p::fault_kind::slow) slow_down();
        if (cancelled()) return false;
        if (!ch_.send(w::piece_msg{job_, std::string(text)})) {
            st_.stopping = true;
            return false;
        }
        ++emitted_;
        return true;
    }

    bool poll() override {
        // Rate-limited: the watchdog needs a sign of life, not one message per chunk.
        const auto now = std::chrono::steady_clock::now();
        if (now - last_progress_ >= std::chrono::milliseconds(100)) {
            last_progress_ = now;
            if (!ch_.send(w::progress_msg{job_})) st_.stopping = true;
        }
        return cancelled();
    }

    /// A fault scheduled after more pieces than the job produced fires at its end; a slow
    /// job is late with its end as with every piece (the token that stops it takes a step
    /// too), so a cancel sent after its last piece still finds it running.
    void at_end() {
        if (fault_.kind == p::fault_kind::slow) slow_down();
        else if (fault_.kind == p::fault_kind::device_error) device_fault_ = true;
        else if (fault_.kind != p::fault_kind::none) trigger_fault(fault_.kind);
        if (device_fault_) throw device_failure("injected device error");
    }

    bool cancelled() const override { return st_.cancelled.load() == job_ || st_.stopping.load(); }

private:
    // Sleeps delay_ms in small steps, so that a cancel still stops the job promptly.
    void slow_down() const {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(fault_.delay_ms);
        while (std::chrono::steady_clock::now() < until && !cancelled())
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }

    channel& ch_;
    shared_state& st_;
    std::uint64_t job_;
    p::fault_spec fault_;
    int emitted_ = 0;
    bool device_fault_ = false;
    std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
};

int parse_int(const std::string& flag, const char* value) {
    try {
        std::size_t pos = 0;
        const int v = std::stoi(value, &pos);
        if (value[pos] != '\0') throw std::invalid_argument(flag);
        return v;
    } catch (const std::exception&) {
        throw std::invalid_argument(flag + " needs an integer, got '" + value + "'");
    }
}

} // namespace

worker_options parse_worker_args(int argc, const char* const* argv) {
    worker_options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
            return argv[++i];
        };
        if (a == "--fd") o.fd = parse_int(a, value());
        else if (a == "--model") o.model = value();
        else if (a == "--device") o.device = value();
        else if (a == "--gpu-memory") o.gpu_memory_mib = parse_int(a, value());
        else if (a == "--threads") o.threads = parse_int(a, value());
        else if (a == "--slots") o.slots = parse_int(a, value());
        else if (a == "--cache-mb") o.cache_mb = parse_int(a, value());
        else if (a == "--batch") o.batch = parse_int(a, value());
        else if (a == "--fim-order") {
            const std::string v = value();
            if (v != "auto" && v != "psm" && v != "spm")
                throw std::invalid_argument("--fim-order must be auto, psm or spm");
            o.fim_spm = v == "auto" ? -1 : v == "spm" ? 1 : 0;
        } else if (a == "--enable-fault-injection") o.fault_injection = true;
        else if (a == "--backend") o.backend = value();
        else if (a == "--upstream") o.upstreams.emplace_back(value());
        else if (a == "--upstream-key-file") o.upstream_key_file = value();
        else if (a == "--upstream-ca-file") o.upstream_ca_file = value();
        else if (a == "--upstream-fim") o.upstream_fim = value();
        else if (a == "--upstream-tokenizer") o.upstream_tokenizer = value();
        else throw std::invalid_argument("unknown argument '" + a + "'");
    }
    if (o.fd < 0) throw std::invalid_argument("--fd is required (the worker is started by colibrid)");
    if (o.slots < 1) throw std::invalid_argument("--slots must be at least 1");
    if (o.gpu_memory_mib < 0) throw std::invalid_argument("--gpu-memory must not be negative");
    if (o.cache_mb < 1) throw std::invalid_argument("--cache-mb must be at least 1");
    if (o.batch < 0 || o.batch > 4096) throw std::invalid_argument("--batch must be 1..4096 (0: the engine's default)");
    if (o.backend != "local" && o.backend != "openai") throw std::invalid_argument("--backend must be local or openai");
    return o;
}

int run_worker(const worker_options& opts, const generator_factory& make) {
    const auto link = std::make_shared<worker_link>(opts.fd);
    channel& ch = link->ch;
    std::unique_ptr<generator> gen;
    try {
        gen = make(opts);
    } catch (const std::exception& e) {
        ch.send(w::fatal_msg{e.what()});
        return 2;
    }
    if (!ch.send(w::ready_msg{gen->info()})) return 1;

    shared_state& st = link->st;
    std::thread reader([link] { reader_loop(link->ch, link->st); });
    reader.detach(); // it may block in read() until the process exits

    for (;;) {
        w::run_msg job;
        {
            std::unique_lock lock(st.mu);
            st.cv.wait(lock, [&] { return st.quit || st.pending.has_value(); });
            if (st.quit) break;
            job = std::move(*st.pending);
            st.pending.reset();
            st.current = job.job;
        }
        forwarding_sink sink(ch, st, job, opts.fault_injection);
        w::from_worker reply;
        bool device_failed = false;
        try {
            const generator::result r = gen->generate(job, sink);
            sink.at_end();
            w::done_msg d;
            d.job = job.job;
            d.reason = sink.cancelled() ? p::finish_reason::cancelled : r.reason;
            d.tokens = r.tokens;
            d.prefill_ms = r.prefill_ms;
            d.decode_ms = r.decode_ms;
            d.cache = gen->cache_stats();
            d.upstreams = gen->upstream_stats();
            reply = d;
        } catch (const device_failure& e) {
            // the supervisor hears why first, so that it sends nothing more to this worker
            const std::string why = std::string("the device failed: ") + e.what();
            ch.send(w::fatal_msg{why});
            reply = w::error_msg{job.job, p::error_code::worker_crashed, why + "; the worker restarts", nullptr};
            device_failed = true;
        } catch (const generate_error& e) {
            reply = w::error_msg{job.job, e.code(), e.what(), gen->upstream_stats()};
        } catch (const std::exception& e) {
            reply = w::error_msg{job.job, p::error_code::internal, e.what(), gen->upstream_stats()};
        }
        st.current = 0;
        if (!ch.send(reply)) break;
        if (device_failed) return exit_device_failure;
    }
    return 0;
}

} // namespace colibri::worker
