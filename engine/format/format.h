#pragma once
// The .colibri file layout: on-disk structures, packed little-endian.
// docs/model-format.md is the normative description; keep the two in step.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace colibri::format {

inline constexpr uint8_t magic[8] = {0xC0, 0x4C, 0x31, 0x42, 0x52, 0x31, 0x00, 0x00};
/// Version 2 added rope_attn_factor, sliding_window, flags 4-6 and the rope_freqs tensor;
/// version 3 the latent attention and expert-group fields (kv_lora_rank ..
/// expert_weights_scale). Older files (all zero there, no such tensors) read as version 3.
inline constexpr uint32_t version = 3;
inline constexpr uint32_t min_version = 1;
inline constexpr uint64_t alignment = 64; ///< every section and tensor starts on this
inline constexpr size_t header_size = 512;
inline constexpr size_t tensor_entry_size = 128;
inline constexpr size_t max_name = 64; ///< tensor name bytes including the NUL
inline constexpr int max_dims = 4;

/// Element types. Quantised types store rows of blocks of `qk` elements.
enum class dtype : uint32_t {
    f32 = 0,
    f16 = 1,
    bf16 = 2,
    q8_0 = 3, ///< blocks of 32: f16 scale d, 32 x int8; x = d * q
    q4_0 = 4, ///< blocks of 32: f16 scale d, 16 bytes of nibbles; x = d * (q - 8)
    /// q4_0 blocks of a matrix whose rows come in groups of eight, interleaved so that one
    /// 256-bit load holds four bytes of each row (block_q4_0x8); rows a multiple of 8
    q4_0x8 = 5,
    /// q8_0 blocks of a matrix whose rows come in groups of eight, interleaved so that one
    /// 256-bit load holds four values of each row (block_q8_0x8); rows a multiple of 8
    q8_0x8 = 6,
    /// GGUF's K-quants, blocks as llama.cpp stores them (super-blocks of 256 elements):
    q4_k = 7, ///< 8 sub-blocks of 32, 6-bit scale and min each: x = d sc q - dmin m, q 4-bit
    q5_k = 8, ///< the same with 5-bit q
    q6_k = 9, ///< 16 sub-blocks of 16, int8 scale each: x = d sc (q - 32), q 6-bit
    /// q4_k, q5_k and q6_k super-blocks of a matrix whose rows come in groups of eight,
    /// interleaved like q4_0x8 (block_q4_kx8, block_q5_kx8, block_q6_kx8); rows a multiple of 8
    q4_kx8 = 10,
    q5_kx8 = 11,
    q6_kx8 = 12,
    /// More of GGUF's types, blocks as llama.cpp stores them, kept as read (Colibri has no
    /// quantiser for them):
    q4_1 = 13,   ///< blocks of 32: f16 d and m, 16 bytes of nibbles; x = d q + m
    q5_0 = 14,   ///< blocks of 32: f16 d, 32 fifth bits, nibbles; x = d (q - 16)
    q5_1 = 15,   ///< blocks of 32: f16 d and m, 32 fifth bits, nibbles; x = d q + m
    iq4_nl = 16, ///< blocks of 32: f16 d, nibbles indexing iq4_values; x = d iq4_values[q]
    /// super-blocks of 256: f16 d, 8 sub-blocks of 32 with a 6-bit scale ls each;
    /// x = d (ls - 32) iq4_values[q]
    iq4_xs = 17,
    /// super-blocks of 256: f16 d and dmin, 16 sub-blocks of 16 with a 4-bit scale sc and
    /// min m each; x = d sc q - dmin m, q 2-bit
    q2_k = 18,
    /// super-blocks of 256: f16 d, 16 sub-blocks of 16 with a 6-bit scale ls each;
    /// x = d (ls - 32) (q - 4 h'), q 2-bit, h' 1 where the element's hmask bit is clear
    q3_k = 19,
    /// iq4_xs super-blocks of a matrix whose rows come in groups of eight, interleaved like
    /// q4_0x8 (block_iq4_xsx8); rows a multiple of 8
    iq4_xsx8 = 20,
    /// q4_1, q5_0, q5_1 and iq4_nl blocks of a matrix whose rows come in groups of eight,
    /// interleaved like q4_0x8 (block_q4_1x8 ...); rows a multiple of 8
    q4_1x8 = 21,
    q5_0x8 = 22,
    q5_1x8 = 23,
    iq4_nlx8 = 24,
    /// q2_k and q3_k super-blocks of a matrix whose rows come in groups of eight, interleaved
    /// like q4_0x8 (block_q2_kx8, block_q3_kx8); rows a multiple of 8
    q2_kx8 = 25,
    q3_kx8 = 26,
};
inline constexpr uint32_t dtype_count = 27;
inline constexpr int qk = 32;    ///< elements per quantisation block (activations, q8_0, q4_0, K-quant sub-blocks)
inline constexpr int qk_k = 256; ///< elements per K-quant super-block

