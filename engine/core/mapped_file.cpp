#include "core/mapped_file.h"

#include "core/error.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace colibri {

mapped_file::mapped_file(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
        throw error(errc::io, path + ": cannot open: " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
        int e = errno;
        reset();
        throw error(errc::io, path + ": cannot stat: " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        reset();
        throw error(errc::io,
                    path + ": not a regular file" + std::string(S_ISDIR(st.st_mode) ? " (it is a directory)" : ""));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) {
        reset();
        throw error(errc::format, path + ": file is empty");
    }
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        reset();
        throw error(errc::io, path + ": cannot map: " + std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
}

mapped_file::~mapped_file() { reset(); }

mapped_file::mapped_file(mapped_file&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
    if (this != &other) {
        reset();
        path_ = std::move(other.path_);
        fd_ = std::exchange(other.fd_, -1);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

void mapped_file::reset() noexcept {
    if (data_ != nullptr) {
        ::munmap(const_cast<uint8_t*>(data_), size_);
        data_ = nullptr;
    }
    if (fd_ >= 0) {
        ::close(fd_);
        fd_ = -1;
    }
    size_ = 0;
}

long mapping_kib(const void* addr, const std::string& field) {
    std::ifstream smaps("/proc/self/smaps");
    const auto a = reinterpret_cast<uintptr_t>(addr);
    const std::string key = field + ":";
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
        unsigned long long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
            if (inside) break; // the next mapping
            inside = lo <= a && a < hi;
        } else if (inside && line.rfind(key, 0) == 0) {
            return std::strtol(line.c_str() + key.size(), nullptr, 10);
        }
    }
    return -1;
}

} // namespace colibri
