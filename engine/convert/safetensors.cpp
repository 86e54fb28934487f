#include "convert/safetensors.h"

#include "core/error.h"
#include "core/half.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace colibri {

namespace fs = std::filesystem;
using json = nlohmann::json;

safetensors_checkpoint::safetensors_checkpoint(const std::string& dir) {
    if (!fs::is_directory(dir)) throw error(errc::io, dir + ": not a directory");
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    std::set<std::string> shards;
    if (fs::exists(index)) {
        std::ifstream in(index);
        json j;
        try {
            j = json::parse(in);
        } catch (const json::exception& e) {
            throw error(errc::format, index.string() + ": invalid JSON: " + e.what());
        }
        if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
            throw error(errc::format, index.string() + ": no weight_map object");
        }
        for (const auto& [name, file] : j["weight_map"].items()) {
            if (!file.is_string())
                throw error(errc::format, index.string() + ": weight_map['" + name + "'] is not a file name");
            shards.insert((fs::path(dir) / file.get<std::string>()).string());
        }
    } else {
        for (const auto& e : fs::directory_iterator(dir)) {
            if (e.path().extension() == ".safetensors") shards.insert(e.path().string());
        }
    }
    if (shards.empty()) throw error(errc::io, dir + ": no *.safetensors files");
    for (const std::string& s : shards) open_shard(s);
}

void safetensors_checkpoint::open_shard(const std::string& path) {
    auto f = std::make_unique<mapped_file>(path);
    const uint64_t n = f->size();
    uint64_t header_len = 0;
    if (n < 8) throw error(errc::format, path + ": truncated safetensors file");
    std::memcpy(&header_len, f->data(), 8);
    if (header_len > n - 8)
        throw error(errc::format, path + ": header length " + std::to_string(header_len) + " past the end of the file");
    json j;
    try {
        j = json::parse(f->data() + 8, f->data() + 8 + header_len);
    } catch (const json::exception& e) {
        throw error(errc::format, path + ": invalid safetensors header: " + e.what());
    }
    const uint64_t data_begin = 8 + header_len;
    if (!j.is_object()) throw error(errc::format, path + ": safetensors header is not a JSON object");
    try {
        for (const auto& [name, v] : j.items()) {
            if (name == "__metadata__") continue;
            const std::string where = path + ": tensor '" + name + "': ";
            if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
                throw error(errc::format, where + "incomplete entry");
            }
            st_tensor t;
            t.name = name;
            t.file = path;
            const std::string dt = v["dtype"].get<std::string>();
            uint64_t elem = 0;
            if (dt == "F32") {
                t.type = st_dtype::f32;
                elem = 4;
            } else if (dt == "F16") {
                t.type = st_dtype::f16;
                elem = 2;
            } else if (dt == "BF16") {
                t.type = st_dtype::bf16;
                elem = 2;
            } else throw error(errc::unsupported, where + "dtype " + dt + " is not supported (F32, F16, BF16)");
            uint64_t count = 1;
            for (const auto& d : v["shape"]) {
                t.shape.push_back(d.get<uint64_t>());
                if (t.shape.back() != 0 && count > UINT64_MAX / 8 / t.shape.back()) {
                    throw error(errc::format, where + "shape is too large");
                }
                count *= t.shape.back();
            }
            const auto off = v["data_offsets"];
            if (!off.is_array() || off.size() != 2) throw error(errc::format, where + "bad data_offsets");
            const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
            if (b > e || e > n - data_begin) throw error(errc::format, where + "data lies outside the file");
            if (e - b != count * elem) throw error(errc::format, where + "byte size does not match its shape");
            t.data = f->data() + data_begin + b;
            t.size = e - b;
            if (!tensors_.emplace(name, std::move(t)).second)
                throw error(errc::format, where + "appears in two shards");
        }
    } catch (const json::exception& e) { // a field of the wrong JSON type
        throw error(errc::format, path + ": invalid safetensors header: " + e.what());
    }
    files_.push_back(std::move(f));
}

const st_tensor* safetensors_checkpoint::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const st_tensor& safetensors_checkpoint::get(const std::string& name) const {
    const st_tensor* t = find(name);
    if (t == nullptr) throw error(errc::format, "checkpoint has no tensor '" + name + "'");
    return *t;
}

float st_element(const st_tensor& t, uint64_t i) {
    switch (t.type) {
    case st_dtype::f32: {
        float v;
        std::memcpy(&v, t.data + 4 * i, 4);
        return v;
    }
    case st_dtype::f16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        return f16_to_f32(h);
    }
    case st_dtype::bf16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        return bf16_to_f32(h);
    }
    }
    return 0.0f;
}

} // namespace colibri
