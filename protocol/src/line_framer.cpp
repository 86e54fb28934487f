#include "colibri/protocol/line_framer.hpp"

namespace colibri::protocol {

void line_framer::feed(std::string_view bytes) {
    if (overflow_) return;
    // Compact once the consumed prefix dominates, so a long-lived connection's buffer
    // does not grow and erase() stays amortised O(1) per byte.
    if (start_ > 0 && start_ >= buf_.size() / 2) {
        buf_.erase(0, start_);
        scan_ -= start_;
        start_ = 0;
    }
    buf_.append(bytes);
}

line_framer::result line_framer::next(std::string& line) {
    for (;;) {
        if (overflow_) return result::too_long;
        const std::size_t nl = buf_.find('\n', scan_);
        if (nl == std::string::npos) {
            scan_ = buf_.size();
            if (buf_.size() - start_ > max_line_) {
                overflow_ = true;
                buf_.clear();
                start_ = scan_ = 0;
                return result::too_long;
            }
            return result::need_more;
        }
        const std::size_t begin = start_;
        const bool over = nl - begin > max_line_;
        std::size_t end = nl;
        if (end > begin && buf_[end - 1] == '\r') --end;
        const std::size_t len = end - begin;
        start_ = scan_ = nl + 1;
        if (over) {
            overflow_ = true;
            buf_.clear();
            start_ = scan_ = 0;
            return result::too_long;
        }
        if (len == 0) continue;
        line.assign(buf_, begin, len);
        if (start_ == buf_.size()) {
            buf_.clear();
            start_ = scan_ = 0;
        }
        return result::line;
    }
}

} // namespace colibri::protocol