#pragma pack(push, 1)
struct block_q8_0 {
    uint16_t d;    // f16
    int8_t qs[32]; // element i
};
struct block_q4_0 {
    uint16_t d;     // f16
    uint8_t qs[16]; // low nibble: element i, high nibble: element i + 16
};
/// Block column ib of rows 8g..8g+7 of a q4_0x8 matrix: the eight q4_0 blocks' scales,
/// then their nibbles in four chunks of 32 bytes, chunk k holding bytes 4k..4k+3 of each
/// row in turn (qs[k][r][j] = byte 4k + j of row 8g + r's block). A group's blocks follow
/// each other, and the groups each other: the matrix is read as one sequential stream.
struct block_q4_0x8 {
    uint16_t d[8];
    uint8_t qs[4][8][4];
};
/// Block column ib of rows 8g..8g+7 of a q8_0x8 matrix, likewise: the eight q8_0 blocks'
/// scales, then their values in eight chunks of 32 bytes (qs[k][r][j] = element 4k + j of
/// row 8g + r's block).
struct block_q8_0x8 {
    uint16_t d[8];
    int8_t qs[8][8][4];
};
/// A super-block of q4_k (q5_k adds qh). Sub-block j's 6-bit scale and min are packed in
/// `scales` (k_scale_min); its elements are the low (j even) or high (j odd) nibbles of
/// qs[32 (j / 2) .. + 31], and for q5_k bit j of qh[0 .. 31] is their fifth bit.
struct block_q4_k {
    uint16_t d, dmin; // f16
    uint8_t scales[12];
    uint8_t qs[128];
};
struct block_q5_k {
    uint16_t d, dmin; // f16
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
/// A super-block of q6_k: element e = 128 h + 32 k + l (l < 32) has the low (k < 2) or high
/// nibble of ql[64 h + 32 (k % 2) + l], bits 2k, 2k + 1 of qh[32 h + l] above them, and the
/// scale scales[e / 16].
struct block_q6_k {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d; // f16
};
/// Blocks of 32 elements whose values are nibbles: element i is the low nibble of qs[i],
/// element i + 16 the high one; q5_0 and q5_1 add bit i of qh as element i's fifth bit.
struct block_q4_1 {
    uint16_t d, m; // f16
    uint8_t qs[16];
};
struct block_q5_0 {
    uint16_t d; // f16
    uint8_t qh[4];
    uint8_t qs[16];
};
struct block_q5_1 {
    uint16_t d, m; // f16
    uint8_t qh[4];
    uint8_t qs[16];
};
struct block_iq4_nl {
    uint16_t d; // f16
    uint8_t qs[16];
};
/// A super-block of iq4_xs: sub-block j's elements are nibbles of qs[16 j .. 16 j + 15] as
/// in block_iq4_nl; its scale ls is the nibble j % 2 of scales_l[j / 2] with bits 2j, 2j + 1
/// of scales_h above it.
struct block_iq4_xs {
    uint16_t d; // f16
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
};
/// q2_k and q3_k: element e = 128 h + 32 j + l (l < 32) has bits 2j, 2j + 1 of qs[32 h + l],
/// and sub-block e / 16's scale. q2_k's scales[k]: scale in the low nibble, min in the high.
/// q3_k: bit 4h + j of hmask[l] is the element's third bit (clear: the value less 4); its 6-bit
/// scales are packed in scales[12] (kernels::q3_k_scale).
struct block_q2_k {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d, dmin; // f16
};
struct block_q3_k {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d; // f16
};
#pragma pack(pop)
/// Super-block column s of rows 8g..8g+7 of a q4_kx8 matrix: the eight super-blocks' d and
/// dmin, their 12 bytes of scales as three 32-bit words (word w of row r: scales[w][r]),
/// and their quants four bytes of each row at a time: qs[c][i][r] holds bytes
/// 32c + 4i .. 32c + 4i + 3 of row r's qs (elements 4i.. of sub-blocks 2c and 2c + 1).
struct block_q4_kx8 {
    uint16_t d[8], dmin[8];
    uint32_t scales[3][8];
    uint8_t qs[4][8][8][4];
};
/// The same for q5_k, with qh[i][r]: bytes 4i .. 4i + 3 of row r's qh.
struct block_q5_kx8 {
    uint16_t d[8], dmin[8];
    uint32_t scales[3][8];
    uint8_t qh[8][8][4];
    uint8_t qs[4][8][8][4];
};
/// The same for q6_k: scales[k][r] is row r's scale k; ql[h][c][i][r] holds bytes
/// 64h + 32c + 4i .. + 3 of row r's ql, qh[h][i][r] bytes 32h + 4i .. + 3 of its qh.
struct block_q6_kx8 {
    uint16_t d[8];
    int8_t scales[16][8];
    uint8_t ql[2][2][8][8][4];
    uint8_t qh[2][8][8][4];
};
/// Super-block column s of rows 8g..8g+7 of an iq4_xsx8 matrix: the eight super-blocks' d,
/// scales_h and scales_l (as a 32-bit word), then their quants four bytes of each row at a
/// time: qs[j][k][r] holds bytes 16j + 4k .. 16j + 4k + 3 of row r's qs (sub-block j's
/// elements 4k.. in the low nibbles, 16 + 4k.. in the high ones).
struct block_iq4_xsx8 {
    uint16_t d[8];
    uint16_t scales_h[8];
    uint32_t scales_l[8];
    uint8_t qs[8][4][8][4];
};
/// Block column b of rows 8g..8g+7 of a q4_1x8, q5_0x8, q5_1x8 or iq4_nlx8 matrix: the eight
/// blocks' d (and m), q5's fifth bits as a 32-bit word per row, then the nibbles as in
/// block_q4_0x8 (qs[k][r] = bytes 4k .. 4k + 3 of row r's qs).
struct block_q4_1x8 {
    uint16_t d[8], m[8];
    uint8_t qs[4][8][4];
};
struct block_q5_0x8 {
    uint16_t d[8];
    uint32_t qh[8];
    uint8_t qs[4][8][4];
};
struct block_q5_1x8 {
    uint16_t d[8], m[8];
    uint32_t qh[8];
    uint8_t qs[4][8][4];
};
struct block_iq4_nlx8 {
    uint16_t d[8];
    uint8_t qs[4][8][4];
};
/// Super-block column s of rows 8g..8g+7 of a q2_kx8 matrix: the eight super-blocks' d and
/// dmin, scales[k][r]: row r's scales[k], then qs[h][i][r]: bytes 32h + 4i .. + 3 of row r's
/// qs (elements 128h + 32j + 4i .. + 3 in bits 2j, 2j + 1).
struct block_q2_kx8 {
    uint16_t d[8], dmin[8];
    uint8_t scales[16][8];
    uint8_t qs[2][8][8][4];
};
/// The same for q3_k: its 12 bytes of scales as three 32-bit words (scales[w][r]), and
/// hmask[i][r]: bytes 4i .. 4i + 3 of row r's hmask.
struct block_q3_kx8 {
    uint16_t d[8];
    uint32_t scales[3][8];
    uint8_t hmask[8][8][4];
    uint8_t qs[2][8][8][4];
};
/// The sixteen values an iq4_nl or iq4_xs nibble stands for.
inline constexpr int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static_assert(sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24 &&
              sizeof(block_iq4_nl) == 18 && sizeof(block_iq4_xs) == 136 && sizeof(block_q2_k) == 84 &&
              sizeof(block_q3_k) == 110);
static_assert(sizeof(block_q4_kx8) == 8 * sizeof(block_q4_k) && sizeof(block_q5_kx8) == 8 * sizeof(block_q5_k) &&
              sizeof(block_q6_kx8) == 8 * sizeof(block_q6_k) && sizeof(block_iq4_xsx8) == 8 * sizeof(block_iq4_xs) &&
              sizeof(block_q2_kx8) == 8 * sizeof(block_q2_k) && sizeof(block_q3_kx8) == 8 * sizeof(block_q3_k));
static_assert(sizeof(block_q4_1x8) == 8 * sizeof(block_q4_1) && sizeof(block_q5_0x8) == 8 * sizeof(block_q5_0) &&
              sizeof(block_q5_1x8) == 8 * sizeof(block_q5_1) && sizeof(block_iq4_nlx8) == 8 * sizeof(block_iq4_nl));
static_assert(sizeof(block_q4_k) == 144 && sizeof(block_q5_k) == 176 && sizeof(block_q6_k) == 210);
static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q4_0) == 18 && sizeof(block_q4_0x8) == 8 * sizeof(block_q4_0) &&
              sizeof(block_q8_0x8) == 8 * sizeof(block_q8_0));
