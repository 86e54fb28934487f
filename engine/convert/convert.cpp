#include "convert/convert.h"

#include "convert/bpe_import.h"
#include "convert/safetensors.h"
#include "core/error.h"
#include "format/row_codec.h"
#include "format/tensor_names.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>

namespace colibri {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace format;

std::vector<uint8_t> read_file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error(errc::io, path + ": cannot open");
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw error(errc::io, path + ": read failed");
    return bytes;
}

namespace {

// The tokenizer section for a sentencepiece model; special ids from the model itself,
// overridden by config.json / tokenizer_config.json where they say otherwise.
tokenizer_header sentencepiece_header(const std::vector<uint8_t>& proto, const std::string& path, const json* config,
                                      const json* tok_config, uint32_t n_vocab) {
    sentencepiece::SentencePieceProcessor sp;
    const auto st =
        sp.LoadFromSerializedProto(std::string_view(reinterpret_cast<const char*>(proto.data()), proto.size()));
    if (!st.ok()) throw error(errc::format, path + ": not a sentencepiece model: " + st.ToString());
    if (static_cast<uint32_t>(sp.GetPieceSize()) > n_vocab) {
        throw error(errc::format, path + ": " + std::to_string(sp.GetPieceSize()) +
                                      " pieces, more than the model's vocabulary of " + std::to_string(n_vocab));
    }
    tokenizer_header th{};
    th.kind = static_cast<uint32_t>(tokenizer_kind::sentencepiece);
    th.bos_id = sp.bos_id();
    th.eos_id = sp.eos_id();
    th.pad_id = sp.pad_id();
    auto id_from = [](const json* j, const char* key, int32_t& out) {
        if (j == nullptr || !j->contains(key)) return;
        const json& v = (*j)[key];
        if (v.is_number_integer()) out = v.get<int32_t>();
        else if (v.is_array() && !v.empty() && v[0].is_number_integer()) out = v[0].get<int32_t>();
    };
    id_from(config, "bos_token_id", th.bos_id);
    id_from(config, "eos_token_id", th.eos_id);
    id_from(config, "pad_token_id", th.pad_id);
    bool add_bos = th.bos_id >= 0;
    if (tok_config != nullptr && tok_config->contains("add_bos_token") && (*tok_config)["add_bos_token"].is_boolean()) {
        add_bos = (*tok_config)["add_bos_token"].get<bool>();
    }
    if (add_bos) th.flags |= tok_add_bos;
    for (int32_t* id : {&th.bos_id, &th.eos_id, &th.pad_id}) {
        if (*id < -1 || *id >= static_cast<int32_t>(n_vocab)) *id = -1;
    }
    return th;
}

std::unique_ptr<json> read_json_if_present(const fs::path& p) {
    if (!fs::exists(p)) return nullptr;
    std::ifstream in(p);
    try {
        return std::make_unique<json>(json::parse(in));
    } catch (const json::exception& e) {
        throw error(errc::format, p.string() + ": invalid JSON: " + e.what());
    }
}

} // namespace

// The active count takes n_expert_used of n_expert.
void count_params(const hparams& hp, const std::vector<std::pair<std::string, uint64_t>>& sizes, convert_summary& sum) {
    for (const auto& [name, n] : sizes) {
        sum.n_params += n;
        if (name.find("_exps.") != std::string::npos) {
            const size_t dot = name.find("_exps.") + 6;
            const int e = std::stoi(name.substr(dot));
            if (e < static_cast<int>(hp.n_expert_used)) sum.n_params_active += n;
        } else if (name == "token_embd.weight" && !(hp.flags & flag_tie_embeddings)) {
            sum.n_params_active += hp.n_embd;
        } else {
            sum.n_params_active += n;
        }
    }
}

void check_finite(const std::vector<float>& row, const std::string& file, const std::string& tensor, uint64_t r) {
    for (const float v : row) {
        if (!std::isfinite(v)) {
            throw error(errc::format, file + ": tensor '" + tensor + "' holds a value that is not finite (row " +
                                          std::to_string(r) + ")");
        }
    }
}

