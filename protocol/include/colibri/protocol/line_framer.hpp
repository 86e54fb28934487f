#pragma once
/// Splits a byte stream into newline-terminated lines with a maximum line length.

#include <cstddef>
#include <string>
#include <string_view>

namespace colibri::protocol {

/// Default limit on one line: bytes before the '\n' (a trailing '\r' counts).
inline constexpr std::size_t default_max_line_bytes = 1u << 20;

/// Incremental NDJSON framer in the style of Asio's request_parser: feed() bytes as they
/// arrive, then call next() until it answers need_more. A line is the bytes before '\n'
/// with one trailing '\r' removed; empty lines are skipped. Once a line exceeds the limit
/// the framer answers too_long forever (the stream cannot be resynchronised safely).
class line_framer {
public:
    enum class result { line, need_more, too_long };

    explicit line_framer(std::size_t max_line_bytes = default_max_line_bytes) : max_line_(max_line_bytes) {}

    /// Appends received bytes. Bytes fed after too_long are dropped.
    void feed(std::string_view bytes);

    /// Extracts the next complete line into `line`.
    result next(std::string& line);

    /// Bytes buffered but not yet returned as lines.
    std::size_t buffered() const noexcept { return buf_.size() - start_; }

    std::size_t max_line_bytes() const noexcept { return max_line_; }

private:
    std::string buf_;
    std::size_t start_ = 0; ///< first byte of the current, unfinished line
    std::size_t scan_ = 0;  ///< bytes before this index hold no '\n' (relative to buf_)
    std::size_t max_line_;
    bool overflow_ = false;
};

/// Appends '\n' to an encoded message: the wire form of one NDJSON line.
inline std::string frame(std::string encoded) {
    encoded.push_back('\n');
    return encoded;
}

} // namespace colibri::protocol
