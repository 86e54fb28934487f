#pragma once
// ggml element types as GGUF files store them: the table of ids, names and block sizes,
// and dequantisation of one row to f32 for the types the converter reads.
// Block layouts are described in docs/gguf.md.

#include <cstdint>
#include <string>
#include <string_view>

namespace colibri::ggml {

/// ggml type ids (a GGUF tensor info's `type`).
enum type_id : uint32_t {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q4_1 = 3,
    q5_0 = 6,
    q5_1 = 7,
    q8_0 = 8,
    q8_1 = 9,
    q2_k = 10,
    q3_k = 11,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    q8_k = 15,
    iq4_nl = 20,
    iq4_xs = 23,
    bf16 = 30,
};

struct type_info {
    uint32_t id;
    std::string_view name; ///< as llama.cpp and the gguf package spell it
    uint32_t block;        ///< elements per block (1 for plain types)
    uint32_t block_bytes;  ///< bytes per block
    bool readable;         ///< the converter can dequantise it
};

/// nullptr for an id no ggml version has used.
const type_info* find_type(uint32_t id);
/// The name of a type id, or "type <id>" when unknown.
std::string type_name(uint32_t id);
/// Comma-separated names of the readable types, for messages.
std::string_view readable_types();

/// Bytes of a row of n elements; 0 when n is not a whole number of blocks or the type is unknown.
uint64_t row_bytes(uint32_t id, uint64_t n);

/// Dequantises one row of n elements (a whole number of blocks) of a readable type.
void dequantize_row(uint32_t id, const uint8_t* row, float* out, int64_t n);

} // namespace colibri::ggml
