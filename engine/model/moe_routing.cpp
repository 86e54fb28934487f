#include "model/moe_routing.h"

#include "core/softmax.h"

#include <algorithm>

namespace colibri {

void route_top_k(const float* logits, int n_expert, int k, bool renorm, float* probs, int32_t* ids, float* weights) {
    std::copy_n(logits, n_expert, probs);
    softmax(probs, n_expert);
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
    if (renorm) {
        for (int j = 0; j < k; ++j) weights[j] /= sum;
    }
}

} // namespace colibri
