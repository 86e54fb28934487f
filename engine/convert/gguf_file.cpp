#include "convert/gguf_file.h"

#include "convert/ggml_quants.h"
#include "core/error.h"

#include <cstring>
#include <fstream>

namespace colibri {

namespace {

constexpr uint8_t gguf_magic[4] = {'G', 'G', 'U', 'F'};
constexpr int max_dims = 4;        // GGML_MAX_DIMS
constexpr int max_array_depth = 4; // arrays of arrays: skipped, never read

size_t scalar_size(gguf_type t) {
    switch (t) {
    case gguf_type::u8:
    case gguf_type::i8:
    case gguf_type::boolean: return 1;
    case gguf_type::u16:
    case gguf_type::i16: return 2;
    case gguf_type::u32:
    case gguf_type::i32:
    case gguf_type::f32: return 4;
    case gguf_type::u64:
    case gguf_type::i64:
    case gguf_type::f64: return 8;
    default: return 0;
    }
}

// Bounds-checked little-endian reading of the mapped file.
class cursor {
public:
    cursor(const gguf_file& f, const uint8_t* data, uint64_t size) : f_(f), data_(data), size_(size) {}

    uint64_t pos() const { return pos_; }
    const uint8_t* here() const { return data_ + pos_; }
    void need(uint64_t n, const std::string& what) const {
        if (n > size_ - pos_) {
            f_.fail("truncated: " + what + " at offset " + std::to_string(pos_) + " needs " + std::to_string(n) +
                    " bytes, the file has " + std::to_string(size_ - pos_) + " left");
        }
    }
    template <class T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string_view str(const std::string& what) {
        const auto n = read<uint64_t>(what + " length");
        need(n, what);
        std::string_view s(reinterpret_cast<const char*>(data_ + pos_), n);
        pos_ += n;
        return s;
    }
    void skip(uint64_t n, const std::string& what) {
        need(n, what);
        pos_ += n;
    }

private:
    const gguf_file& f_;
    const uint8_t* data_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

void read_value(cursor& c, gguf_type t, gguf_value& v, const std::string& key, int depth, const gguf_file& f);

void read_array(cursor& c, gguf_value& v, const std::string& key, int depth, const gguf_file& f) {
    const auto et = c.read<uint32_t>("type of the elements of '" + key + "'");
    if (et > static_cast<uint32_t>(gguf_type::f64))
        f.fail("metadata '" + key + "': unknown array element type " + std::to_string(et));
    v.elem = static_cast<gguf_type>(et);
    v.count = c.read<uint64_t>("length of '" + key + "'");
    if (v.elem == gguf_type::string) {
        // every string takes at least its 8-byte length
        c.need(v.count > UINT64_MAX / 8 ? UINT64_MAX : v.count * 8, "strings of '" + key + "'");
        v.strings.reserve(v.count);
        for (uint64_t k = 0; k < v.count; ++k)
            v.strings.push_back(c.str("element " + std::to_string(k) + " of '" + key + "'"));
    } else if (v.elem == gguf_type::array) {
        if (depth >= max_array_depth) f.fail("metadata '" + key + "': arrays nested too deeply");
        c.need(v.count > UINT64_MAX / 12 ? UINT64_MAX : v.count * 12, "arrays of '" + key + "'");
        for (uint64_t k = 0; k < v.count; ++k) {
            gguf_value inner;
            read_array(c, inner, key, depth + 1, f);
        }
    } else {
        const size_t es = scalar_size(v.elem);
        if (v.count > UINT64_MAX / es)
            f.fail("metadata '" + key + "': array length " + std::to_string(v.count) + " overflows");
        v.elems = c.here();
        c.skip(v.count * es, "elements of '" + key + "'");
    }
}

void read_value(cursor& c, gguf_type t, gguf_value& v, const std::string& key, int depth, const gguf_file& f) {
    v.type = t;
    const std::string what = "value of '" + key + "'";
    switch (t) {
    case gguf_type::u8: v.u = c.read<uint8_t>(what); break;
    case gguf_type::i8: v.i = c.read<int8_t>(what); break;
    case gguf_type::u16: v.u = c.read<uint16_t>(what); break;
    case gguf_type::i16: v.i = c.read<int16_t>(what); break;
    case gguf_type::u32: v.u = c.read<uint32_t>(what); break;
    case gguf_type::i32: v.i = c.read<int32_t>(what); break;
    case gguf_type::u64: v.u = c.read<uint64_t>(what); break;
    case gguf_type::i64: v.i = c.read<int64_t>(what); break;
    case gguf_type::f32: v.f = c.read<float>(what); break;
    case gguf_type::f64: v.f = c.read<double>(what); break;
    case gguf_type::boolean: {
        const auto b = c.read<uint8_t>(what);
        if (b > 1) f.fail("metadata '" + key + "': bool value " + std::to_string(b));
        v.u = b;
        break;
    }
    case gguf_type::string: v.s = c.str(what); break;
    case gguf_type::array: read_array(c, v, key, depth, f); break;
    }
}

bool is_signed(gguf_type t) {
    return t == gguf_type::i8 || t == gguf_type::i16 || t == gguf_type::i32 || t == gguf_type::i64;
}
bool is_unsigned(gguf_type t) {
    return t == gguf_type::u8 || t == gguf_type::u16 || t == gguf_type::u32 || t == gguf_type::u64;
}

} // namespace

std::string_view gguf_type_name(gguf_type t) {
    static constexpr std::string_view names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                                 "bool",  "string", "array",  "uint64", "int64",  "float64"};
    const auto i = static_cast<uint32_t>(t);
    return i < std::size(names) ? names[i] : "unknown";
}

uint64_t gguf_tensor::n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    return n;
}

