#include "colibri/protocol/transport.hpp"

#include <unistd.h>

#include <cstdlib>

namespace colibri::protocol {

std::string default_socket_path() {
    if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg)
        return std::string(xdg) + "/colibri/colibri.sock";
    return "/tmp/colibri-" + std::to_string(::getuid()) + "/colibri.sock";
}

} // namespace colibri::protocol
