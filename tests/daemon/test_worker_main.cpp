// colibri-test-worker: a worker for the daemon's tests. Speaks the real worker protocol
// through the real worker loop (fault injection included) but generates deterministic
// fake text instead of running a model. Built only with the tests; colibrid uses it only
// when a test passes --worker-exe. A model file whose content starts with "fail" makes
// it fail to start, like a corrupt model would; "slow N" makes every piece take N ms (for
// clients that cannot ask for debug_fault).

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <thread>

#include "fake_generator.hpp"
#include "worker_loop.hpp"

namespace {

namespace p = colibri::protocol;
using colibri::worker::generator;

class fake_generator final : public generator {
public:
    explicit fake_generator(int piece_ms) : piece_ms_(piece_ms) {}

    nlohmann::json info() const override {
        return {{"architecture", "fake"}, {"quant", "none"}, {"backend", "cpu"}, {"n_ctx", 4096}};
    }

    result generate(const p::worker::run_msg& job, colibri::worker::piece_sink& sink) override {
        if (job.req.prompt == "reject me")
            throw colibri::worker::generate_error(p::error_code::invalid_request, "the fake refuses this prompt");
        const auto c = colibri::test::make_fake_completion(job.req, job.seed);
        result r;
        r.reason = c.reason;
        r.tokens.prompt_tokens = static_cast<int>(job.req.prompt.size());
        for (const auto& piece : c.pieces) {
            if (piece_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(piece_ms_));
            if (!sink.piece(piece)) {
                r.reason = p::finish_reason::cancelled;
                break;
            }
            ++r.tokens.completion_tokens;
        }
        r.decode_ms = 0.01 * r.tokens.completion_tokens;
        return r;
    }

private:
    int piece_ms_;
};

} // namespace

int main(int argc, char** argv) {
    colibri::worker::worker_options opts;
    try {
        opts = colibri::worker::parse_worker_args(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "colibri-test-worker: " << e.what() << "\n";
        return 2;
    }
    return colibri::worker::run_worker(opts, [](const colibri::worker::worker_options& o) {
        std::ifstream in(o.model);
        const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (content.rfind("fail", 0) == 0) throw std::runtime_error("cannot load model '" + o.model + "': corrupt");
        const int piece_ms = content.rfind("slow ", 0) == 0 ? std::atoi(content.c_str() + 5) : 0;
        return std::unique_ptr<generator>(new fake_generator(piece_ms));
    });
}
