#pragma once
// Latent attention's row selections, shared by both converters. A per-head matrix holds
// n_head blocks of `stride` rows; a head's roped rows come with RoPE's pairs interleaved
// (2i, 2i + 1), as DeepSeek's checkpoints and llama.cpp's files store them, and are taken as
// halves (i, i + count / 2), the pairs the runtime turns.

#include <cstdint>
#include <vector>

namespace colibri {

/// Rows [first, first + count) of every head's block, the roped ones reordered into halves.
inline std::vector<uint64_t> head_rows(uint64_t n_head, uint64_t stride, uint64_t first, uint64_t count, bool roped) {
    std::vector<uint64_t> rows;
    rows.reserve(n_head * count);
    for (uint64_t h = 0; h < n_head; ++h) {
        for (uint64_t j = 0; j < count; ++j) {
            const uint64_t within = roped ? (j < count / 2 ? 2 * j : 2 * (j - count / 2) + 1) : j;
            rows.push_back(h * stride + first + within);
        }
    }
    return rows;
}

} // namespace colibri
