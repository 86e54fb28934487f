#include "convert/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace colibri {

namespace {

// YaRN's dimension at which a frequency makes `rotations` turns over the original context.
double correction_dim(double rotations, int dim, double theta, double original_ctx) {
    return dim * std::log(original_ctx / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
}

double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

} // namespace

std::vector<float> rope_freq_factors(const rope_scaling& s, double theta, int head_dim) {
    const int half = head_dim / 2;
    std::vector<float> out;
    if (s.type == rope_scaling::kind::none) return out;
    out.resize(size_t(half));
    double low = 0, high = 0; // YaRN's ramp, in pairs
    if (s.type == rope_scaling::kind::yarn) {
        low = correction_dim(s.beta_fast, head_dim, theta, s.original_ctx);
        high = correction_dim(s.beta_slow, head_dim, theta, s.original_ctx);
        if (s.truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, double(head_dim - 1));
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < half; ++i) {
        const double freq = std::pow(theta, -2.0 * i / head_dim);
        double divisor = 1.0;
        switch (s.type) {
        case rope_scaling::kind::none: break;
        case rope_scaling::kind::linear: divisor = s.factor; break;
        case rope_scaling::kind::llama3: { // long wavelengths scaled, short ones kept, smooth between
            const double wavelen = 2 * std::numbers::pi / freq;
            const double low_wavelen = s.original_ctx / s.low_freq_factor,
                         high_wavelen = s.original_ctx / s.high_freq_factor;
            if (wavelen > low_wavelen) {
                divisor = s.factor;
            } else if (wavelen >= high_wavelen) {
                const double smooth =
                    (s.original_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                divisor = 1.0 / ((1 - smooth) / s.factor + smooth);
            }
            break;
        }
        case rope_scaling::kind::yarn: { // interpolated past the ramp, extrapolated before it
            const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
            divisor = 1.0 / (ramp / s.factor + (1 - ramp));
            break;
        }
        }
        out[size_t(i)] = static_cast<float>(divisor);
    }
    return out;
}

float rope_attn_factor(const rope_scaling& s) {
    if (s.type != rope_scaling::kind::yarn) return 1.0f;
    if (s.attention_factor) return static_cast<float>(*s.attention_factor);
    if (s.mscale != 0 && s.mscale_all_dim != 0) {
        return static_cast<float>(yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim));
    }
    return static_cast<float>(yarn_mscale(s.factor, 1.0));
}

} // namespace colibri
