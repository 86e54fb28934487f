#pragma once
// Reads GGUF files (versions 2 and 3): metadata, tensor infos and mapped tensor data.
// docs/gguf.md says what is read and how it maps to .colibri.

#include "core/mapped_file.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace colibri {

/// Value types of GGUF metadata.
enum class gguf_type : uint32_t {
    u8 = 0,
    i8 = 1,
    u16 = 2,
    i16 = 3,
    u32 = 4,
    i32 = 5,
    f32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    u64 = 10,
    i64 = 11,
    f64 = 12,
};
std::string_view gguf_type_name(gguf_type t);

/// One metadata value. Scalars are held decoded; arrays as a view into the mapping.
struct gguf_value {
    gguf_type type = gguf_type::u8;
    uint64_t u = 0;                        // unsigned integers and bool
    int64_t i = 0;                         // signed integers
    double f = 0;                          // f32 / f64
    std::string_view s;                    // string
    gguf_type elem = gguf_type::u8;        // arrays: element type
    uint64_t count = 0;                    // arrays: elements
    const uint8_t* elems = nullptr;        // arrays of numbers: the packed little-endian elements
    std::vector<std::string_view> strings; // arrays of strings
};

/// A tensor of the file. GGUF lists dimensions innermost first (`ne[0]` is a row).
struct gguf_tensor {
    std::string name;
    uint32_t type = 0;        // ggml type id (convert/ggml_quants.h)
    std::vector<uint64_t> ne; // innermost first
    const uint8_t* data = nullptr;
    uint64_t size = 0; // bytes

    uint64_t n_elements() const;
    /// Shape outermost first (PyTorch order), as the .colibri directory writes it.
    std::vector<uint64_t> torch_shape() const { return {ne.rbegin(), ne.rend()}; }
};

class gguf_file {
public:
    /// Maps and parses `path`. Every count, length and offset is checked against the file
    /// size before use; throws colibri::error (format) naming the file and what is wrong.
    explicit gguf_file(const std::string& path);

    const std::string& path() const { return file_.path(); }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }

    /// nullptr when absent.
    const gguf_value* find(std::string_view key) const;
    const std::vector<std::pair<std::string, gguf_value>>& metadata() const { return kv_; }

    /// Typed accessors: nullopt when absent; throw colibri::error naming the key when the
    /// value has another type (any integer type is accepted where an integer is asked for).
    std::optional<std::string> get_string(std::string_view key) const;
    std::optional<uint64_t> get_uint(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;
    std::optional<bool> get_bool(std::string_view key) const;
    /// Required variants: throw naming the key when absent.
    std::string string_of(std::string_view key) const;
    uint64_t uint_of(std::string_view key) const;

    /// Arrays (empty when absent; throw for another type).
    std::vector<std::string_view> string_array(std::string_view key) const;
    std::vector<float> float_array(std::string_view key) const;
    std::vector<int64_t> int_array(std::string_view key) const;

    const std::vector<gguf_tensor>& tensors() const { return tensors_; }
    /// nullptr when absent.
    const gguf_tensor* find_tensor(std::string_view name) const;

    [[noreturn]] void fail(const std::string& what) const;

private:
    mapped_file file_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    std::vector<std::pair<std::string, gguf_value>> kv_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<gguf_tensor> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

/// True when the file at `path` starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

} // namespace colibri
