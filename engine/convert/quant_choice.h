#pragma once
// What colibri-convert's --quant asks for: one type for every matrix, or one of llama.cpp's
// K-quant mixes, which give more bits to the matrices quantisation hurts most.

#include "format/format.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace colibri {

/// A model's shape as a mix looks at it.
struct mix_shape {
    uint32_t n_layer = 0;
    uint32_t n_expert = 0; ///< 0: dense
    bool tied = false;     ///< token_embd is also the output matrix
};

class quant_choice {
public:
    quant_choice(format::dtype t = format::dtype::f16) : base_(t) {} // NOLINT: a type is a choice
    /// f32, f16, bf16, q8_0 (int8), q4_0 (int4, q4), q4_k, q5_k, q6_k, q4_k_m, q5_k_m; throws
    /// colibri::error (invalid_argument) listing them for anything else.
    static quant_choice parse(std::string_view name);

    /// The type of matrix `name` (our tensor name) with rows of `cols`. The mixes follow
    /// llama.cpp's: q6_k for the output matrix and, in every layer where more bits pay most
    /// (the first and last eighth and every third between), for attn_v and ffn_down; with
    /// eight experts q8_0 for attn_k and attn_v and, under q4_k_m, q5_k for attn_output.
    /// Rows that do not fill the type's blocks get q8_0, or f16 when they do not fill q8_0's.
    format::dtype matrix_type(std::string_view name, uint64_t cols, const mix_shape& shape) const;

    format::dtype base() const { return base_; }
    bool is_mix() const { return mix_; }
    std::string name() const;

private:
    format::dtype base_;
    bool mix_ = false;
};

} // namespace colibri
