#include "format/format.h"

#include "colibri/enum_names.hpp"

#include <array>
#include <cstring>
#include <type_traits>

namespace colibri::format {

namespace {
constexpr std::array<enum_name_pair<dtype>, dtype_count> dtype_names{{
    {dtype::f32, "f32"},           {dtype::f16, "f16"},       {dtype::bf16, "bf16"},     {dtype::q8_0, "q8_0"},
    {dtype::q4_0, "q4_0"},         {dtype::q4_0x8, "q4_0x8"}, {dtype::q8_0x8, "q8_0x8"}, {dtype::q4_k, "q4_k"},
    {dtype::q5_k, "q5_k"},         {dtype::q6_k, "q6_k"},     {dtype::q4_kx8, "q4_kx8"}, {dtype::q5_kx8, "q5_kx8"},
    {dtype::q6_kx8, "q6_kx8"},     {dtype::q4_1, "q4_1"},     {dtype::q5_0, "q5_0"},     {dtype::q5_1, "q5_1"},
    {dtype::iq4_nl, "iq4_nl"},     {dtype::iq4_xs, "iq4_xs"}, {dtype::q2_k, "q2_k"},     {dtype::q3_k, "q3_k"},
    {dtype::iq4_xsx8, "iq4_xsx8"}, {dtype::q4_1x8, "q4_1x8"}, {dtype::q5_0x8, "q5_0x8"}, {dtype::q5_1x8, "q5_1x8"},
    {dtype::iq4_nlx8, "iq4_nlx8"}, {dtype::q2_kx8, "q2_kx8"}, {dtype::q3_kx8, "q3_kx8"},
}};
static_assert([] { // every type named, in order
    for (uint32_t i = 0; i < dtype_count; ++i) {
        if (static_cast<uint32_t>(dtype_names[i].first) != i || dtype_names[i].second.empty()) return false;
    }
    return true;
}());
constexpr std::array<std::string_view, arch_max + 1> arch_names = {
    "unknown", "llama", "mixtral", "qwen2_moe",  "qwen3_moe", "olmoe",  "granite_moe",
    "qwen2",   "qwen3", "granite", "starcoder2", "gemma3",    "gemma2", "deepseek2"};
} // namespace

std::string_view dtype_name(dtype t) { return enum_name(dtype_names, t, "unknown"); }

bool parse_dtype(std::string_view name, dtype& out) {
    const auto t = enum_value(dtype_names, name);
    if (t) out = *t;
    return t.has_value();
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
    case dtype::q4_k:
    case dtype::q4_kx8: return n % qk_k ? 0 : n / qk_k * sizeof(block_q4_k);
    case dtype::q5_k:
    case dtype::q5_kx8: return n % qk_k ? 0 : n / qk_k * sizeof(block_q5_k);
    case dtype::q6_k:
    case dtype::q6_kx8: return n % qk_k ? 0 : n / qk_k * sizeof(block_q6_k);
    case dtype::q4_1:
    case dtype::q4_1x8: return n % qk ? 0 : n / qk * sizeof(block_q4_1);
    case dtype::q5_0:
    case dtype::q5_0x8: return n % qk ? 0 : n / qk * sizeof(block_q5_0);
    case dtype::q5_1:
    case dtype::q5_1x8: return n % qk ? 0 : n / qk * sizeof(block_q5_1);
    case dtype::iq4_nl:
    case dtype::iq4_nlx8: return n % qk ? 0 : n / qk * sizeof(block_iq4_nl);
    case dtype::iq4_xs:
    case dtype::iq4_xsx8: return n % qk_k ? 0 : n / qk_k * sizeof(block_iq4_xs);
    case dtype::q2_k:
    case dtype::q2_kx8: return n % qk_k ? 0 : n / qk_k * sizeof(block_q2_k);
    case dtype::q3_k:
    case dtype::q3_kx8: return n % qk_k ? 0 : n / qk_k * sizeof(block_q3_k);
    }
    return 0;
}

bool is_quantized(dtype t) {
    return t == dtype::q8_0 || t == dtype::q4_0 || is_interleaved(t) || is_k_quant(t) || is_read_only(t);
}

bool is_k_quant(dtype t) { return t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k; }

bool is_read_only(dtype t) {
    return t == dtype::q4_1 || t == dtype::q5_0 || t == dtype::q5_1 || t == dtype::iq4_nl || t == dtype::iq4_xs ||
           t == dtype::q2_k || t == dtype::q3_k;
}