inline constexpr int x8_rows = 8; ///< rows in one group of an interleaved type

/// Name used in files, on the command line and in the docs.
std::string_view dtype_name(dtype t);
/// Parses a dtype name; returns false when unknown.
bool parse_dtype(std::string_view name, dtype& out);
/// Bytes of one row of `n` elements; 0 when `n` is not a multiple of the block size.
uint64_t row_bytes(dtype t, uint64_t n);
bool is_quantized(dtype t);
/// q4_k, q5_k, q6_k: rows of super-blocks of qk_k elements.
bool is_k_quant(dtype t);
/// q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k: kept as a GGUF file stores them, never
/// written from f32.
bool is_read_only(dtype t);
/// Elements per block of `t` (1 for f32, f16, bf16).
int block_elements(dtype t);
/// The 6-bit scale and min of sub-block j (0..7) of a q4_k or q5_k super-block's `scales`:
/// bytes 0-3 hold the low 6 bits of scales 0-3 (their top 2 bits: the high bits of scales
/// 4-7), bytes 4-7 the same for the mins, bytes 8-11 the low 4 bits of scale (low nibble)
/// and min (high nibble) of sub-blocks 4-7.
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
/// The x8 types (q4_0x8, q8_0x8, q4_kx8 ...): rows stored interleaved in groups of eight.
bool is_interleaved(dtype t);
/// The type of one row taken out of a `t` matrix (x8_row): q4_0 for q4_0x8, q4_k for
/// q4_kx8 and so on, else `t` itself.
dtype row_type(dtype t);
/// The type a matrix of `rows` is stored as for matrix products when `t` is asked for:
/// t's interleaved type (q4_0x8 for q4_0, q8_0x8 for q8_0, q4_kx8 for q4_k...) with rows a
/// multiple of 8, else `t` itself. (A table that is also looked up row by row, token_embd,
/// keeps `t`.)
dtype matmul_storage(dtype t, uint64_t rows);
/// Interleaves `rows` (a multiple of 8) rows of `cols` elements, of type row_type(t), into
/// the groups of the interleaved type `t`.
void interleave_x8(dtype t, const void* plain_rows, uint64_t rows, uint64_t cols, void* out);
/// Row r of a matrix of the interleaved type `t` and `cols` columns, in its plain form
/// (row_type(t)).
void x8_row(dtype t, const void* matrix, uint64_t cols, uint64_t r, void* out_row);

