#pragma once
// BPE merges: a hash table from a pair of ids to (rank, merged id), and the merge loop
// that turns a word's initial symbols into tokens.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace colibri {

/// Open-addressing table keyed by (left id, right id); built once, read-only afterwards.
class merge_table {
public:
    struct value {
        uint32_t rank;
        int32_t id;
    };

    explicit merge_table(size_t n_merges = 0);
    /// Adds or replaces a merge (a later rank replaces an earlier one, as in the reference).
    void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);
    /// nullptr when the pair does not merge.
    const value* find(int32_t left, int32_t right) const {
        const uint64_t key = make_key(left, right);
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            const entry& e = entries_[i];
            if (e.key == key) return &e.v;
            if (e.key == empty) return nullptr;
        }
    }
    size_t size() const { return size_; }

private:
    static constexpr uint64_t empty = ~uint64_t(0);
    struct entry {
        uint64_t key = empty;
        value v{};
    };
    static uint64_t make_key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
    size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }

    std::vector<entry> entries_;
    size_t mask_ = 0;
    int shift_ = 64;
    size_t size_ = 0;
};

/// Working memory of apply_merges, reused between calls.
struct merge_scratch {
    std::vector<uint32_t> ranks;
    std::vector<int32_t> prev, next;
    std::vector<uint64_t> heap;
};

/// Applies the merges to `ids` in place: repeatedly the pair of lowest rank, leftmost
/// first, exactly as the reference library does.
void apply_merges(const merge_table& merges, std::vector<int32_t>& ids, merge_scratch& scratch);

} // namespace colibri
