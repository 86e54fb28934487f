#pragma once
// A minimal GGUF writer for tests: copies a parsed file with metadata overridden, or builds
// one from scratch, so that tests can make files the fixtures do not contain.

#include "convert/gguf_file.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace colibri::test {

class gguf_builder {
public:
    using value = std::variant<std::string, uint32_t, float, bool, std::vector<std::string>, std::vector<float>,
                               std::vector<int32_t>>;

    /// Starts from the metadata and tensors of `f` (arrays of other element types are dropped).
    explicit gguf_builder(const gguf_file& f) {
        for (const auto& [k, v] : f.metadata()) {
            if (v.type == gguf_type::string) set(k, std::string(v.s));
            else if (v.type == gguf_type::u32) set(k, static_cast<uint32_t>(v.u));
            else if (v.type == gguf_type::f32) set(k, static_cast<float>(v.f));
            else if (v.type == gguf_type::boolean) set(k, v.u != 0);
            else if (v.type == gguf_type::array && v.elem == gguf_type::string) {
                set(k, std::vector<std::string>(v.strings.begin(), v.strings.end()));
            } else if (v.type == gguf_type::array && v.elem == gguf_type::f32) {
                set(k, f.float_array(k));
            } else if (v.type == gguf_type::array && v.elem == gguf_type::i32) {
                const auto a = f.int_array(k);
                set(k, std::vector<int32_t>(a.begin(), a.end()));
            }
        }
        for (const gguf_tensor& t : f.tensors()) tensors_.push_back({t.name, t.type, t.ne, {t.data, t.data + t.size}});
    }
    gguf_builder() = default;

    void set(const std::string& key, value v) {
        for (auto& kv : kv_) {
            if (kv.first == key) {
                kv.second = std::move(v);
                return;
            }
        }
        kv_.emplace_back(key, std::move(v));
    }
    void erase(const std::string& key) {
        std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; });
    }
    /// A tensor appended; ne innermost first, as GGUF lists dimensions.
    void add_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne, std::vector<uint8_t> data) {
        tensors_.push_back({name, type, std::move(ne), std::move(data)});
    }
    void erase_tensor(const std::string& name) {
        std::erase_if(tensors_, [&](const auto& t) { return t.name == name; });
    }
    void set_tensor_type(const std::string& name, uint32_t type, std::vector<uint8_t> data) {
        for (auto& t : tensors_) {
            if (t.name == name) {
                t.type = type;
                t.data = std::move(data);
            }
        }
    }

    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> b;
        auto raw = [&b](const void* p, size_t n) {
            b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
        };
        auto u32 = [&](uint32_t v) { raw(&v, 4); };
        auto u64 = [&](uint64_t v) { raw(&v, 8); };
        auto str = [&](const std::string& s) {
            u64(s.size());
            raw(s.data(), s.size());
        };
        raw("GGUF", 4);
        u32(3);
        u64(tensors_.size());
        u64(kv_.size());
        for (const auto& [k, v] : kv_) {
            str(k);
            if (auto* s = std::get_if<std::string>(&v)) {
                u32(8);
                str(*s);
            } else if (auto* u = std::get_if<uint32_t>(&v)) {
                u32(4);
                u32(*u);
            } else if (auto* f = std::get_if<float>(&v)) {
                u32(6);
                raw(f, 4);
            } else if (auto* bo = std::get_if<bool>(&v)) {
                u32(7);
                b.push_back(*bo ? 1 : 0);
            } else if (auto* vs = std::get_if<std::vector<std::string>>(&v)) {
                u32(9);
                u32(8);
                u64(vs->size());
                for (const auto& e : *vs) str(e);
            } else if (auto* vf = std::get_if<std::vector<float>>(&v)) {
                u32(9);
                u32(6);
                u64(vf->size());
                raw(vf->data(), 4 * vf->size());
            } else if (auto* vi = std::get_if<std::vector<int32_t>>(&v)) {
                u32(9);
                u32(5);
                u64(vi->size());
                raw(vi->data(), 4 * vi->size());
            }
        }
        uint64_t offset = 0;
        for (const auto& t : tensors_) {
            str(t.name);
            u32(static_cast<uint32_t>(t.ne.size()));
            for (uint64_t d : t.ne) u64(d);
            u32(t.type);
            u64(offset);
            offset = (offset + t.data.size() + 31) / 32 * 32;
        }
        b.resize((b.size() + 31) / 32 * 32, 0);
        for (const auto& t : tensors_) {
            raw(t.data.data(), t.data.size());
            b.resize((b.size() + 31) / 32 * 32, 0);
        }
        return b;
    }

private:
    struct tensor {
        std::string name;
        uint32_t type;
        std::vector<uint64_t> ne;
        std::vector<uint8_t> data;
    };
    std::vector<std::pair<std::string, value>> kv_;
    std::vector<tensor> tensors_;
};

} // namespace colibri::test
