#pragma once
// Reads Hugging Face safetensors checkpoints: one file or several shards with an index.

#include "core/mapped_file.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace colibri {

enum class st_dtype { f32, f16, bf16 };

struct st_tensor {
    std::string name;
    st_dtype type;
    std::vector<uint64_t> shape;
    const uint8_t* data; // inside a mapped shard
    uint64_t size;       // bytes
    std::string file;    // the shard, for messages
};

/// All tensors of a checkpoint directory, mapped read-only.
class safetensors_checkpoint {
public:
    /// Opens `dir`/model.safetensors.index.json when present (every shard it names),
    /// otherwise every *.safetensors file in `dir`. Throws colibri::error naming the file.
    explicit safetensors_checkpoint(const std::string& dir);

    /// nullptr when absent.
    const st_tensor* find(const std::string& name) const;
    /// Throws colibri::error naming the tensor when absent.
    const st_tensor& get(const std::string& name) const;
    const std::map<std::string, st_tensor>& tensors() const { return tensors_; }

private:
    void open_shard(const std::string& path);

    std::vector<std::unique_ptr<mapped_file>> files_;
    std::map<std::string, st_tensor> tensors_;
};

/// Element i (row-major, flattened) of t as f32.
float st_element(const st_tensor& t, uint64_t i);

} // namespace colibri
