#include "model/moe_routing.h"

#include "core/softmax.h"

#include <algorithm>

namespace colibri {

void route_top_k(const float* logits, const routing_rule& rule, float* probs, int32_t* ids, float* weights) {
    const int n_expert = rule.n_expert, k = rule.k;
    std::copy_n(logits, n_expert, probs);
    softmax(probs, n_expert);
    if (rule.n_group > 1) { // DeepSeek's group-limited choice: the groups of best expert, the rest set aside
        const int size = n_expert / rule.n_group;
        uint64_t kept = 0; // bit g: group g is among the best (a model has at most 64 groups)
        for (int j = 0; j < rule.n_group_used; ++j) {
            int best = -1;
            float best_p = -1.0f;
            for (int g = 0; g < rule.n_group; ++g) {
                if (kept >> g & 1) continue;
                const float p = *std::max_element(probs + g * size, probs + (g + 1) * size);
                if (best < 0 || p > best_p) best = g, best_p = p;
            }
            kept |= uint64_t(1) << best;
        }
        for (int g = 0; g < rule.n_group; ++g) {
            if (!(kept >> g & 1)) std::fill(probs + g * size, probs + (g + 1) * size, -1.0f);
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) { // k is small: repeated arg-max, ties to the lower index
        int best = -1;
        for (int e = 0; e < n_expert; ++e) {
            if (probs[e] >= 0.0f && (best < 0 || probs[e] > probs[best])) best = e;
        }
        if (best < 0) best = j; // only when the router produced NaN: keep ids valid
        ids[j] = best;
        weights[j] = std::max(probs[best], 0.0f);
        probs[best] = -1.0f;
        sum += weights[j];
    }
    for (int j = 0; j < k && rule.renorm; ++j) weights[j] /= sum;
    for (int j = 0; j < k && rule.scale != 1.0f; ++j) weights[j] *= rule.scale;
}

} // namespace colibri
