#pragma once
// Bounds-checked reading of a binary payload: every read checks the bytes left, and a
// failure throws colibri::error (format) naming the file, the field and the offset.

#include "core/error.h"

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace colibri {

class payload_reader {
public:
    /// `where` prefixes every error message (the file and section).
    payload_reader(std::span<const uint8_t> bytes, std::string where) : p_(bytes), where_(std::move(where)) {}

    /// Throws colibri::error (format): `where`, `what` and the current offset.
    [[noreturn]] void fail(const std::string& what) const {
        throw error(errc::format, where_ + ": " + what + " (at payload byte " + std::to_string(pos_) + ")");
    }

    /// Reads a little-endian u32 (`field` names it in errors).
    uint32_t u32(const char* field) {
        need(4, field);
        uint32_t v;
        std::memcpy(&v, p_.data() + pos_, 4);
        pos_ += 4;
        return v;
    }
    /// Reads a little-endian i32.
    int32_t i32(const char* field) { return static_cast<int32_t>(u32(field)); }

    /// A u32 length then that many bytes.
    std::string_view str(const char* field) {
        const uint32_t n = u32(field);
        need(n, field);
        std::string_view s(reinterpret_cast<const char*>(p_.data() + pos_), n);
        pos_ += n;
        return s;
    }

    /// A u32 element count, refused when even `min_bytes_each` per element cannot fit.
    uint32_t count(const char* field, size_t min_bytes_each) {
        const uint32_t n = u32(field);
        if (uint64_t(n) * min_bytes_each > left()) {
            fail(std::string(field) + " = " + std::to_string(n) + " does not fit in the " + std::to_string(left()) +
                 " bytes left");
        }
        return n;
    }

    /// Bytes not yet read.
    size_t left() const { return p_.size() - pos_; }
    /// True when every byte has been read.
    bool at_end() const { return pos_ == p_.size(); }

private:
    void need(uint64_t n, const char* field) const {
        if (n > left()) {
            fail(std::string("truncated: ") + field + " needs " + std::to_string(n) + " bytes, " +
                 std::to_string(left()) + " left");
        }
    }

    std::span<const uint8_t> p_;
    size_t pos_ = 0;
    std::string where_;
};

} // namespace colibri
