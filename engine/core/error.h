#pragma once
// Project exception type and the always-on assert macro.

#include <stdexcept>
#include <string>

namespace colibri {

/// What kind of failure; maps one-to-one onto the C API's status codes.
enum class errc {
    invalid_argument = 1,
    io = 2,
    format = 3,
    unsupported = 4,
    out_of_memory = 5,
    context_full = 6,
    internal = 8,
    device = 9, ///< the device failed (a GPU error): its state is lost, the process should start afresh
};

/// Thrown by loading, conversion and configuration code; carries the context in its message.
class error : public std::runtime_error {
public:
    error(errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
    errc code() const noexcept { return code_; }

private:
    errc code_;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line);

} // namespace colibri

/// Programmer-error check that stays on in release builds. Never used for bad input.
#define COLIBRI_ASSERT(expr) ((expr) ? (void)0 : ::colibri::assert_fail(#expr, __FILE__, __LINE__))
