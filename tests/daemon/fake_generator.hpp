#pragma once
/// A deterministic stand-in for the engine, used by colibri-test-worker and by the tests
/// that check its output: the same request and seed always give the same pieces.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/protocol/messages.hpp"

namespace colibri::test {

struct fake_completion {
    std::vector<std::string> pieces;
    protocol::finish_reason reason = protocol::finish_reason::length;

    std::string text() const {
        std::string t;
        for (const auto& p : pieces) t += p;
        return t;
    }
};

inline std::uint64_t fnv1a(std::string_view s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

/// Multi-byte UTF-8 pieces on purpose: the daemon must pass them through untouched.
inline fake_completion make_fake_completion(const protocol::complete_request& req, std::uint64_t seed) {
    static const char* const words[] = {
        " foo", "(",   ")", " bar", "\n",    " \xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x90\x8d",
        " x",   " = ", "1", ";",    "\"q\"", "\\"};
    constexpr std::uint64_t n_words = sizeof(words) / sizeof(words[0]);
    std::uint64_t h = fnv1a(req.prompt) ^ (fnv1a(req.suffix) * 31) ^ (seed * 0x9E3779B97F4A7C15ull);
    fake_completion out;
    std::string text;
    for (int i = 0; i < req.max_tokens; ++i) {
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
        out.pieces.emplace_back(words[h % n_words]);
        text += out.pieces.back();
    }
    // Stop strings: cut before the earliest match, never emitting any of it.
    std::size_t cut = std::string::npos;
    for (const auto& s : req.stop) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos) {
        out.reason = protocol::finish_reason::stop;
        std::size_t total = 0;
        std::vector<std::string> kept;
        for (auto& p : out.pieces) {
            if (total >= cut) break;
            if (total + p.size() > cut) p.resize(cut - total);
            total += p.size();
            kept.push_back(p);
        }
        out.pieces = std::move(kept);
    }
    return out;
}

/// The text the fake worker sends for a plain prompt.
inline std::string fake_text(const std::string& prompt, int max_tokens, std::uint64_t seed) {
    protocol::complete_request req;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    return make_fake_completion(req, seed).text();
}

} // namespace colibri::test
