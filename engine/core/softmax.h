#pragma once
// Softmax, shared by the CPU kernels' reference attention and the model's routing.

#include <algorithm>
#include <cmath>

namespace colibri {

/// In-place softmax over n values (n > 0).
inline void softmax(float* x, int n) {
    // subtract the max for stability
    float max = x[0];
    for (int i = 1; i < n; ++i) max = std::max(max, x[i]);
    // exponentiate and sum
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    // normalise
    const float inv = 1.0f / sum;
    for (int i = 0; i < n; ++i) x[i] *= inv;
}

} // namespace colibri
