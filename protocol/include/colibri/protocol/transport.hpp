#pragma once
/// Where clients find the daemon.

#include <string>

namespace colibri::protocol {

/// $XDG_RUNTIME_DIR/colibri/colibri.sock, or /tmp/colibri-$UID/colibri.sock when
/// XDG_RUNTIME_DIR is unset or empty.
std::string default_socket_path();

} // namespace colibri::protocol
