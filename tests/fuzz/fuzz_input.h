#pragma once
// A fuzz input as a file the loaders can open: an anonymous memory file (memfd), named by
// its /proc/self/fd path, closed with the object.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <sys/mman.h>
#include <system_error>
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

/// This process's directory for output files under the temporary directory (a fuzzer's
/// parallel jobs are separate processes), removed with its files at exit.
class scratch_dir {
public:
    scratch_dir() : dir_(std::filesystem::temp_directory_path() / ("colibri-fuzz-" + std::to_string(::getpid()))) {
        std::filesystem::create_directories(dir_);
    }
    ~scratch_dir() {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    scratch_dir(const scratch_dir&) = delete;
    scratch_dir& operator=(const scratch_dir&) = delete;
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

private:
    std::filesystem::path dir_;
};

/// A path for one of this process's output files, in its scratch_dir.
inline std::string scratch_path(const std::string& name) {
    static const scratch_dir dir;
    return dir.path(name);
}

} // namespace colibri::fuzz