convert_summary convert_checkpoint(const std::string& input, const std::string& output, const quant_choice& quant,
                                   const model_writer::progress& progress, std::optional<fim_order> order) {
    const auto t0 = std::chrono::steady_clock::now();
    const safetensors_checkpoint ckpt(input);
    checkpoint_plan plan = plan_checkpoint(input, ckpt, quant);

    const fs::path dir(input);
    const fs::path sp_path = dir / "tokenizer.model";
    const fs::path json_path = dir / "tokenizer.json";
    tokenizer_header th{};
    std::vector<uint8_t> payload;
    const auto tok_config = read_json_if_present(dir / "tokenizer_config.json");
    if (fs::exists(sp_path)) {
        auto config = read_json_if_present(dir / "config.json");
        payload = read_file_bytes(sp_path.string());
        th = sentencepiece_header(payload, sp_path.string(), config.get(), tok_config.get(), plan.hp.n_vocab);
    } else if (fs::exists(json_path)) {
        tokenizer_section sec = import_tokenizer_json(json_path.string());
        if (sec.n_tokens > plan.hp.n_vocab) {
            throw error(errc::format, json_path.string() + ": " + std::to_string(sec.n_tokens) +
                                          " token ids, more than the model's vocabulary of " +
                                          std::to_string(plan.hp.n_vocab));
        }
        th = sec.header;
        payload = std::move(sec.payload);
    } else {
        throw error(errc::io, input + ": no tokenizer.model or tokenizer.json");
    }
    if (!order && tok_config != nullptr && tok_config->contains("fim_order")) {
        const json& v = (*tok_config)["fim_order"];
        const std::string name = v.is_string() ? v.get<std::string>() : v.dump();
        if (!parse_fim_order(name, order.emplace())) {
            throw error(errc::invalid_argument, (dir / "tokenizer_config.json").string() +
                                                    ": fim_order must be 'psm' or 'spm' (got '" + name + "')");
        }
    }
    if (order == fim_order::spm) th.flags |= tok_fim_spm;

    model_writer w(plan.hp, th, std::move(payload));
    std::vector<std::pair<std::string, uint64_t>> sizes;
    for (const tensor_plan& tp : plan.tensors) {
        if (!tp.values.empty()) {
            const uint64_t cols = tp.shape.back();
            w.add_tensor(tp.name, tp.type, tp.shape, [values = tp.values, type = tp.type, cols](uint8_t* dst) {
                const uint64_t rb = row_bytes(type, cols);
                for (uint64_t r = 0; r < values.size() / cols; ++r) {
                    format::row_from_f32(type, values.data() + r * cols, dst + r * rb, static_cast<int64_t>(cols));
                }
            });
            if (tp.name != names::rope_freqs) sizes.emplace_back(tp.name, tp.values.size()); // a norm stored as 1 + w
            continue;
        }
        const st_tensor* src = &ckpt.get(tp.src.name);
        const uint64_t rows = tp.shape.size() == 2 ? tp.shape[0] : 1;
        const uint64_t cols = tp.shape.back();
        const uint64_t rows_per_matrix =
            src->shape.size() == 3 ? src->shape[1] : (src->shape.size() == 2 ? src->shape[0] : 1);
        const uint64_t first = tp.src.index * rows_per_matrix * cols; // element offset of the matrix
        const dtype type = tp.type;
        w.add_tensor(tp.name, type, tp.shape, [src, rows, cols, first, type, slice = tp.src](uint8_t* dst) {
            std::vector<float> row(cols);
            const uint64_t rb = row_bytes(type, cols);
            for (uint64_t r = 0; r < rows; ++r) {
                const uint64_t base = first + (slice.rows.empty() ? slice.row0 + r : slice.rows[r]) * cols;
                if (src->type == st_dtype::f32) {
                    std::memcpy(row.data(), src->data + 4 * base, 4 * cols);
                } else {
                    for (uint64_t c = 0; c < cols; ++c) row[c] = st_element(*src, base + c);
                }
                check_finite(row, src->file, slice.name, r);
                format::row_from_f32(type, row.data(), dst + r * rb, static_cast<int64_t>(cols));
            }
        });
        sizes.emplace_back(tp.name, rows * cols);
    }
    convert_summary sum;
    sum.family = plan.family;
    sum.n_tensors = plan.tensors.size();
    count_params(plan.hp, sizes, sum);
    sum.file_size = w.write(output, progress);
    sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return sum;
}

} // namespace colibri