int block_elements(dtype t) {
    const dtype r = row_type(t);
    const bool super = r == dtype::iq4_xs || r == dtype::q2_k || r == dtype::q3_k;
    return is_k_quant(r) || super ? qk_k : is_quantized(t) ? qk : 1;
}

bool is_interleaved(dtype t) { return row_type(t) != t; }

dtype row_type(dtype t) {
    switch (t) {
    case dtype::q4_0x8: return dtype::q4_0;
    case dtype::q8_0x8: return dtype::q8_0;
    case dtype::q4_kx8: return dtype::q4_k;
    case dtype::q5_kx8: return dtype::q5_k;
    case dtype::q6_kx8: return dtype::q6_k;
    case dtype::iq4_xsx8: return dtype::iq4_xs;
    case dtype::q4_1x8: return dtype::q4_1;
    case dtype::q5_0x8: return dtype::q5_0;
    case dtype::q5_1x8: return dtype::q5_1;
    case dtype::iq4_nlx8: return dtype::iq4_nl;
    case dtype::q2_kx8: return dtype::q2_k;
    case dtype::q3_kx8: return dtype::q3_k;
    default: return t;
    }
}

dtype matmul_storage(dtype t, uint64_t rows) {
    if (rows % x8_rows != 0) return t;
    switch (t) {
    case dtype::q4_0: return dtype::q4_0x8;
    case dtype::q8_0: return dtype::q8_0x8;
    case dtype::q4_k: return dtype::q4_kx8;
    case dtype::q5_k: return dtype::q5_kx8;
    case dtype::q6_k: return dtype::q6_kx8;
    case dtype::iq4_xs: return dtype::iq4_xsx8;
    case dtype::q4_1: return dtype::q4_1x8;
    case dtype::q5_0: return dtype::q5_0x8;
    case dtype::q5_1: return dtype::q5_1x8;
    case dtype::iq4_nl: return dtype::iq4_nlx8;
    case dtype::q2_k: return dtype::q2_kx8;
    case dtype::q3_k: return dtype::q3_kx8;
    default: return t;
    }
}

namespace {

template <class Plain>
constexpr uint64_t block_elems = sizeof(Plain) <= sizeof(block_q8_0) ? qk
                                                                     : qk_k; // the 32-element blocks are the small ones

// Row r's block p into an interleaved block b (Put), or back out of it: the scales, then
// the values in 4-byte pieces, piece k of every row in turn.
template <bool Put, class X8, class Plain>
void pieces(X8& b, int r, Plain& p) {
    using P = std::remove_const_t<Plain>;
    const auto copy = [](auto* in_x8, auto* in_plain, size_t n) {
        if constexpr (Put) std::memcpy(in_x8, in_plain, n);
        else std::memcpy(in_plain, in_x8, n);
    };
    copy(&b.d[r], &p.d, 2);
    if constexpr (block_elems<P> == qk) { // q4_0, q8_0, q4_1, q5_0, q5_1, iq4_nl
        for (size_t k = 0; k < sizeof(p.qs) / 4; ++k) copy(b.qs[k][r], p.qs + 4 * k, 4);
        if constexpr (requires { p.m; }) copy(&b.m[r], &p.m, 2);
        if constexpr (requires { p.qh; }) copy(&b.qh[r], p.qh, 4);
    } else if constexpr (std::is_same_v<P, block_iq4_xs>) {
        copy(&b.scales_h[r], &p.scales_h, 2);
        copy(&b.scales_l[r], p.scales_l, 4);
        for (int j = 0; j < 8; ++j) {
            for (int k = 0; k < 4; ++k) copy(b.qs[j][k][r], p.qs + 16 * j + 4 * k, 4);
        }
    } else if constexpr (std::is_same_v<P, block_q2_k> || std::is_same_v<P, block_q3_k>) {
        for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 8; ++i) copy(b.qs[h][i][r], p.qs + 32 * h + 4 * i, 4);
        }
        if constexpr (std::is_same_v<P, block_q2_k>) {
            copy(&b.dmin[r], &p.dmin, 2);
            for (int k = 0; k < 16; ++k) copy(&b.scales[k][r], &p.scales[k], 1);
        } else {
            for (int w = 0; w < 3; ++w) copy(&b.scales[w][r], p.scales + 4 * w, 4);
            for (int i = 0; i < 8; ++i) copy(b.hmask[i][r], p.hmask + 4 * i, 4);
        }
    } else if constexpr (std::is_same_v<P, block_q6_k>) {
        for (int k = 0; k < 16; ++k) copy(&b.scales[k][r], &p.scales[k], 1);
        for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 8; ++i) {
                copy(b.ql[h][0][i][r], p.ql + 64 * h + 4 * i, 4);
                copy(b.ql[h][1][i][r], p.ql + 64 * h + 32 + 4 * i, 4);
                copy(b.qh[h][i][r], p.qh + 32 * h + 4 * i, 4);
            }
        }
    } else { // q4_k, q5_k
        copy(&b.dmin[r], &p.dmin, 2);
        for (int w = 0; w < 3; ++w) copy(&b.scales[w][r], p.scales + 4 * w, 4);
        for (int c = 0; c < 4; ++c) {
            for (int i = 0; i < 8; ++i) copy(b.qs[c][i][r], p.qs + 32 * c + 4 * i, 4);
        }
        if constexpr (std::is_same_v<P, block_q5_k>) {
            for (int i = 0; i < 8; ++i) copy(b.qh[i][r], p.qh + 4 * i, 4);
        }
    }
}

