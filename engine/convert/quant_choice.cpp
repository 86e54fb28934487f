#include "convert/quant_choice.h"

#include "core/error.h"
#include "format/tensor_names.h"

#include <charconv>

namespace colibri {

using format::dtype;

namespace {

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool more_bits(uint32_t il, uint32_t n_layer) {
    const int64_t i = il, n = n_layer;
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// "blk.<il>.<role>": the layer and what follows it; false for the other names.
bool layer_role(std::string_view name, uint32_t& il, std::string_view& role) {
    constexpr std::string_view prefix = "blk.";
    if (name.substr(0, prefix.size()) != prefix) return false;
    const char* begin = name.data() + prefix.size();
    const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), il);
    if (ec != std::errc() || end == name.data() + name.size() || *end != '.') return false;
    role = name.substr(size_t(end - name.data()) + 1);
    return true;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

} // namespace

quant_choice quant_choice::parse(std::string_view s) {
    quant_choice q;
    dtype t;
    if (s == "q4_k_m" || s == "q5_k_m") {
        q.base_ = s == "q4_k_m" ? dtype::q4_k : dtype::q5_k;
        q.mix_ = true;
    } else if (format::parse_dtype(s, t) && !format::is_interleaved(t) && !format::is_read_only(t)) {
        q.base_ = t;
    } else if (s == "int8") {
        q.base_ = dtype::q8_0;
    } else if (s == "int4" || s == "q4") {
        q.base_ = dtype::q4_0;
    } else {
        throw error(errc::invalid_argument,
                    "unknown --quant '" + std::string(s) +
                        "' (f32, f16, bf16, q8_0 (int8), q4_0 (int4), q4_k, q5_k, q6_k, q4_k_m, q5_k_m)");
    }
    return q;
}

std::string quant_choice::name() const { return std::string(format::dtype_name(base_)) + (mix_ ? "_m" : ""); }

dtype quant_choice::matrix_type(std::string_view name, uint64_t cols, const mix_shape& shape) const {
    dtype t = base_;
    uint32_t il = 0;
    std::string_view role;
    if (!mix_) {
    } else if (name == names::output || (name == names::token_embd && shape.tied)) {
        t = dtype::q6_k;
    } else if (layer_role(name, il, role)) {
        const bool eight = shape.n_expert == 8;
        if (role == names::blk::attn_v) t = eight ? dtype::q8_0 : more_bits(il, shape.n_layer) ? dtype::q6_k : base_;
        else if (role == names::blk::attn_k && eight) t = dtype::q8_0;
        else if (role == names::blk::attn_output && eight && base_ == dtype::q4_k) t = dtype::q5_k;
        else if (starts_with(role, "ffn_down") && more_bits(il, shape.n_layer)) t = dtype::q6_k;
    }
    if (format::row_bytes(t, cols) == 0) t = format::row_bytes(dtype::q8_0, cols) != 0 ? dtype::q8_0 : dtype::f16;
    return t;
}

} // namespace colibri
