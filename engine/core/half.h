#pragma once
// IEEE half and bfloat16 conversions (round to nearest even).

#include <bit>
#include <cstdint>

namespace colibri {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40); // NaN
    u += 0x7FFFu + ((u >> 16) & 1);
    return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__) || defined(__FLT16_MAX__)
    return static_cast<float>(std::bit_cast<_Float16>(h));
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    if (exp == 0) {
        if (mant == 0) return std::bit_cast<float>(sign);
        float f = static_cast<float>(mant) * (1.0f / 16777216.0f); // subnormal: mant * 2^-24
        return (sign != 0u) ? -f : f;
    }
    if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
    return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
#endif
}

inline uint16_t f32_to_f16(float f) {
#if defined(__FLT16_MAX__)
    return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
#else
    // Round to nearest even without _Float16 (clang 14 on x86): F. Giesen's conversion
    uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint32_t h;
    if (x >= (127u + 16) << 23) { // 65536 and above, infinities, NaNs
        h = x > 255u << 23 ? 0x7E00u : 0x7C00u;
    } else if (x < 113u << 23) { // a subnormal half or zero: the FPU rounds the shift
        constexpr uint32_t magic = ((127u - 15) + (23 - 10) + 1) << 23;
        h = std::bit_cast<uint32_t>(std::bit_cast<float>(x) + std::bit_cast<float>(magic)) - magic;
    } else { // rebias the exponent, round the 13 dropped bits to even
        x += 0xC8000000u + 0xFFFu + ((x >> 13) & 1u);
        h = x >> 13;
    }
    return static_cast<uint16_t>(h | (sign >> 16));
#endif
}

} // namespace colibri
