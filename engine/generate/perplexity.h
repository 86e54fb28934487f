#pragma once
// Perplexity of a model over a text, for comparing quantisation types and imports with
// other engines on the same weights.

#include "model/model.h"
#include "ops/backend.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace colibri {

struct perplexity_result {
    double perplexity = 0; ///< exp(mean negative log-likelihood)
    double mean_nll = 0;   ///< nats per scored token
    int64_t n_scored = 0;  ///< tokens scored
    int n_windows = 0;
};

/// Sliding windows of n_ctx tokens over `tokens`, each starting n_ctx/2 after the last; the
/// first window scores all its predictions, later ones only their second half (every
/// scored token then sees at least n_ctx/2 tokens of context, except in the first window).
/// `progress(window, n_windows)` is called after each window when set.
perplexity_result perplexity(const model& m, backend& be, const std::vector<int32_t>& tokens, int n_ctx,
                             const std::function<void(int, int)>& progress = {});

} // namespace colibri
