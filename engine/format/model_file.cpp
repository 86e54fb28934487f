#include "format/model_file.h"

#include "core/crc32.h"
#include "core/error.h"

#include <cmath>
#include <cstring>

namespace colibri {

using namespace format;

uint64_t tensor_view::n_elements() const {
    uint64_t n = 1;
    for (int i = 0; i < n_dims; ++i) n *= shape[i];
    return n;
}

namespace {

// a + b <= limit without overflow.
bool fits(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

std::string section_text(const char* name, const section& s) {
    return std::string(name) + " section [" + std::to_string(s.offset) + ", +" + std::to_string(s.size) + ")";
}

} // namespace

model_file::model_file(const std::string& path) : file_(path) {
    check_header();
    check_hparams();
    read_tokenizer();
    read_tensors();
}

void model_file::fail(const std::string& what) const { throw error(errc::format, path() + ": " + what); }

void model_file::check_header() {
    const uint64_t n = file_.size();
    if (n < sizeof(format::magic) || std::memcmp(file_.data(), format::magic, sizeof(format::magic)) != 0) {
        fail("not a .colibri model file (wrong magic bytes)");
    }
    if (n < header_size) {
        fail("truncated: " + std::to_string(n) + " bytes, shorter than the " + std::to_string(header_size) +
             "-byte header");
    }
    std::memcpy(&header_, file_.data(), sizeof(header_));
    if (header_.version > format::version) {
        throw error(errc::unsupported, path() + ": format version " + std::to_string(header_.version) +
                                           " is newer than this build supports (" + std::to_string(format::version) +
                                           "); upgrade Colibri");
    }
    if (header_.version < format::min_version) {
        fail("unsupported format version " + std::to_string(header_.version));
    }
    if (header_.header_size != header_size) {
        fail("header size " + std::to_string(header_.header_size) + ", expected " + std::to_string(header_size));
    }
    format::header copy = header_;
    copy.header_crc32 = 0;
    const uint32_t crc = crc32(&copy, sizeof(copy));
    if (crc != header_.header_crc32) {
        fail("header checksum mismatch (corrupted header)");
    }
    if (header_.file_size != n) {
        if (n < header_.file_size) {
            fail("truncated: " + std::to_string(n) + " bytes, the header says " + std::to_string(header_.file_size));
        }
        fail(std::to_string(n - header_.file_size) + " unexpected bytes after the last section (file is " +
             std::to_string(n) + " bytes, the header says " + std::to_string(header_.file_size) + ")");
    }
    const std::pair<const char*, const section*> sections[] = {
        {"tokenizer", &header_.tokenizer}, {"tensor directory", &header_.tensors}, {"data", &header_.data}};
    for (const auto& [name, s] : sections) {
        if (s->offset < header_size || s->offset % alignment != 0 || !fits(s->offset, s->size, n)) {
            fail(section_text(name, *s) + " lies outside the file of " + std::to_string(n) + " bytes or is misaligned");
        }
    }
    if (uint64_t(header_.n_tensors) * tensor_entry_size != header_.tensors.size) {
        fail("tensor directory size " + std::to_string(header_.tensors.size) + " does not match " +
             std::to_string(header_.n_tensors) + " entries");
    }
    if (crc32(file_.data() + header_.tokenizer.offset, header_.tokenizer.size) != header_.tokenizer.crc32) {
        fail("tokenizer section checksum mismatch (corrupted)");
    }
    if (crc32(file_.data() + header_.tensors.offset, header_.tensors.size) != header_.tensors.crc32) {
        fail("tensor directory checksum mismatch (corrupted)");
    }
}

void model_file::check_hparams() const {
    const hparams& hp = header_.hp;
    auto bad = [&](const char* field, uint64_t value, const char* expected) {
        fail(std::string("hyperparameter ") + field + " = " + std::to_string(value) + ", expected " + expected);
    };
    if (hp.arch == 0 || hp.arch > arch_max) bad("arch", hp.arch, "a known architecture");
    if (hp.n_layer == 0 || hp.n_layer > 4096) bad("n_layer", hp.n_layer, "1..4096");
    if (hp.n_embd == 0 || hp.n_embd > (1u << 20)) bad("n_embd", hp.n_embd, "1..2^20");
    if (hp.n_head == 0 || hp.n_head > 4096) bad("n_head", hp.n_head, "1..4096");
    if (hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0) {
        bad("n_head_kv", hp.n_head_kv, "a divisor of n_head");
    }
    if (hp.head_dim == 0 || hp.head_dim % 2 != 0 || hp.head_dim > 4096) {
        bad("head_dim", hp.head_dim, "an even number up to 4096");
    }
    if (hp.n_vocab == 0 || hp.n_vocab > (1u << 24)) bad("n_vocab", hp.n_vocab, "1..2^24");
    if (hp.n_ctx == 0 || hp.n_ctx > (1u << 24)) bad("n_ctx", hp.n_ctx, "1..2^24");
    if (hp.n_expert > 4096) bad("n_expert", hp.n_expert, "at most 4096");
    if (hp.n_expert > 0 && (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert)) {
        bad("n_expert_used", hp.n_expert_used, "1..n_expert");
    }
    if (hp.n_expert > 0 && hp.n_ff_exp == 0) bad("n_ff_exp", hp.n_ff_exp, "> 0 with experts");
    if (hp.n_expert == 0 && hp.n_ff == 0) bad("n_ff", hp.n_ff, "> 0 for a dense model");
    if ((hp.flags & ~flags_known) != 0) bad("flags", hp.flags, "only known flag bits");
    if (hp.qk_norm > static_cast<uint32_t>(qk_norm::full)) bad("qk_norm", hp.qk_norm, "0..2");
    const std::pair<const char*, float> floats[] = {{"rope_theta", hp.rope_theta},
                                                    {"norm_eps", hp.norm_eps},
                                                    {"embedding_scale", hp.embedding_scale},
                                                    {"residual_scale", hp.residual_scale},
                                                    {"logit_scale", hp.logit_scale}};
    for (const auto& [name, v] : floats) {
        if (!std::isfinite(v) || v <= 0) fail(std::string("hyperparameter ") + name + " is not a positive number");
    }
    if (!std::isfinite(hp.attention_scale) || hp.attention_scale < 0) {
        fail("hyperparameter attention_scale is not a non-negative number");
    }
    for (const auto& [name, v] : {std::pair{"rope_attn_factor", hp.rope_attn_factor},
                                  {"rope_theta_swa", hp.rope_theta_swa},
                                  {"final_softcap", hp.final_softcap},
                                  {"attn_softcap", hp.attn_softcap}}) {
        if (!std::isfinite(v) || v < 0) fail(std::string("hyperparameter ") + name + " is not a non-negative number");
    }
    if (!std::isfinite(hp.expert_weights_scale) || hp.expert_weights_scale < 0) {
        fail("hyperparameter expert_weights_scale is not a non-negative number");
    }
    if (hp.kv_lora_rank > 0) { // latent attention
        if (hp.kv_lora_rank > 65536) bad("kv_lora_rank", hp.kv_lora_rank, "at most 65536");
        if (hp.q_lora_rank > 65536) bad("q_lora_rank", hp.q_lora_rank, "at most 65536");
        if (hp.rope_dim == 0 || hp.rope_dim % 2 != 0 || hp.rope_dim >= hp.head_dim) {
            bad("rope_dim", hp.rope_dim, "an even number below head_dim");
        }
        if (hp.v_head_dim == 0 || hp.v_head_dim > 4096) bad("v_head_dim", hp.v_head_dim, "1..4096");
        if (hp.n_head_kv != 1) bad("n_head_kv", hp.n_head_kv, "1 with latent attention");
        if (hp.sliding_window != 0) bad("sliding_window", hp.sliding_window, "0 with latent attention");
    } else if (hp.q_lora_rank != 0 || hp.rope_dim != 0 || hp.v_head_dim != 0) {
        fail("hyperparameters q_lora_rank, rope_dim and v_head_dim are set without latent attention");
    }
    if (hp.n_expert_group > 1) {
        if (hp.n_expert_group > 64 || hp.n_expert % hp.n_expert_group != 0) {
            bad("n_expert_group", hp.n_expert_group, "a divisor of n_expert, at most 64");
        }
        if (hp.n_group_used == 0 || hp.n_group_used > hp.n_expert_group ||
            uint64_t(hp.n_group_used) * (hp.n_expert / hp.n_expert_group) < hp.n_expert_used) {
            bad("n_group_used", hp.n_group_used, "1..n_expert_group, its groups holding n_expert_used experts");
        }
    }
}

void model_file::read_tokenizer() {
    const section& s = header_.tokenizer;
    if (s.size < sizeof(tokenizer_header)) fail("tokenizer section is too small");
    std::memcpy(&tokenizer_, file_.data() + s.offset, sizeof(tokenizer_));
    const auto kind = static_cast<tokenizer_kind>(tokenizer_.kind);
    if (kind != tokenizer_kind::sentencepiece && kind != tokenizer_kind::bpe) {
        fail("unknown tokenizer kind " + std::to_string(tokenizer_.kind));
    }
    if (tokenizer_.payload_size != s.size - sizeof(tokenizer_header)) {
        fail("tokenizer payload size " + std::to_string(tokenizer_.payload_size) + " does not match its section");
    }
    const int32_t n_vocab = static_cast<int32_t>(header_.hp.n_vocab);
    for (int32_t id : {tokenizer_.bos_id, tokenizer_.eos_id, tokenizer_.pad_id}) {
        if (id < -1 || id >= n_vocab) fail("special token id " + std::to_string(id) + " is outside the vocabulary");
    }
    tokenizer_payload_ = {file_.data() + s.offset + sizeof(tokenizer_header),
                          static_cast<size_t>(tokenizer_.payload_size)};
}

void model_file::read_tensors() {
    const uint8_t* dir = file_.data() + header_.tensors.offset;
    const uint64_t data_begin = header_.data.offset;
    const uint64_t data_end = header_.data.offset + header_.data.size;
    tensors_.reserve(header_.n_tensors);
    for (uint32_t i = 0; i < header_.n_tensors; ++i) {
        tensor_entry e;
        std::memcpy(&e, dir + uint64_t(i) * tensor_entry_size, sizeof(e));
        const size_t len = strnlen(e.name, max_name);
        if (len == 0 || len == max_name) {
            fail("tensor directory entry " + std::to_string(i) + " has no valid name");
        }
        tensor_view t;
        t.name = std::string_view(reinterpret_cast<const char*>(dir) + uint64_t(i) * tensor_entry_size, len);
        const std::string where = "tensor '" + std::string(t.name) + "': ";
        if (e.dtype >= dtype_count) fail(where + "unknown dtype " + std::to_string(e.dtype));
        t.type = static_cast<dtype>(e.dtype);
        if (e.n_dims == 0 || e.n_dims > static_cast<uint32_t>(max_dims)) {
            fail(where + "bad number of dimensions " + std::to_string(e.n_dims));
        }
        t.n_dims = static_cast<int>(e.n_dims);
        uint64_t n_outer = 1;
        for (int d = 0; d < t.n_dims; ++d) {
            if (e.shape[d] == 0 || e.shape[d] > (uint64_t(1) << 32)) {
                fail(where + "bad dimension " + std::to_string(e.shape[d]));
            }
            t.shape[d] = e.shape[d];
            if (d + 1 < t.n_dims) n_outer *= e.shape[d];
        }
        const uint64_t rb = row_bytes(t.type, t.shape[t.n_dims - 1]);
        if (rb == 0) {
            fail(where + "row of " + std::to_string(t.shape[t.n_dims - 1]) + " elements is not a whole number of " +
                 std::string(dtype_name(t.type)) + " blocks");
        }
        if (is_interleaved(t.type) && (t.n_dims != 2 || t.shape[0] % x8_rows != 0)) {
            std::string shape;
            for (int d = 0; d < t.n_dims; ++d) shape += (d ? " x " : "") + std::to_string(t.shape[d]);
            fail(where + std::string(dtype_name(t.type)) +
                 " needs a matrix with a multiple of 8 rows (its rows are interleaved by eights), not " + shape);
        }
        if (n_outer > UINT64_MAX / rb || n_outer * rb != e.size) {
            fail(where + "byte size " + std::to_string(e.size) + " does not match its shape and dtype");
        }
        if (e.offset % alignment != 0) fail(where + "offset " + std::to_string(e.offset) + " is not 64-byte aligned");
        if (e.offset < data_begin || !fits(e.offset, e.size, data_end)) {
            fail(where + "data [" + std::to_string(e.offset) + ", +" + std::to_string(e.size) +
                 ") lies outside the data section (file is " + std::to_string(file_.size()) + " bytes)");
        }
        t.data = file_.data() + e.offset;
        t.size = e.size;
        if (!by_name_.emplace(t.name, tensors_.size()).second) {
            fail(where + "appears twice in the tensor directory");
        }
        tensors_.push_back(t);
    }
}

const tensor_view* model_file::find(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

} // namespace colibri