/// Model families (model/family_registry.h describes each). The runtime reads only the flat
/// hyperparameters; this is informative.
enum class arch : uint32_t {
    llama = 1,
    mixtral = 2,
    qwen2_moe = 3,
    qwen3_moe = 4,
    olmoe = 5,
    granite_moe = 6,
    qwen2 = 7,
    qwen3 = 8,
    granite = 9,
    starcoder2 = 10,
    gemma3 = 11,
    gemma2 = 12,
    deepseek2 = 13,
};
inline constexpr uint32_t arch_max = 13;
std::string_view arch_name(arch a);

/// How q and k are normalised after projection (before RoPE).
enum class qk_norm : uint32_t {
    none = 0,
    per_head = 1, ///< RMSNorm over head_dim, one weight vector shared by all heads (Qwen3)
    full = 2,     ///< RMSNorm over the whole projection (OLMoE)
};

/// Flag bits of hparams::flags.
enum : uint32_t {
    flag_attn_bias = 1u << 0,          ///< q, k, v projections have biases
    flag_shared_expert_gate = 1u << 1, ///< shared expert output scaled by sigmoid(x . w)
    flag_norm_topk_prob = 1u << 2,     ///< renormalise the selected experts' weights to sum 1
    flag_tie_embeddings = 1u << 3,     ///< LM head reuses token_embd
    flag_layer_norm = 1u << 4,         ///< norms are LayerNorm with a bias, not RMSNorm (StarCoder2)
    flag_gelu_mlp = 1u << 5,           ///< dense FFN: down . gelu_tanh(up . x), no gate (StarCoder2)
    flag_out_bias = 1u << 6,           ///< the attention output and the dense FFN's matrices have biases
    flag_sandwich_norm = 1u << 7,      ///< the attention's and the FFN's outputs are normalised too (Gemma)
    flag_geglu = 1u << 8,              ///< the gated dense FFN's activation is gelu_tanh, not silu (Gemma)
    flags_known = (1u << 9) - 1,
};

