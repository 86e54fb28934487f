// colibri-worker: the engine process started by colibrid on a socketpair (never by hand),
// or with --backend openai the process that forwards to OpenAI-compatible servers.

#include <iostream>

#include "engine_generator.hpp"
#include "remote_generator.hpp"
#include "worker_loop.hpp"

int main(int argc, char** argv) {
    colibri::worker::worker_options opts;
    try {
        opts = colibri::worker::parse_worker_args(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "colibri-worker: " << e.what() << "\n";
        return 2;
    }
    return colibri::worker::run_worker(opts, opts.backend == "openai" ? colibri::worker::make_remote_generator
                                                                      : colibri::worker::make_engine_generator);
}
