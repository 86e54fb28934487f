#pragma once
/// Which KV-cache slot a completion runs on, and which slots are emptied to keep the
/// cached tokens of all slots under a memory cap. Pure decisions, no engine: the engine
/// generator applies them to its sessions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace colibri::worker {

struct slot_state {
    std::size_t n_cached = 0;    ///< tokens the slot's cache holds
    std::size_t reusable = 0;    ///< leading tokens of the new prompt it holds
    std::uint64_t last_used = 0; ///< larger: more recent; 0: never used
    bool same_session = false;   ///< last used by the request's (named) session
};

/// The slot reusing the most prompt tokens, provided it reuses at least half of what it
/// holds (a slot mostly about other text is kept for that text) or was last used by the
/// same session (whose older text is stale anyway); ties go to the most recently used.
/// Otherwise an empty slot, otherwise the least recently used one.
/// `slots` must not be empty.
std::size_t choose_slot(std::span<const slot_state> slots);

/// Slots other than `chosen` to empty, least recently used first, until their cached
/// tokens plus `need_tokens` for `chosen` take at most `cap_bytes` (as far as emptying
/// them can get there).
std::vector<std::size_t> slots_to_evict(std::span<const slot_state> slots, std::size_t chosen, std::size_t need_tokens,
                                        std::size_t token_bytes, std::size_t cap_bytes);

} // namespace colibri::worker
