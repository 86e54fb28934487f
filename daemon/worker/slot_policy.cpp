#include "slot_policy.hpp"

#include <algorithm>

namespace colibri::worker {

std::size_t choose_slot(std::span<const slot_state> slots) {
    std::size_t best = slots.size();
    for (std::size_t i = 0; i < slots.size(); ++i) {
        const slot_state& s = slots[i];
        if (s.reusable == 0 || (2 * s.reusable < s.n_cached && !s.same_session)) continue;
        if (best == slots.size() || s.reusable > slots[best].reusable ||
            (s.reusable == slots[best].reusable && s.last_used > slots[best].last_used))
            best = i;
    }
    if (best != slots.size()) return best;
    for (std::size_t i = 0; i < slots.size(); ++i)
        if (slots[i].n_cached == 0) return i;
    return static_cast<std::size_t>(
        std::min_element(slots.begin(), slots.end(),
                         [](const slot_state& a, const slot_state& b) { return a.last_used < b.last_used; }) -
        slots.begin());
}

std::vector<std::size_t> slots_to_evict(std::span<const slot_state> slots, std::size_t chosen, std::size_t need_tokens,
                                        std::size_t token_bytes, std::size_t cap_bytes) {
    std::vector<std::size_t> others;
    std::size_t tokens = need_tokens;
    for (std::size_t i = 0; i < slots.size(); ++i) {
        if (i == chosen || slots[i].n_cached == 0) continue;
        others.push_back(i);
        tokens += slots[i].n_cached;
    }
    std::sort(others.begin(), others.end(),
              [&](std::size_t a, std::size_t b) { return slots[a].last_used < slots[b].last_used; });
    std::vector<std::size_t> out;
    for (std::size_t i : others) {
        if (tokens * token_bytes <= cap_bytes) break;
        out.push_back(i);
        tokens -= slots[i].n_cached;
    }
    return out;
}

} // namespace colibri::worker
