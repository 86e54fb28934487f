#pragma once
// The kernel table: the CPU backend's hot kernels (integer tiles and decode streams,
// attention, activations) behind one table per instruction set, chosen at run time from
// what the CPU reports, so one binary runs everywhere. The SIMD tables reproduce the
// scalar one (kernel_table_scalar.cpp) bit for bit (tests/engine/test_kernel_tables.cpp).

#include "format/format.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace colibri {

/// Activations quantised for integer dot products with the quantised weights: blocks of 32
/// int8 values in [-127, 127] with an f32 scale, x = d * q, and the sum of the qs.
/// quantize_x gives each block its own scale and the sum of its first 16 qs (q6_k's
/// sub-blocks are 16 wide); quantize_x_k one scale to each 256 values (eight blocks), which
/// q4_k, q5_k and iq4_xs weights take (superblock_activations), and pairs of sums. dsum, d
/// times the sum in f32, is what a q4_1 or q5_1 block's min multiplies.
struct block_q8_x {
    float d;
    int32_t sum;
    int8_t qs[format::qk];
    union {
        int32_t sum_lo;   // quantize_x's
        int32_t sum_pair; // quantize_x_k's, in even blocks (set_sum_pairs)
    };
    float dsum;
};
static_assert(sizeof(block_q8_x) == 48);

/// quantize_x_k's last step on a super-block's eight blocks: blocks 2c's and 2c + 1's sums
/// as the int16 halves of block 2c's sum_pair (|sum| <= 32 * 127), which the q4_k and q5_k
/// tiles multiply by two sub-blocks' mins at once (pmaddwd / vpdpwssd).
inline void set_sum_pairs(block_q8_x* blocks) {
    for (int c = 0; c < 4; ++c) {
        blocks[2 * c].sum_pair =
            static_cast<int32_t>(uint32_t(uint16_t(blocks[2 * c].sum)) | uint32_t(blocks[2 * c + 1].sum) << 16);
    }
}

/// An interleaved type's tile: n_groups (1..4) groups of eight rows (`stride` bytes apart)
/// by n_tok (1..8) quantised activation vectors (`x_stride` blocks apart), n columns:
/// out[(t * n_groups + g) * 8 + r] = row r of group g . x_t. once: no other call reads these
/// weights (decode, short batches): they come from memory, asked for into L2 further ahead;
/// else (prefill's blocks, read again for each chunk of tokens) from L2 into L1.
using x8_tile_fn = void (*)(const void* groups, size_t stride, int n_groups, const block_q8_x* x, size_t x_stride,
                            int n_tok, int64_t n, bool once, float* out);
/// Decode's four streams of an interleaved type: group s at groups[s] with its own
/// activations x[s]: out[s * 8 + r] = row r of group s . x[s].
using x8_streams_fn = void (*)(const void* const groups[4], const block_q8_x* const x[4], int64_t n, float* out);

