#pragma once
// A mapped, validated .colibri file: header, tokenizer section and tensor views.

#include "core/mapped_file.h"
#include "format/format.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace colibri {

/// A tensor inside the mapped file (or any other host memory).
struct tensor_view {
    std::string_view name;
    format::dtype type = format::dtype::f32;
    int n_dims = 0;
    uint64_t shape[format::max_dims] = {0, 0, 0, 0}; // outermost first
    const uint8_t* data = nullptr;
    uint64_t size = 0; // bytes

    uint64_t n_elements() const;
    /// Number of rows of a matrix (shape[0]) and elements per row (shape[1]); vectors are 1 x n.
    uint64_t rows() const { return n_dims == 1 ? 1 : shape[0]; }
    uint64_t cols() const { return n_dims == 1 ? shape[0] : shape[1]; }
};

class model_file {
public:
    /// Maps `path` and validates everything before any tensor is touched: magic, version,
    /// header checksum, section bounds and checksums, every tensor entry. Throws
    /// colibri::error naming the file and the problem.
    explicit model_file(const std::string& path);

    const std::string& path() const { return file_.path(); }
    uint64_t file_size() const { return file_.size(); }
    /// The whole mapped file.
    std::span<const uint8_t> bytes() const { return {file_.data(), file_.size()}; }
    const format::header& header() const { return header_; }
    const format::hparams& hp() const { return header_.hp; }
    const format::tokenizer_header& tokenizer() const { return tokenizer_; }
    std::span<const uint8_t> tokenizer_payload() const { return tokenizer_payload_; }

    std::span<const tensor_view> tensors() const { return tensors_; }
    /// nullptr when absent.
    const tensor_view* find(std::string_view name) const;

private:
    [[noreturn]] void fail(const std::string& what) const;
    void check_header();
    void check_hparams() const;
    void read_tokenizer();
    void read_tensors();

    mapped_file file_;
    format::header header_{};
    format::tokenizer_header tokenizer_{};
    std::span<const uint8_t> tokenizer_payload_;
    std::vector<tensor_view> tensors_;
    std::unordered_map<std::string_view, size_t> by_name_;
};

} // namespace colibri