#pragma pack(push, 1)
/// Hyperparameters, embedded in the header.
struct hparams {
    uint32_t arch; // format::arch
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t n_ff;          // dense FFN width (dense layers); 0 when none
    uint32_t n_expert;      // 0 for a dense model
    uint32_t n_expert_used; // top-k
    uint32_t n_ff_exp;      // width of one routed expert
    uint32_t n_ff_shexp;    // width of the shared expert; 0 when none
    uint32_t n_vocab;
    uint32_t n_ctx;       // trained context length
    uint32_t flags;       // flag_* bits
    uint32_t qk_norm;     // format::qk_norm
    uint32_t weight_type; // dtype of the large matrices (informative)
    float rope_theta;
    float norm_eps;
    float embedding_scale;   // token embeddings are multiplied by this (1 for most)
    float residual_scale;    // block outputs are multiplied by this before the residual add
    float attention_scale;   // q.k scale; 0 means 1/sqrt(head_dim)
    float logit_scale;       // logits are multiplied by this (Granite: 1/logits_scaling)
    float rope_attn_factor;  // RoPE's cos and sin are multiplied by this (YaRN); 0 means 1
    uint32_t sliding_window; // a token attends to at most this many positions, itself included; 0: all
    uint32_t swa_pattern;    // with a window: 0, every layer; N, every layer but those with (il + 1) % N == 0
    float rope_theta_swa;    // > 0: the windowed layers' RoPE base, without rope_freqs (Gemma 3)
    float final_softcap;     // > 0: logits = final_softcap * tanh(logits / final_softcap)
    float attn_softcap;      // > 0: attention scores = attn_softcap * tanh(scores / attn_softcap) (Gemma 2)
    // Multi-head latent attention (DeepSeek-V2): head_dim is a query/key head's size, its last
    // rope_dim elements roped; the cache holds kv_lora_rank + rope_dim floats per position
    uint32_t kv_lora_rank;      // > 0: latent attention
    uint32_t q_lora_rank;       // latent attention: queries through a rank-q_lora_rank projection; 0: direct
    uint32_t rope_dim;          // latent attention: the roped part of a query/key head
    uint32_t v_head_dim;        // latent attention: a value head's size
    uint32_t n_expert_group;    // > 1: the experts form this many groups of equal size, and the top
    uint32_t n_group_used;      //   n_expert_used are taken from the n_group_used groups of best expert
    float expert_weights_scale; // the routed experts' weights are multiplied by this; 0 means 1
    uint8_t reserved[16];
};

struct section {
    uint64_t offset;
    uint64_t size;
    uint32_t crc32; // of the section's bytes; 0 for the data section (not checked at load)
    uint32_t reserved;
};

/// Fixed-size file header at offset 0.
struct header {
    uint8_t magic[8];
    uint32_t version;
    uint32_t header_size;  // format::header_size
    uint32_t header_crc32; // CRC-32 of the header_size bytes with this field set to 0
    uint32_t n_tensors;
    uint64_t file_size; // exact size of the file
    section tokenizer;
    section tensors; // n_tensors entries of tensor_entry_size bytes
    section data;
    hparams hp;
    uint8_t reserved[format::header_size - 8 - 4 * 4 - 8 - 3 * sizeof(section) - sizeof(hparams)];
};

/// One tensor directory entry.
struct tensor_entry {
    char name[max_name];      // NUL-terminated, NUL-padded
    uint32_t dtype;           // format::dtype
    uint32_t n_dims;          // 1..max_dims
    uint64_t shape[max_dims]; // outermost first (PyTorch order); unused dims are 0
    uint64_t offset;          // from the start of the file; multiple of alignment
    uint64_t size;            // bytes
    uint8_t reserved[tensor_entry_size - max_name - 8 - 8 * max_dims - 16];
};

/// Tokenizer kinds.
enum class tokenizer_kind : uint32_t {
    sentencepiece = 1, ///< payload: a serialized sentencepiece ModelProto
    bpe = 2,           ///< payload: format/bpe_payload.h (from a Hugging Face tokenizer.json)
};

enum : uint32_t {
    tok_add_bos = 1u << 0,
    tok_add_eos = 1u << 1,
    tok_fim_spm = 1u << 2, ///< fill-in-the-middle prompts go suffix first (the model was trained so)
};

/// Start of the tokenizer section; the payload follows it.
struct tokenizer_header {
    uint32_t kind;  // tokenizer_kind
    int32_t bos_id; // -1 when none
    int32_t eos_id; // -1 when none
    int32_t pad_id; // -1 when none
    uint32_t flags; // tok_* bits
    uint32_t reserved0;
    uint64_t payload_size;
    uint8_t reserved[32];
};
#pragma pack(pop)

static_assert(sizeof(hparams) == 156);
static_assert(sizeof(header) == header_size);
static_assert(sizeof(tensor_entry) == tensor_entry_size);
static_assert(sizeof(tokenizer_header) == 64);

inline constexpr uint64_t align_up(uint64_t x) { return (x + alignment - 1) & ~(alignment - 1); }

} // namespace colibri::format
