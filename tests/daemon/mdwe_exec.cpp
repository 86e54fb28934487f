// colibri-test-mdwe-exec: runs a command with the kernel refusing writable+executable
// memory (prctl PR_SET_MDWE, inherited by children), as systemd's
// MemoryDenyWriteExecute=yes does for a service. Exit status 77 when the kernel lacks it.

#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#endif
#ifndef PR_MDWE_REFUSE_EXEC_GAIN
#define PR_MDWE_REFUSE_EXEC_GAIN (1UL << 0)
#endif

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: colibri-test-mdwe-exec PROGRAM [ARGS...]\n");
        return 2;
    }
    if (::prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) != 0) {
        std::fprintf(stderr, "colibri-test-mdwe-exec: PR_SET_MDWE: %s\n", std::strerror(errno));
        return 77;
    }
    // The restriction is in force: a writable+executable mapping is refused.
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        std::fprintf(stderr, "colibri-test-mdwe-exec: PR_SET_MDWE did not refuse a W+X mapping\n");
        return 3;
    }
    ::execv(argv[1], argv + 1);
    std::fprintf(stderr, "colibri-test-mdwe-exec: cannot execute %s: %s\n", argv[1], std::strerror(errno));
    return 127;
}
