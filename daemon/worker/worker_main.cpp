// colibri-worker: the engine process started by colibrid on a socketpair (never by hand).

#include <iostream>

#include "engine_generator.hpp"
#include "worker_loop.hpp"

int main(int argc, char** argv) {
    colibri::worker::worker_options opts;
    try {
        opts = colibri::worker::parse_worker_args(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "colibri-worker: " << e.what() << "\n";
        return 2;
    }
    return colibri::worker::run_worker(opts, colibri::worker::make_engine_generator);
}
