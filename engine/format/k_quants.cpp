#include "format/k_quants.h"

#include "core/half.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace colibri::format {

namespace {

constexpr int sub = 32;   // elements per q4_k/q5_k sub-block
constexpr int sub6 = 16;  // elements per q6_k sub-block
constexpr int sweep = 20; // candidate scales per sub-block: (nmax - 1 .. nmax + 1) / range

int round_clamp(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi); }

// The scale a >= 0 and offset b <= 0 of x ~ a q + b, q in [0, nmax], fitted with weights w.
// Returns a and sets m = -b.
float fit_affine(const float* x, const float* w, int n, int nmax, float& m) {
    float lo = *std::min_element(x, x + n), hi = *std::max_element(x, x + n);
    lo = std::min(lo, 0.0f); // the offset only ever lowers: m >= 0 as stored
    m = -lo;
    if (hi <= lo) return 0.0f;
    float best_err = std::numeric_limits<float>::max(), best_a = 0.0f, best_b = lo;
    uint8_t cand[sub];
    for (int is = -1; is <= sweep; ++is) {
        const float iscale = (is < 0 ? float(nmax) : float(nmax) - 1.0f + 0.1f * float(is)) / (hi - lo);
        double sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
        for (int i = 0; i < n; ++i) {
            cand[i] = static_cast<uint8_t>(round_clamp(iscale * (x[i] - lo), 0, nmax));
            const double l = cand[i];
            sw += w[i];
            sl += w[i] * l;
            sll += w[i] * l * l;
            sx += w[i] * x[i];
            slx += w[i] * l * x[i];
        }
        const double det = sw * sll - sl * sl;
        if (det <= 0) continue;
        double a = (sw * slx - sl * sx) / det, b = (sll * sx - sl * slx) / det;
        if (b > 0) { // keep b <= 0: refit the scale alone
            b = 0;
            a = slx / sll;
        }
        if (a <= 0) continue;
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float d = float(a) * cand[i] + float(b) - x[i];
            err += w[i] * d * d;
        }
        if (err < best_err) {
            best_err = err;
            best_a = float(a);
            best_b = float(b);
        }
    }
    m = -best_b;
    return best_a;
}

// The scale a of x ~ a q over q in [-32, 31], weights x^2; the largest magnitude maps near -32.
float fit_symmetric(const float* x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax == 0.0f) return 0.0f;
    float best_err = std::numeric_limits<float>::max(), best = 0.0f;
    for (int is = -9; is <= 9; ++is) {
        const float iscale = -(32.0f + 0.1f * float(is)) / max;
        double sxl = 0, sll = 0;
        for (int i = 0; i < n; ++i) {
            const double l = round_clamp(iscale * x[i], -32, 31), w = double(x[i]) * x[i];
            sxl += w * x[i] * l;
            sll += w * l * l;
        }
        if (sll <= 0) continue;
        const float a = float(sxl / sll);
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float d = x[i] - a * float(round_clamp(x[i] / a, -32, 31));
            err += x[i] * x[i] * d * d;
        }
        if (err < best_err) {
            best_err = err;
            best = a;
        }
    }
    return best;
}

