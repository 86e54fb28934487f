#pragma once
// The command-line handling every Colibri program shares: parse, --help, and the usage
// errors that exit with status 2.

#include <boost/program_options.hpp>

#include <iostream>
#include <string_view>

namespace colibri::cli {

/// Prints "PROGRAM: MESSAGE (see --help)" on stderr; returns 2, the usage-error status.
inline int usage_error(std::string_view program, std::string_view message) {
    std::cerr << program << ": " << message << " (see --help)\n";
    return 2;
}

/// Parses argv against opts into vm. Returns -1 for the caller to go on, or the status to
/// exit with: 0 after printing the options for --help (when opts has it), 2 after a usage
/// error.
inline int parse(int argc, const char* const* argv, std::string_view program,
                 const boost::program_options::options_description& opts, boost::program_options::variables_map& vm) {
    namespace po = boost::program_options;
    try {
        po::store(po::parse_command_line(argc, argv, opts), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        return usage_error(program, e.what());
    }
    if (vm.count("help") > 0) {
        std::cout << opts << "\n";
        return 0;
    }
    return -1;
}

} // namespace colibri::cli
