#pragma once
// Writes a .colibri file: header, tokenizer section, tensor directory, aligned data.

#include "format/format.h"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {

class model_writer {
public:
    /// Fills `dst` (exactly the tensor's byte size) with the tensor's data; for q4_0x8 and
    /// q8_0x8, with its rows in q4_0 or q8_0 form, which the writer then interleaves.
    using producer = std::function<void(uint8_t* dst)>;
    /// Called after each tensor is written: (index, count, name).
    using progress = std::function<void(size_t, size_t, const std::string&)>;

    model_writer(const format::hparams& hp, const format::tokenizer_header& tok,
                 std::vector<uint8_t> tokenizer_payload);

    /// The type a tensor asked for as `type` is stored as: matrices interleaved by eights where
    /// their type and rows allow (format::matmul_storage), token_embd only when it is the LM
    /// head too (a lookup then reads its row's group of eight); every other type as itself.
    format::dtype stored_type(std::string_view name, format::dtype type, const std::vector<uint64_t>& shape) const;

    /// Tensors are written in the order they are added, each as stored_type(); throws on a
    /// bad name or shape.
    void add_tensor(const std::string& name, format::dtype type, std::vector<uint64_t> shape, producer fill);

    /// Writes to `path` through a temporary file renamed into place on success, running up to
    /// `threads` producers at once (they must then be safe to run side by side).
    /// Returns the file size.
    uint64_t write(const std::string& path, const progress& on_progress = {}, unsigned threads = 1) const;

    size_t n_tensors() const { return tensors_.size(); }

private:
    struct pending {
        std::string name;
        format::dtype type;
        std::vector<uint64_t> shape;
        uint64_t size;
        producer fill;
    };

    format::hparams hp_;
    format::tokenizer_header tok_;
    std::vector<uint8_t> tok_payload_;
    std::vector<pending> tensors_;
};

} // namespace colibri
