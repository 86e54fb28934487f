#include "format/format.h"

#include <array>
#include <cstring>

namespace colibri::format {

namespace {
constexpr std::array<std::string_view, dtype_count> dtype_names = {"f32", "f16", "bf16", "q8_0",
                                                                   "q4_0", "q4_0x8", "q8_0x8", "q4_k", "q5_k", "q6_k"};
constexpr std::array<std::string_view, arch_max + 1> arch_names = {
    "unknown", "llama", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granite_moe", "qwen2", "qwen3", "granite", "starcoder2", "gemma3", "gemma2"};
} // namespace

std::string_view dtype_name(dtype t) {
    auto i = static_cast<uint32_t>(t);
    return i < dtype_count ? dtype_names[i] : "unknown";
}

bool parse_dtype(std::string_view name, dtype& out) {
    for (uint32_t i = 0; i < dtype_count; ++i) {
        if (dtype_names[i] == name) {
            out = static_cast<dtype>(i);
            return true;
        }
    }
    return false;
}

uint64_t row_bytes(dtype t, uint64_t n) {
    switch (t) {
    case dtype::f32: return 4 * n;
    case dtype::f16:
    case dtype::bf16: return 2 * n;
    case dtype::q8_0:
    case dtype::q8_0x8: return n % qk ? 0 : n / qk * sizeof(block_q8_0);
    case dtype::q4_0:
    case dtype::q4_0x8: return n % qk ? 0 : n / qk * sizeof(block_q4_0);
    case dtype::q4_k: return n % qk_k ? 0 : n / qk_k * sizeof(block_q4_k);
    case dtype::q5_k: return n % qk_k ? 0 : n / qk_k * sizeof(block_q5_k);
    case dtype::q6_k: return n % qk_k ? 0 : n / qk_k * sizeof(block_q6_k);
    }
    return 0;
}

bool is_quantized(dtype t) { return t == dtype::q8_0 || t == dtype::q4_0 || is_interleaved(t) || is_k_quant(t); }

bool is_k_quant(dtype t) { return t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k; }

int block_elements(dtype t) { return is_k_quant(t) ? qk_k : is_quantized(t) ? qk : 1; }

bool is_interleaved(dtype t) { return t == dtype::q4_0x8 || t == dtype::q8_0x8; }

dtype row_type(dtype t) {
    return t == dtype::q4_0x8 ? dtype::q4_0 : t == dtype::q8_0x8 ? dtype::q8_0 : t;
}

dtype matmul_storage(dtype t, uint64_t rows) {
    if (rows % x8_rows != 0) return t;
    return t == dtype::q4_0 ? dtype::q4_0x8 : t == dtype::q8_0 ? dtype::q8_0x8 : t;
}

namespace {

// Pieces of four bytes in one block of a row: 4 for q4_0 (nibbles), 8 for q8_0.
template <class X8>
constexpr int x8_pieces = sizeof(X8::qs) / (x8_rows * 4);

// Each group of eight rows, block column by block column: the eight blocks' scales, then
// their values in 4-byte pieces, piece k of every row in turn.
template <class Plain, class X8>
void interleave_t(const void* plain_rows, uint64_t rows, uint64_t cols, void* out) {
    const auto* in = static_cast<const Plain*>(plain_rows);
    auto* o = static_cast<X8*>(out);
    const uint64_t nb = cols / qk;
    for (uint64_t g = 0; g < rows / x8_rows; ++g) {
        for (uint64_t ib = 0; ib < nb; ++ib) {
            X8& b = o[g * nb + ib];
            for (int r = 0; r < x8_rows; ++r) {
                const Plain& src = in[(g * x8_rows + uint64_t(r)) * nb + ib];
                b.d[r] = src.d;
                for (int k = 0; k < x8_pieces<X8>; ++k) std::memcpy(b.qs[k][r], src.qs + 4 * k, 4);
            }
        }
    }
}

template <class Plain, class X8>
void row_t(const void* matrix, uint64_t cols, uint64_t r, void* out_row) {
    const uint64_t nb = cols / qk;
    const auto* g = static_cast<const X8*>(matrix) + r / x8_rows * nb;
    auto* o = static_cast<Plain*>(out_row);
    const int i = static_cast<int>(r % x8_rows);
    for (uint64_t ib = 0; ib < nb; ++ib) {
        o[ib].d = g[ib].d[i];
        for (int k = 0; k < x8_pieces<X8>; ++k) std::memcpy(o[ib].qs + 4 * k, g[ib].qs[k][i], 4);
    }
}

} // namespace

void interleave_x8(dtype t, const void* plain_rows, uint64_t rows, uint64_t cols, void* out) {
    if (t == dtype::q4_0x8) interleave_t<block_q4_0, block_q4_0x8>(plain_rows, rows, cols, out);
    if (t == dtype::q8_0x8) interleave_t<block_q8_0, block_q8_0x8>(plain_rows, rows, cols, out);
}

void x8_row(dtype t, const void* matrix, uint64_t cols, uint64_t r, void* out_row) {
    if (t == dtype::q4_0x8) row_t<block_q4_0, block_q4_0x8>(matrix, cols, r, out_row);
    if (t == dtype::q8_0x8) row_t<block_q8_0, block_q8_0x8>(matrix, cols, r, out_row);
}

std::string_view arch_name(arch a) {
    auto i = static_cast<uint32_t>(a);
    return i <= arch_max ? arch_names[i] : "unknown";
}

} // namespace colibri::format
