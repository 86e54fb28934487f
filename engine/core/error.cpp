#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace colibri {

void assert_fail(const char* expr, const char* file, int line) {
    std::fprintf(stderr, "colibri: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    std::abort();
}

} // namespace colibri
