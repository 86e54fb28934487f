#pragma once
// A fuzz input as a file the loaders can open: an anonymous memory file (memfd), named by
// its /proc/self/fd path, closed with the object.

#include "../engine/test_util.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace colibri::fuzz {

class input_file {
public:
    input_file(const uint8_t* data, size_t size) : fd_(memfd_create("colibri-fuzz", 0)) {
        for (size_t done = 0; fd_ >= 0 && done < size;) {
            const ssize_t n = ::write(fd_, data + done, size - done);
            if (n <= 0) break;
            done += size_t(n);
        }
    }
    ~input_file() {
        if (fd_ >= 0) ::close(fd_);
    }
    input_file(const input_file&) = delete;
    input_file& operator=(const input_file&) = delete;
    bool ok() const { return fd_ >= 0; }
    std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

private:
    int fd_;
};

/// A path for this process's output files, in a directory of its own under the temporary
/// directory (a fuzzer's parallel jobs are separate processes), removed with them at exit.
inline std::string scratch_path(const std::string& name) {
    static const test::temp_dir dir;
    return dir.file(name);
}

} // namespace colibri::fuzz