void gguf_file::fail(const std::string& what) const { throw error(errc::format, path() + ": " + what); }

gguf_file::gguf_file(const std::string& path) : file_(path) {
    cursor c(*this, file_.data(), file_.size());
    c.need(4, "magic");
    if (std::memcmp(file_.data(), gguf_magic, 4) != 0) fail("not a GGUF file (no GGUF magic)");
    c.skip(4, "magic");
    version_ = c.read<uint32_t>("version");
    if (version_ == 1) fail("GGUF version 1 is not supported (versions 2 and 3 are)");
    if (version_ != 2 && version_ != 3)
        fail("unknown GGUF version " + std::to_string(version_) + " (versions 2 and 3 are read)");
    const auto n_tensors = c.read<uint64_t>("tensor count");
    const auto n_kv = c.read<uint64_t>("metadata count");
    // every entry takes at least 8 (name length) + 4 bytes: reject absurd counts before reserving
    if (n_kv > file_.size() / 12) fail("metadata count " + std::to_string(n_kv) + " is larger than the file allows");
    if (n_tensors > file_.size() / 12)
        fail("tensor count " + std::to_string(n_tensors) + " is larger than the file allows");

    kv_.reserve(n_kv);
    for (uint64_t k = 0; k < n_kv; ++k) {
        const std::string key(c.str("name of metadata entry " + std::to_string(k)));
        const auto t = c.read<uint32_t>("type of '" + key + "'");
        if (t > static_cast<uint32_t>(gguf_type::f64))
            fail("metadata '" + key + "': unknown value type " + std::to_string(t));
        gguf_value v;
        read_value(c, static_cast<gguf_type>(t), v, key, 0, *this);
        if (!kv_index_.emplace(key, kv_.size()).second) fail("metadata '" + key + "' appears twice");
        kv_.emplace_back(key, std::move(v));
    }
    if (const gguf_value* a = find("general.alignment")) {
        if (!is_unsigned(a->type) || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20)) {
            fail("general.alignment is not a power of two");
        }
        alignment_ = a->u;
    }

    struct info {
        uint64_t offset;
    };
    std::vector<info> infos;
    tensors_.reserve(n_tensors);
    for (uint64_t k = 0; k < n_tensors; ++k) {
        gguf_tensor t;
        t.name = std::string(c.str("name of tensor " + std::to_string(k)));
        const std::string where = "tensor '" + t.name + "'";
        const auto n_dims = c.read<uint32_t>("dimensions of " + where);
        if (n_dims == 0 || n_dims > max_dims) fail(where + " has " + std::to_string(n_dims) + " dimensions (1 to 4)");
        uint64_t n = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const auto ne = c.read<uint64_t>("shape of " + where);
            if (ne == 0 || ne > (1ull << 40) || n > (1ull << 48) / ne) fail(where + " has an impossible shape");
            n *= ne;
            t.ne.push_back(ne);
        }
        t.type = c.read<uint32_t>("type of " + where);
        const ggml::type_info* ti = ggml::find_type(t.type);
        if (ti == nullptr) fail(where + " has unknown ggml type id " + std::to_string(t.type));
        if (t.ne[0] % ti->block != 0) {
            fail(where + ": rows of " + std::to_string(t.ne[0]) + " elements are not whole " + std::string(ti->name) +
                 " blocks");
        }
        t.size = n / ti->block * ti->block_bytes;
        const auto offset = c.read<uint64_t>("offset of " + where);
        if (offset % alignment_ != 0)
            fail(where + ": data offset " + std::to_string(offset) + " is not aligned to " +
                 std::to_string(alignment_));
        if (!tensor_index_.emplace(t.name, tensors_.size()).second) fail(where + " appears twice");
        infos.push_back({offset});
        tensors_.push_back(std::move(t));
    }
    const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    if (data_start > file_.size() && !tensors_.empty()) fail("truncated: the tensor data section is missing");
    const uint64_t data_size = file_.size() - std::min<uint64_t>(data_start, file_.size());
    for (size_t k = 0; k < tensors_.size(); ++k) {
        gguf_tensor& t = tensors_[k];
        if (infos[k].offset > data_size || t.size > data_size - infos[k].offset) {
            fail("truncated: tensor '" + t.name + "' (" + std::to_string(t.size) + " bytes at data offset " +
                 std::to_string(infos[k].offset) + ") ends past the end of the file");
        }
        t.data = file_.data() + data_start + infos[k].offset;
    }
}

