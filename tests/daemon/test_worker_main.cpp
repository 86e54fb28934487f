// colibri-test-worker: a worker for the daemon's tests. Speaks the real worker protocol
// through the real worker loop (fault injection included) but generates deterministic
// fake text instead of running a model. Built only with the tests; colibrid uses it only
// when a test passes --worker-exe. A model file whose content starts with "fail" makes
// it fail to start, like a corrupt model would.

#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>

#include "fake_generator.hpp"
#include "worker_loop.hpp"

namespace {

namespace p = colibri::protocol;
using colibri::worker::generator;

class fake_generator final : public generator {
public:
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
            if (!sink.piece(piece)) {
                r.reason = p::finish_reason::cancelled;
                break;
            }
            ++r.tokens.completion_tokens;
        }
        r.decode_ms = 0.01 * r.tokens.completion_tokens;
        return r;
    }
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
        return std::unique_ptr<generator>(new fake_generator());
    });
}
