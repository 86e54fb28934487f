#pragma once
// A read-only memory mapping of a whole file. Owns the descriptor and the mapping.

#include <cstddef>
#include <cstdint>
#include <string>

namespace colibri {

class mapped_file {
public:
    mapped_file() = default;
    /// Maps `path` read-only. Throws colibri::error (io) naming the file on failure:
    /// missing, a directory or other non-regular file, unreadable, empty.
    explicit mapped_file(const std::string& path);
    ~mapped_file();
    mapped_file(mapped_file&& other) noexcept;
    mapped_file& operator=(mapped_file&& other) noexcept;
    mapped_file(const mapped_file&) = delete;
    mapped_file& operator=(const mapped_file&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    void reset() noexcept;

    std::string path_;
    int fd_ = -1;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

/// Kilobytes that a field of /proc/self/smaps ("Rss", "FilePmdMapped", ...) gives for the
/// mapping that holds `addr`: how much of it is mapped into this process, and in which
/// pages. -1 when procfs does not tell.
long mapping_kib(const void* addr, const std::string& field);

} // namespace colibri
