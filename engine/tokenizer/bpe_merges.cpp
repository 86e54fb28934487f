#include "tokenizer/bpe_merges.h"

#include <algorithm>
#include <functional>

namespace colibri {

merge_table::merge_table(size_t n_merges) {
    size_t cap = 16;
    while (cap < 2 * n_merges) cap *= 2;
    entries_.resize(cap);
    mask_ = cap - 1;
    shift_ = 64 - __builtin_ctzll(cap);
}

void merge_table::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    const uint64_t key = make_key(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
        entry& e = entries_[i];
        if (e.key == key) {
            e.v = {rank, merged};
            return;
        }
        if (e.key == empty) {
            e.key = key;
            e.v = {rank, merged};
            ++size_;
            return;
        }
    }
}

namespace {

constexpr uint32_t no_merge = ~uint32_t(0);

// Short words (almost every word after a split regex): the rank of each adjacent pair in
// an array, the minimum found by a scan, neighbours re-ranked after each merge.
void merge_short(const merge_table& merges, std::vector<int32_t>& ids, std::vector<uint32_t>& ranks) {
    size_t n = ids.size();
    ranks.resize(n);
    auto rank_at = [&](size_t i) {
        const auto* m = merges.find(ids[i], ids[i + 1]);
        return m ? m->rank : no_merge;
    };
    for (size_t i = 0; i + 1 < n; ++i) ranks[i] = rank_at(i);
    while (n > 1) {
        size_t best = 0;
        uint32_t best_rank = no_merge;
        for (size_t i = 0; i + 1 < n; ++i) {
            if (ranks[i] < best_rank) {
                best_rank = ranks[i];
                best = i;
            }
        }
        if (best_rank == no_merge) break;
        ids[best] = merges.find(ids[best], ids[best + 1])->id;
        ids.erase(ids.begin() + static_cast<ptrdiff_t>(best) + 1);
        ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(best) + 1);
        --n;
        if (best + 1 < n) ranks[best] = rank_at(best);
        if (best > 0) ranks[best - 1] = rank_at(best - 1);
    }
    ids.resize(n);
}

// Long words (a whole text when there is no pre-tokenizer): a doubly linked list of
// symbols and a min-heap of (rank, position) entries, stale ones skipped when popped.
void merge_long(const merge_table& merges, std::vector<int32_t>& ids, merge_scratch& s) {
    const size_t n = ids.size();
    s.prev.resize(n);
    s.next.resize(n);
    for (size_t i = 0; i < n; ++i) {
        s.prev[i] = static_cast<int32_t>(i) - 1;
        s.next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    }
    // Heap entry: rank in the high 32 bits, position in the low: the minimum is the
    // lowest rank, leftmost first. The merged id is looked up again when popped.
    auto& heap = s.heap;
    heap.clear();
    auto push = [&](int32_t pos) {
        const int32_t nx = s.next[pos];
        if (nx < 0) return;
        if (const auto* m = merges.find(ids[pos], ids[nx])) {
            heap.push_back((uint64_t(m->rank) << 32) | uint32_t(pos));
            std::push_heap(heap.begin(), heap.end(), std::greater<>());
        }
    };
    for (size_t i = 0; i + 1 < n; ++i) {
        if (const auto* m = merges.find(ids[i], ids[i + 1])) heap.push_back((uint64_t(m->rank) << 32) | i);
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    constexpr int32_t gone = -2; // ids[] value of a symbol merged into its left neighbour
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        const uint64_t top = heap.back();
        heap.pop_back();
        const auto pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
        const auto rank = static_cast<uint32_t>(top >> 32);
        if (ids[pos] == gone) continue;
        const int32_t nx = s.next[pos];
        if (nx < 0) continue;
        const auto* m = merges.find(ids[pos], ids[nx]);
        if (m == nullptr || m->rank != rank) continue; // the pair changed since the push
        ids[pos] = m->id;
        ids[nx] = gone;
        s.next[pos] = s.next[nx];
        if (s.next[nx] >= 0) s.prev[s.next[nx]] = pos;
        if (s.prev[pos] >= 0) push(s.prev[pos]);
        push(pos);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; ++i) {
        if (ids[i] != gone) ids[w++] = ids[i];
    }
    ids.resize(w);
}

} // namespace

void apply_merges(const merge_table& merges, std::vector<int32_t>& ids, merge_scratch& scratch) {
    if (ids.size() < 2) return;
    if (ids.size() <= 64) {
        merge_short(merges, ids, scratch.ranks);
    } else {
        merge_long(merges, ids, scratch);
    }
}

} // namespace colibri