// The inverse of format::k_scale_min for all eight sub-blocks.
void pack_scale_mins(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
    for (int j = 0; j < 4; ++j) {
        s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

void q6_k_from_f32(const float* x, format::block_q6_k& b) {
    float scales[qk_k / sub6], max_scale = 0.0f;
    for (int j = 0; j < qk_k / sub6; ++j) {
        scales[j] = fit_symmetric(x + sub6 * j, sub6);
        if (std::fabs(scales[j]) > std::fabs(max_scale)) max_scale = scales[j];
    }
    std::fill(std::begin(b.ql), std::end(b.ql), uint8_t(0));
    std::fill(std::begin(b.qh), std::end(b.qh), uint8_t(0));
    if (max_scale == 0.0f) { // all zero
        b.d = 0;
        std::fill(std::begin(b.scales), std::end(b.scales), int8_t(0));
        return;
    }
    const float iscale = -128.0f / max_scale; // the largest scale maps to -128
    b.d = f32_to_f16(1.0f / iscale);
    const float d = f16_to_f32(b.d);
    // each 8-bit scale: of the two levels either side, the one with the lesser error
    for (int j = 0; j < qk_k / sub6; ++j) {
        const float* xs = x + sub6 * j;
        const int s0 = std::clamp(int(std::floor(iscale * scales[j])), -128, 127);
        float best_err = std::numeric_limits<float>::max();
        for (int a = s0; a <= std::min(s0 + 1, 127); ++a) {
            const float dl = d * float(a);
            float err = 0;
            for (int i = 0; i < sub6; ++i) {
                const float e = (dl != 0.0f ? dl * float(round_clamp(xs[i] / dl, -32, 31)) : 0.0f) - xs[i];
                err += e * e;
            }
            if (err < best_err) {
                best_err = err;
                b.scales[j] = static_cast<int8_t>(a);
            }
        }
    }
    for (int e = 0; e < qk_k; ++e) {
        const float dl = d * float(b.scales[e / sub6]);
        const int q = (dl != 0.0f ? round_clamp(x[e] / dl, -32, 31) : 0) + 32;
        const int h = e / 128, k = e % 128 / 32, l = e % 32;
        b.ql[64 * h + 32 * (k % 2) + l] |= static_cast<uint8_t>((q & 15) << (4 * (k / 2)));
        b.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
    }
}

// q4_k (qh null) or q5_k: the header fields are the same (block_q4_k's prefix).
void q45_k_from_f32(const float* x, int nmax, format::block_q4_k& head, uint8_t* qs, uint8_t* qh) {
    float scales[qk_k / sub], mins[qk_k / sub], w[sub], max_scale = 0.0f, max_min = 0.0f;
    uint8_t q[qk_k];
    for (int j = 0; j < qk_k / sub; ++j) {
        const float* xs = x + sub * j;
        float ss = 0;
        for (int i = 0; i < sub; ++i) ss += xs[i] * xs[i];
        const float rms = std::sqrt(ss / sub);
        for (int i = 0; i < sub; ++i) w[i] = rms + std::fabs(xs[i]); // large values weigh more
        scales[j] = fit_affine(xs, w, sub, nmax, mins[j]);
        max_scale = std::max(max_scale, scales[j]);
        max_min = std::max(max_min, mins[j]);
    }
    head.d = f32_to_f16(max_scale / 63.0f);
    head.dmin = f32_to_f16(max_min / 63.0f);
    const float d = f16_to_f32(head.d), dmin = f16_to_f32(head.dmin);
    // Each sub-block's 6-bit scale and min: of the levels either side of the fitted values,
    // the pair with the least squared error once the values are quantised against it.
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
        const float* xs = x + sub * j;
        const int sc0 = d > 0 ? std::clamp(int(scales[j] / d), 0, 63) : 0,
                  m0 = dmin > 0 ? std::clamp(int(mins[j] / dmin), 0, 63) : 0;
        float best_err = std::numeric_limits<float>::max();
        for (int a = sc0; a <= std::min(sc0 + 1, 63); ++a) {
            for (int b = m0; b <= std::min(m0 + 1, 63); ++b) {
                const float dl = d * float(a), ml = dmin * float(b);
                float err = 0;
                for (int i = 0; i < sub; ++i) {
                    const int l = dl > 0 ? round_clamp((xs[i] + ml) / dl, 0, nmax) : 0;
                    const float e = dl * float(l) - ml - xs[i];
                    err += e * e;
                }
                if (err < best_err) {
                    best_err = err;
                    sc[j] = static_cast<uint8_t>(a);
                    m[j] = static_cast<uint8_t>(b);
                }
            }
        }
    }
    pack_scale_mins(sc, m, head.scales);
    for (int j = 0; j < 8; ++j) {
        const float dl = d * sc[j], ml = dmin * m[j];
        for (int i = 0; i < sub; ++i) {
            q[sub * j + i] = static_cast<uint8_t>(dl > 0 ? round_clamp((x[sub * j + i] + ml) / dl, 0, nmax) : 0);
        }
    }
    std::fill_n(qs, qk_k / 2, uint8_t(0));
    if (qh) std::fill_n(qh, 32, uint8_t(0));
    for (int j = 0; j < 8; ++j) {
        for (int l = 0; l < 32; ++l) {
            const int v = q[32 * j + l];
            qs[32 * (j / 2) + l] |= static_cast<uint8_t>((v & 15) << (4 * (j % 2)));
            if (qh) qh[l] |= static_cast<uint8_t>((v >> 4) << j);
        }
    }
}

} // namespace

void k_block_to_f32(dtype t, const uint8_t* block, float* out) {
    if (t == dtype::q6_k) {
        const auto& b = *reinterpret_cast<const format::block_q6_k*>(block);
        const float d = f16_to_f32(b.d);
        for (int e = 0; e < qk_k; ++e) {
            const int h = e / 128, k = e % 128 / 32, l = e % 32;
            const int lo = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
            const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
            out[e] = d * static_cast<float>(b.scales[e / 16]) * static_cast<float>((lo | (hi << 4)) - 32);
        }
        return;
    }
    const bool five = t == dtype::q5_k;
    const auto& b4 = *reinterpret_cast<const format::block_q4_k*>(block);
    const auto& b5 = *reinterpret_cast<const format::block_q5_k*>(block);
    const float d = f16_to_f32(b4.d), dmin = f16_to_f32(b4.dmin);
    const uint8_t* qs = five ? b5.qs : b4.qs;
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        format::k_scale_min(b4.scales, j, sc, m);
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
            if (five) q |= ((b5.qh[l] >> j) & 1) << 4;
            out[32 * j + l] = dl * static_cast<float>(q) - ml;
        }
    }
}

void k_block_from_f32(dtype t, const float* x, uint8_t* block) {
    switch (t) {
    case dtype::q6_k: q6_k_from_f32(x, *reinterpret_cast<format::block_q6_k*>(block)); return;
    case dtype::q5_k: {
        auto& b = *reinterpret_cast<format::block_q5_k*>(block);
        q45_k_from_f32(x, 31, *reinterpret_cast<format::block_q4_k*>(block), b.qs, b.qh);
        return;
    }
    default: {
        auto& b = *reinterpret_cast<format::block_q4_k*>(block);
        q45_k_from_f32(x, 15, b, b.qs, nullptr);
        return;
    }
    }
}

} // namespace colibri::format