struct kernel_table {
    const char* name;
    /// x [n] (n a multiple of 32) -> n/32 blocks
    void (*quantize_x)(const float* x, block_q8_x* out, int64_t n);
    /// x [n] (n a multiple of 256) -> n/32 blocks, each eight with the scale of their 256
    /// values (as llama.cpp's q8_K)
    void (*quantize_x_k)(const float* x, block_q8_x* out, int64_t n);
    /// Integer dot products of a tile: four weight rows (`stride` bytes apart; 0 repeats
    /// one row) with n_tok (1..4) quantised activation vectors (`x_stride` blocks apart):
    /// out[t * 4 + r] = row_r . x_t. Each block's integer sums are exact; they are scaled
    /// and added in f32 in a fixed order (q8_0: elements 0-15 and 16-31 of every block in
    /// two sums; q4_0: even and odd blocks in two sums; then the two added), the same in
    /// every table and for every tile, so SIMD tables match the reference bit for bit and
    /// batching never changes a result.
    void (*tile_q8_0)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_q4_0)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    /// The same for K-quant rows (n a multiple of 256). Each 32-element sub-block's integer
    /// sums with its activation block are exact and scaled in f32; a super-block's eight
    /// are added in a fixed tree, and the super-blocks one after another (kernel_table_scalar.cpp's
    /// dot_k). q4_k, q5_k and iq4_xs take quantize_x_k's activations: their sub-blocks' sums
    /// go into one multiply-add chain by the rows' d sc, the mins as one integer sum, and
    /// the activations' scale multiplies a super-block once.
    void (*tile_q4_k)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_q5_k)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_q6_k)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    /// The same for the types kept as GGUF files store them (format::is_read_only). iq4_xs,
    /// q2_k and q3_k rows (n a multiple of 256) go as the K-quants'. q4_1, q5_0, q5_1 and iq4_nl rows take
    /// their 32-element blocks eight at a time as if they were a super-block's sub-blocks,
    /// a last short group padded with zeros (kernel_table_scalar.cpp's dot_b32).
    void (*tile_q4_1)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_q5_0)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_q5_1)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_iq4_nl)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                        float* out);
    void (*tile_iq4_xs)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                        float* out);
    void (*tile_q2_k)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    void (*tile_q3_k)(const void* rows, size_t stride, const block_q8_x* x, size_t x_stride, int n_tok, int64_t n,
                      float* out);
    /// Integer dot products of q4_0x8 row groups (x8_tile_fn). Each block's integer sum is
    /// exact; each row's blocks are scaled and added in f32 one after another, in one sum,
    /// the same in every table.
    x8_tile_fn tile_q4_0x8;
    /// The same for q8_0x8 groups.
    x8_tile_fn tile_q8_0x8;
    /// Decode's four streams of q4_0x8 groups (x8_streams_fn), each group's result
    /// bit-identical to tile_q4_0x8 on that group alone. The streams may lie anywhere
    /// (in different matrices): a thread walks four far-apart parts of its rows side by side.
    x8_streams_fn streams_q4_0x8;
    /// The same for q8_0x8 groups.
    x8_streams_fn streams_q8_0x8;
    /// tile_q4_0x8 and streams_q4_0x8 for the interleaved K-quants (n a multiple of 256),
    /// each row's result bit-identical to tile_q4_k's (tile_q5_k's, tile_q6_k's) on it.
    x8_tile_fn tile_q4_kx8;
    x8_tile_fn tile_q5_kx8;
    x8_tile_fn tile_q6_kx8;
    x8_streams_fn streams_q4_kx8;
    x8_streams_fn streams_q5_kx8;
    x8_streams_fn streams_q6_kx8;
    /// The same for iq4_xsx8, each row's result bit-identical to tile_iq4_xs's on it.
    x8_tile_fn tile_iq4_xsx8;
    x8_streams_fn streams_iq4_xsx8;
    /// The same for q4_1x8, q5_0x8, q5_1x8 and iq4_nlx8 (n a multiple of 32), each row's
    /// result bit-identical to its plain type's tile on it.
    x8_tile_fn tile_q4_1x8;
    x8_tile_fn tile_q5_0x8;
    x8_tile_fn tile_q5_1x8;
    x8_tile_fn tile_iq4_nlx8;
    x8_streams_fn streams_q4_1x8;
    x8_streams_fn streams_q5_0x8;
    x8_streams_fn streams_q5_1x8;
    x8_streams_fn streams_iq4_nlx8;
    /// The same for q2_kx8 and q3_kx8 (n a multiple of 256), each row's result bit-identical
    /// to tile_q2_k's (tile_q3_k's) on it.
    x8_tile_fn tile_q2_kx8;
    x8_tile_fn tile_q3_kx8;
    x8_streams_fn streams_q2_kx8;
    x8_streams_fn streams_q3_kx8;
    /// Dot of one weight row with f32 activations.
    float (*dot_q8_0_f32)(const void* row, const float* x, int64_t n);
    float (*dot_q4_0_f32)(const void* row, const float* x, int64_t n);
    /// Four rows (`stride` bytes apart) at once: out[i] = row_i . x.
    void (*dot4_q8_0_f32)(const void* rows, size_t stride, const float* x, int64_t n, float* out);
    void (*dot4_q4_0_f32)(const void* rows, size_t stride, const float* x, int64_t n, float* out);
    /// One row with four activation vectors (x_stride floats apart): out[t] = row . x_t,
    /// each bit-identical to the one-vector kernel (so batching never changes results).
    void (*dotx4_q8_0_f32)(const void* row, const float* x, size_t x_stride, int64_t n, float* out);
    void (*dotx4_q4_0_f32)(const void* row, const float* x, size_t x_stride, int64_t n, float* out);
    float (*dot_f32)(const float* row, const float* x, int64_t n);
    /// One f32 row with four activation vectors (x_stride floats apart): out[t] = row . x_t,
    /// each bit-identical to dot_f32 (a prefill batch's router).
    void (*dotx4_f32)(const float* row, const float* x, size_t x_stride, int64_t n, float* out);
    /// Four f32 rows `stride` floats apart with one activation vector: out[r] = row_r . x,
    /// each bit-identical to dot_f32, read as four memory streams (decode's router).
    void (*dot4_f32)(const float* rows, size_t stride, const float* x, int64_t n, float* out);
    /// n_tok tokens' n_q query heads (token t's at q + t * q_stride, head_dim apart) that
    /// share one key/value head; token t attends to the first n[t] of its cached keys and
    /// values (rows of head_dim, f32 or f16; n ascending): for each query g,
    /// s = softmax(scale * q_g . k_j) over j < n[t], out_g = sum_j s_j v_j (at
    /// out + t * out_stride). Each token gets the bits it gets alone, whatever tokens and
    /// heads share its call. scores: scratch of n_tok * n_q * n[n_tok - 1] floats. next_k
    /// (null: none) is the caller's next call's keys and next_n their count: a hint, their
    /// first rows asked for from memory while this call ends.
    void (*attend)(const float* q, int64_t q_stride, int n_q, int n_tok, const float* k, const float* v, const int* n,
                   int head_dim, float scale, float* scores, float* out, int64_t out_stride, const float* next_k,
                   int next_n);
    void (*attend_f16)(const float* q, int64_t q_stride, int n_q, int n_tok, const uint16_t* k, const uint16_t* v,
                       const int* n, int head_dim, float scale, float* scores, float* out, int64_t out_stride,
                       const uint16_t* next_k, int next_n);
    /// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + e^-gate[i]) * up[i], each element by
    /// the same formula wherever it lies (so batching never changes a result).
    void (*swiglu)(float* gate, const float* up, int64_t n);
    /// n floats to f16, rounded to nearest even.
    void (*to_f16)(const float* x, uint16_t* out, int64_t n);
    float (*dot_f16)(const void* row, const float* x, int64_t n);
    float (*dot_bf16)(const void* row, const float* x, int64_t n);
    /// Reads `bytes` (a multiple of 64 * streams, 32-byte aligned) as `streams` equal parts
    /// side by side (1, 2, 4 or 8), as fast as possible; returns the sum of its 64-bit words
    /// (so the reads cannot be optimised away). For measuring memory bandwidth.
    uint64_t (*read_sum)(const void* p, size_t bytes, int streams);
    /// iterations x 256 int8 multiply-adds with the table's integer dot-product
    /// instructions, on independent registers: the machine's int8 peak. Returns a checksum.
    uint64_t (*madd_loop)(int64_t iterations);
};