// Each group of eight rows, block column by block column.
template <class Plain, class X8>
void interleave_t(const void* plain_rows, uint64_t rows, uint64_t cols, void* out) {
    const auto* in = static_cast<const Plain*>(plain_rows);
    auto* o = static_cast<X8*>(out);
    const uint64_t nb = cols / block_elems<Plain>;
    for (uint64_t g = 0; g < rows / x8_rows; ++g) {
        for (uint64_t ib = 0; ib < nb; ++ib) {
            for (int r = 0; r < x8_rows; ++r)
                pieces<true>(o[g * nb + ib], r, in[(g * x8_rows + uint64_t(r)) * nb + ib]);
        }
    }
}

template <class Plain, class X8>
void row_t(const void* matrix, uint64_t cols, uint64_t r, void* out_row) {
    const uint64_t nb = cols / block_elems<Plain>;
    const auto* g = static_cast<const X8*>(matrix) + r / x8_rows * nb;
    auto* o = static_cast<Plain*>(out_row);
    for (uint64_t ib = 0; ib < nb; ++ib) pieces<false>(g[ib], static_cast<int>(r % x8_rows), o[ib]);
}

// Calls f with the plain and interleaved block types of the interleaved type t.
template <class F>
void with_x8_blocks(dtype t, F&& f) {
    switch (t) {
    case dtype::q4_0x8: f(block_q4_0{}, block_q4_0x8{}); return;
    case dtype::q8_0x8: f(block_q8_0{}, block_q8_0x8{}); return;
    case dtype::q4_kx8: f(block_q4_k{}, block_q4_kx8{}); return;
    case dtype::q5_kx8: f(block_q5_k{}, block_q5_kx8{}); return;
    case dtype::q6_kx8: f(block_q6_k{}, block_q6_kx8{}); return;
    case dtype::iq4_xsx8: f(block_iq4_xs{}, block_iq4_xsx8{}); return;
    case dtype::q4_1x8: f(block_q4_1{}, block_q4_1x8{}); return;
    case dtype::q5_0x8: f(block_q5_0{}, block_q5_0x8{}); return;
    case dtype::q5_1x8: f(block_q5_1{}, block_q5_1x8{}); return;
    case dtype::iq4_nlx8: f(block_iq4_nl{}, block_iq4_nlx8{}); return;
    case dtype::q2_kx8: f(block_q2_k{}, block_q2_kx8{}); return;
    case dtype::q3_kx8: f(block_q3_k{}, block_q3_kx8{}); return;
    default: return;
    }
}

} // namespace

void interleave_x8(dtype t, const void* plain_rows, uint64_t rows, uint64_t cols, void* out) {
    with_x8_blocks(
        t, [&](auto plain, auto x8) { interleave_t<decltype(plain), decltype(x8)>(plain_rows, rows, cols, out); });
}

void x8_row(dtype t, const void* matrix, uint64_t cols, uint64_t r, void* out_row) {
    with_x8_blocks(t, [&](auto plain, auto x8) { row_t<decltype(plain), decltype(x8)>(matrix, cols, r, out_row); });
}

std::string_view arch_name(arch a) {
    auto i = static_cast<uint32_t>(a);
    return i <= arch_max ? arch_names[i] : "unknown";
}

} // namespace colibri::format