const gguf_value* gguf_file::find(std::string_view key) const {
    auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::string> gguf_file::get_string(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->type != gguf_type::string)
        fail("metadata '" + std::string(key) + "' is a " + std::string(gguf_type_name(v->type)) + ", not a string");
    return std::string(v->s);
}

std::optional<uint64_t> gguf_file::get_uint(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (is_unsigned(v->type)) return v->u;
    if (is_signed(v->type) && v->i >= 0) return static_cast<uint64_t>(v->i);
    fail("metadata '" + std::string(key) + "' is not a non-negative integer");
}

std::optional<double> gguf_file::get_float(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->type == gguf_type::f32 || v->type == gguf_type::f64) return v->f;
    if (is_unsigned(v->type)) return static_cast<double>(v->u);
    if (is_signed(v->type)) return static_cast<double>(v->i);
    fail("metadata '" + std::string(key) + "' is not a number");
}

std::optional<bool> gguf_file::get_bool(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->type != gguf_type::boolean) fail("metadata '" + std::string(key) + "' is not a bool");
    return v->u != 0;
}

std::string gguf_file::string_of(std::string_view key) const {
    auto v = get_string(key);
    if (!v) fail("metadata '" + std::string(key) + "' is missing");
    return *v;
}

uint64_t gguf_file::uint_of(std::string_view key) const {
    auto v = get_uint(key);
    if (!v) fail("metadata '" + std::string(key) + "' is missing");
    return *v;
}

std::vector<std::string_view> gguf_file::string_array(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return {};
    if (v->type != gguf_type::array || v->elem != gguf_type::string)
        fail("metadata '" + std::string(key) + "' is not an array of strings");
    return v->strings;
}

std::vector<float> gguf_file::float_array(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return {};
    if (v->type != gguf_type::array || (v->elem != gguf_type::f32 && v->elem != gguf_type::f64)) {
        fail("metadata '" + std::string(key) + "' is not an array of floats");
    }
    std::vector<float> out(v->count);
    for (uint64_t k = 0; k < v->count; ++k) {
        if (v->elem == gguf_type::f32) {
            std::memcpy(&out[k], v->elems + 4 * k, 4);
        } else {
            double d;
            std::memcpy(&d, v->elems + 8 * k, 8);
            out[k] = static_cast<float>(d);
        }
    }
    return out;
}

std::vector<int64_t> gguf_file::int_array(std::string_view key) const {
    const gguf_value* v = find(key);
    if (v == nullptr) return {};
    if (v->type != gguf_type::array || !(is_signed(v->elem) || is_unsigned(v->elem))) {
        fail("metadata '" + std::string(key) + "' is not an array of integers");
    }
    const size_t es = scalar_size(v->elem);
    std::vector<int64_t> out(v->count);
    for (uint64_t k = 0; k < v->count; ++k) {
        uint64_t raw = 0;
        std::memcpy(&raw, v->elems + es * k, es);                                                // little-endian
        if (is_signed(v->elem) && es < 8 && (raw >> (8 * es - 1)) & 1) raw |= ~0ull << (8 * es); // sign-extend
        out[k] = static_cast<int64_t>(raw);
    }
    return out;
}

bool is_gguf_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char m[4] = {};
    return in.read(m, 4) && std::memcmp(m, gguf_magic, 4) == 0;
}

} // namespace colibri