/// Groups of eight rows and tokens per prefill call of tile_q4_0x8 and tile_q8_0x8: the
/// 512-bit tiles take groups two by two, and eight tokens share each block's weights; the
/// 256-bit ones take one group by four tokens at a time within the call.
constexpr int x8_prefill_groups = 2, x8_prefill_tokens = 8;

/// The scalar reference.
const kernel_table& scalar_kernel_table();
/// The AVX2+FMA+F16C table, or nullptr when the CPU lacks them (or the build has no x86).
const kernel_table* avx2_kernel_table();
/// The AVX-512 (F, BW, VL) table, named "avx512-vnni" and using VNNI where the CPU has it,
/// else "avx512"; nullptr when the CPU lacks them.
const kernel_table* avx512_kernel_table();
/// On a CPU with VNNI, the "avx512" table as well (for comparisons and tests); else nullptr.
const kernel_table* avx512_no_vnni_kernel_table();
/// The tables this CPU supports, fastest first; the scalar reference last.
std::vector<const kernel_table*> supported_kernel_tables();
/// The fastest table this CPU supports, or the one the environment variable
/// COLIBRI_CPU_KERNELS names (a table name, for comparisons); throws colibri::error when it
/// names none this CPU supports.
const kernel_table& best_kernel_table();

/// Whether t's kernels take quantize_x_k's activations (one scale per 256 values) rather
/// than quantize_x's: q4_k, q5_k and iq4_xs, plain or interleaved.
constexpr bool superblock_activations(format::dtype t) {
    using format::dtype;
    return t == dtype::q4_k || t == dtype::q5_k || t == dtype::iq4_xs || t == dtype::q4_kx8 || t == dtype::q5_kx8 ||
           t == dtype::iq4_xsx8;
}

/// kt's integer tile kernel for plain (not interleaved) rows of t: q8_0, q4_0, a K-quant or
/// a read-only type.
decltype(kernel_table::tile_q8_0) int8_tile(const kernel_table& kt, format::dtype t);
/// kt's kernels for the interleaved type t.
struct x8_kernels {
    x8_tile_fn tile;
    x8_streams_fn streams;
};
x8_kernels int8_x8_kernels(const kernel_table& kt, format::dtype t);

/// kernel_table::attend through a kernel of one token at a time (one(q, n_q, k, v, n,
/// head_dim, scale, scores, out, next_k, next_n)): the tokens in turn, each telling of the
/// next one's keys (the same rows), the last of the caller's.
template <class T, class One>
void attend_by_token(One one, const float* q, int64_t q_stride, int n_q, int n_tok, const T* k, const T* v,
                     const int* n, int head_dim, float scale, float* scores, float* out, int64_t out_stride,
                     const T* next_k, int next_n) {
    for (int t = 0; t < n_tok; ++t) {
        const bool last = t + 1 == n_tok;
        one(q + t * q_stride, n_q, k, v, n[t], head_dim, scale, scores, out + t * out_stride, last ? next_k : k,
            last ? next_n : n[t + 1]);
    }
}

} // namespace colibri
