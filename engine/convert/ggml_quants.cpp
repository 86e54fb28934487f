#include "convert/ggml_quants.h"

#include "core/error.h"
#include "core/half.h"
#include "format/row_codec.h"

#include <cstring>

namespace colibri::ggml {

namespace {

constexpr type_info types[] = {
    {f32, "F32", 1, 4, true},           {f16, "F16", 1, 2, true},        {q4_0, "Q4_0", 32, 18, true},
    {q4_1, "Q4_1", 32, 20, true},       {4, "Q4_2", 32, 20, false}, // removed from ggml long ago
    {5, "Q4_3", 32, 24, false},         {q5_0, "Q5_0", 32, 22, true},    {q5_1, "Q5_1", 32, 24, true},
    {q8_0, "Q8_0", 32, 34, true},       {q8_1, "Q8_1", 32, 36, false},   {q2_k, "Q2_K", 256, 84, true},
    {q3_k, "Q3_K", 256, 110, true},     {q4_k, "Q4_K", 256, 144, true},  {q5_k, "Q5_K", 256, 176, true},
    {q6_k, "Q6_K", 256, 210, true},     {q8_k, "Q8_K", 256, 292, false}, {16, "IQ2_XXS", 256, 66, false},
    {17, "IQ2_XS", 256, 74, false},     {18, "IQ3_XXS", 256, 98, false}, {19, "IQ1_S", 256, 50, false},
    {iq4_nl, "IQ4_NL", 32, 18, true},   {21, "IQ3_S", 256, 110, false},  {22, "IQ2_S", 256, 82, false},
    {iq4_xs, "IQ4_XS", 256, 136, true}, {24, "I8", 1, 1, false},         {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},           {27, "I64", 1, 8, false},        {28, "F64", 1, 8, false},
    {29, "IQ1_M", 256, 56, false},      {bf16, "BF16", 1, 2, true},      {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false},      {39, "MXFP4", 32, 17, false},
};

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float half_at(const uint8_t* p) { return f16_to_f32(le16(p)); }

} // namespace

const type_info* find_type(uint32_t id) {
    for (const type_info& t : types) {
        if (t.id == id) return &t;
    }
    return nullptr;
}

std::string type_name(uint32_t id) {
    const type_info* t = find_type(id);
    return t != nullptr ? std::string(t->name) : "type " + std::to_string(id);
}

std::string_view readable_types() {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

uint64_t row_bytes(uint32_t id, uint64_t n) {
    const type_info* t = find_type(id);
    if (t == nullptr || n % t->block != 0) return 0;
    return n / t->block * t->block_bytes;
}

void dequantize_row(uint32_t id, const uint8_t* row, float* out, int64_t n) {
    const type_info* t = find_type(id);
    COLIBRI_ASSERT(t != nullptr && t->readable && n % t->block == 0);
    const int64_t nb = n / t->block;
    const uint8_t* b = row;
    switch (id) {
    case f32: std::memcpy(out, row, static_cast<size_t>(n) * 4); return;
    case f16:
        for (int64_t i = 0; i < n; ++i) out[i] = half_at(row + 2 * i);
        return;
    case bf16:
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(le16(row + 2 * i));
        return;
    case q8_0: // f16 d, i8 q[32]: x = d q
        for (int64_t ib = 0; ib < nb; ++ib, b += 34, out += 32) {
            const float d = half_at(b);
            for (int i = 0; i < 32; ++i) out[i] = d * static_cast<int8_t>(b[2 + i]);
        }
        return;
    case q4_0: // f16 d, u8 qs[16]: element i low nibble of qs[i], i+16 high nibble; x = d (q - 8)
        for (int64_t ib = 0; ib < nb; ++ib, b += 18, out += 32) {
            const float d = half_at(b);
            for (int i = 0; i < 16; ++i) {
                out[i] = d * static_cast<float>((b[2 + i] & 15) - 8);
                out[i + 16] = d * ((b[2 + i] >> 4) - 8);
            }
        }
        return;
    case q4_1: format::row_to_f32(format::dtype::q4_1, row, out, n); return; // docs/model-format.md
    case q5_0: format::row_to_f32(format::dtype::q5_0, row, out, n); return;
    case q5_1: format::row_to_f32(format::dtype::q5_1, row, out, n); return;
    case iq4_nl: format::row_to_f32(format::dtype::iq4_nl, row, out, n); return;
    case iq4_xs: format::row_to_f32(format::dtype::iq4_xs, row, out, n); return;
    case q2_k: format::row_to_f32(format::dtype::q2_k, row, out, n); return;
    case q3_k: format::row_to_f32(format::dtype::q3_k, row, out, n); return;
    case q4_k: format::row_to_f32(format::dtype::q4_k, row, out, n); return; // docs/model-format.md
    case q5_k: format::row_to_f32(format::dtype::q5_k, row, out, n); return;
    case q6_k: format::row_to_f32(format::dtype::q6_k, row, out, n); return;
    default: break;
    }
    COLIBRI_ASSERT(false);
}

} // namespace colibri::ggml
