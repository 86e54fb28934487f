#pragma once
// Drafts for speculative decoding taken from the text itself (prompt lookup): the tokens
// that followed the latest earlier occurrence of the text's last few tokens. Completion
// repeats its context (a renamed copy, a second branch like the first, the suffix after
// the cursor), and a draft that turns out right saves a step. Where a copy differs by a
// token (a renamed variable, v2 for v1), the copy goes on past it; where it changed a
// number, a copy of the copy changes it by as much again (v3 after v2).

#include "tokenizer/number_tokens.h"

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace colibri {

class ngram_drafter {
public:
    ngram_drafter() = default;
    /// With numbers: a copy's token whose own source spelt another number of its width is
    /// drafted stepped as far again. Null: copies are drafted as they are.
    explicit ngram_drafter(const number_tokens* numbers) : numbers_(numbers) {}

    static constexpr int max_n = 6;      ///< longest suffix looked up
    static constexpr int min_n = 1;      ///< shortest (one token: only where no copy holds)
    static constexpr int max_misses = 2; ///< tokens in a row unlike the copy's that end it

    /// Up to k tokens from a source in the text: what followed the latest earlier occurrence
    /// of the longest suffix of `tokens` of 2..max_n tokens, or the copy the previous draft
    /// came from, read on as far as the text has grown since, while fewer than max_misses of
    /// the newest tokens in a row differ from it (a substitution). The copy stays ahead of
    /// that occurrence when it ends in the same suffix, short of max_n tokens; the last token
    /// alone is looked up only when no copy holds. Else empty. `tokens` must extend the text
    /// of the previous call (or start anew after reset): each token is indexed once.
    std::vector<int32_t> draft(std::span<const int32_t> tokens, int k);
    void reset();

private:
    static uint64_t key(std::span<const int32_t> gram);
    // the token at p as a copy drafts it: stepped where the text stepped a number there
    int32_t drafted(std::span<const int32_t> tokens, size_t p) const;
    // per length n - min_n: an n-gram's hash -> where its latest occurrence ended
    std::array<std::unordered_map<uint64_t, uint32_t>, max_n - min_n + 1> ends_;
    size_t indexed_ = 0; // n-grams ending before this position are in ends_
    // the copy followed: where the text's next token was expected to come from (none: 0),
    // for a text of len_ tokens; misses_: the newest tokens in a row unlike their source's
    size_t copy_ = 0, len_ = 0;
    int misses_ = 0;
    const number_tokens* numbers_ = nullptr;
    std::unordered_map<size_t, int> steps_; // a text position -> its number's step from its source's
};

/// How many tokens to draft: the length with the most expected tokens per unit of time, from
/// the measured time of each size of pass and the recent acceptance rate. A drafted token
/// that is wrong costs what its row adds to the pass: next to nothing where a step is
/// bandwidth-bound (a small dense model), much where the rows' experts differ (an MoE).
class draft_policy {
public:
    static constexpr int max_k = 7;         ///< most drafted tokens a pass verifies
    static constexpr int forget_after = 16; ///< passes after which an untried size's time halves back

    draft_policy() = default;
    /// A policy that drafts k tokens (or what room allows) whatever the times: one draft
    /// length measured on its own, and tests that must not depend on the host's timing.
    static draft_policy fixed(int k) {
        draft_policy p;
        p.fixed_ = k;
        return p;
    }

    /// A pass of n tokens (1 .. max_k + 1) took ms milliseconds.
    void timed(int n, double ms);
    /// A pass verified `drafted` tokens and kept the first `accepted` (or, drafting none, the
    /// drafter's guess of one token came true or not: so drafting resumes when it would pay).
    void judged(int drafted, int accepted);
    /// Tokens to draft next, at most `room`: none before a plain step is timed, then passes
    /// one token longer than the longest timed one at most (while most drafts are kept),
    /// taken to cost what that one did.
    int length(int room) const;
    /// The chance that the next drafted token is kept, as the recent passes in the same state
    /// say: drafts that follow a pass whose drafts were all kept (inside a copy) come true far
    /// more often than those that follow a refusal.
    double acceptance() const { return kept_[copying_] / (kept_[copying_] + missed_[copying_]); }

private:
    int fixed_ = -1;                        // >= 0: fixed()
    std::array<double, max_k + 2> ms_{};    // by pass size; 0: not timed
    std::array<int, max_k + 2> since_{};    // passes since each size was timed
    std::array<bool, max_k + 2> guessed_{}; // a size's time lowered since it was last timed
    // by state (after a refusal, after a pass that kept all): recent drafted tokens kept, and
    // first misses (a prior of 0.8), the older passes fading by `fade` a pass
    static constexpr double fade = 0.9;
    std::array<double, 2> kept_{0.8, 0.8}, missed_{0.2, 0.2};
    bool copying_ = false; // the last judged pass kept all its drafts
};

} // namespace colibri
