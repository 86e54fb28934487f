// Tiny MoE checkpoints whose vocabulary is a real byte-level BPE tokenizer's (Qwen3 and
// DeepSeek-V3), against Hugging Face transformers: the converted tokenizer gives the
// reference prompt ids, the model gives the reference logits and greedy continuation,
// and the continuation decodes to the reference text. Fixtures from
// tests/reference/generate_bpe_models.py; the tokenizer.json files are the ones of
// tests/fixtures/tokenizers/, copied next to the checkpoint only for conversion.

#include "api/runtime.h"
#include "conformance_util.h"
#include "convert/convert.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace colibri;

namespace {

namespace fs = std::filesystem;

struct bpe_case {
    std::string name, text, decoded, greedy_text;
    std::vector<int32_t> ids;        // model input (with BOS where the tokenizer adds one)
    std::vector<int32_t> encode_ids; // the text alone
    std::vector<int32_t> greedy;
    size_t first_row = 0, n_rows = 0;
};

struct bpe_reference {
    std::string name, tokenizer_dir;
    size_t n_vocab = 0, n_top = 0, full_row = 0;
    bool add_bos = false;
    int32_t bos_id = -1;
    double max_abs = 0;
    std::vector<int32_t> columns; // shared sampled columns
    std::vector<float> values;    // [n_rows][n_top + columns]: top logits, then sampled ones
    std::vector<int32_t> top_ids; // [n_rows][n_top]
    std::vector<float> full;      // [n_vocab]: row full_row, whole
    std::vector<bpe_case> cases;
    size_t width() const { return n_top + columns.size(); }
};

bpe_reference load_bpe_reference(const std::string& name) {
    std::ifstream in(test::fixture(name + "/expected.json"));
    REQUIRE_MESSAGE(in.good(), "missing fixture " << name);
    const auto j = nlohmann::json::parse(in);
    bpe_reference r;
    r.name = name;
    r.tokenizer_dir = j["tokenizer_dir"].get<std::string>();
    r.n_vocab = j["n_vocab"].get<size_t>();
    r.n_top = j["n_top"].get<size_t>();
    r.full_row = j["full_row"].get<size_t>();
    r.add_bos = j["add_bos"].get<bool>();
    r.bos_id = j["bos_id"].get<int32_t>();
    r.max_abs = j["max_abs_logit"].get<double>();
    r.columns = j["sample_columns"].get<std::vector<int32_t>>();
    const size_t n_rows = j["n_rows"].get<size_t>();
    r.values = test::read_array<float>(test::fixture(name + "/" + j["logits_file"].get<std::string>()));
    r.top_ids = test::read_array<int32_t>(test::fixture(name + "/" + j["top_ids_file"].get<std::string>()));
    r.full = test::read_array<float>(test::fixture(name + "/" + j["full_row_file"].get<std::string>()));
    REQUIRE(r.values.size() == n_rows * r.width());
    REQUIRE(r.top_ids.size() == n_rows * r.n_top);
    REQUIRE(r.full.size() == r.n_vocab);
    for (const auto& c : j["cases"]) {
        bpe_case bc;
        bc.name = c["name"].get<std::string>();
        bc.text = c["text"].get<std::string>();
        bc.decoded = c["decoded"].get<std::string>();
        bc.greedy_text = c["greedy_text"].get<std::string>();
        bc.ids = c["ids"].get<std::vector<int32_t>>();
        bc.encode_ids = c["encode_ids"].get<std::vector<int32_t>>();
        bc.greedy = c["greedy_ids"].get<std::vector<int32_t>>();
        bc.first_row = c["first_row"].get<size_t>();
        bc.n_rows = c["n_rows"].get<size_t>();
        REQUIRE(bc.n_rows == bc.ids.size() + bc.greedy.size() - 1);
        r.cases.push_back(std::move(bc));
    }
    REQUIRE(r.cases.size() >= 5);
    return r;
}

// The checkpoint with its tokenizer files beside it, converted to f32 and loaded.
std::unique_ptr<runtime> convert_with_tokenizer(const bpe_reference& r, test::temp_dir& dir) {
    const fs::path ckpt = dir.file("checkpoint");
    fs::copy(test::fixture(r.name), ckpt); // the directory's files
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
        fs::copy_file(test::fixture(r.tokenizer_dir + "/" + f), ckpt / f);
    }
    const std::string path = dir.file(r.name + ".colibri");
    convert_checkpoint(ckpt.string(), path, format::dtype::f32, {});
    auto rt = load_runtime(path, "cpu", 2);
    REQUIRE(rt->mdl->hp().n_vocab == r.n_vocab);
    return rt;
}

const std::string models[] = {"qwen3_moe_bpe", "olmoe_bpe"};

} // namespace

TEST_CASE("real BPE vocabularies: the converted tokenizer gives the reference prompt ids") {
    for (const std::string& name : models) {
        CAPTURE(name);
        const bpe_reference r = load_bpe_reference(name);
        test::temp_dir dir;
        auto rt = convert_with_tokenizer(r, dir);
        const tokenizer& tok = *rt->tok;
        CHECK(tok.add_bos() == r.add_bos);
        CHECK(tok.bos_id() == r.bos_id);
        for (const bpe_case& c : r.cases) {
            CAPTURE(c.name);
            std::vector<int32_t> ids;
            if (tok.add_bos()) ids.push_back(tok.bos_id());
            tok.encode(c.text, ids, special_tokens::parsed);
            CHECK(ids == c.ids);
            std::vector<int32_t> plain;
            tok.encode(c.text, plain, special_tokens::parsed);
            CHECK(plain == c.encode_ids);
            CHECK(tok.decode(c.ids) == c.decoded);
        }
    }
}

TEST_CASE("real BPE vocabularies: f32 logits at every position match transformers") {
    for (const std::string& name : models) {
        CAPTURE(name);
        const bpe_reference r = load_bpe_reference(name);
        test::temp_dir dir;
        auto rt = convert_with_tokenizer(r, dir);
        const size_t V = r.n_vocab, W = r.width();
        double max_rel = 0;
        size_t argmax_checked = 0, argmax_same = 0, n_values = 0;
        for (const bpe_case& c : r.cases) {
            CAPTURE(c.name);
            // prompt positions, then the positions greedy steps 1.. were chosen from
            std::vector<int32_t> seq = c.ids;
            seq.insert(seq.end(), c.greedy.begin(), c.greedy.end() - 1);
            const std::vector<float> ours = test::run_logits(*rt, seq, 16);
            REQUIRE(ours.size() == c.n_rows * V);
            for (size_t t = 0; t < c.n_rows; ++t) {
                const size_t row = c.first_row + t;
                const float* mine = &ours[t * V];
                const float* ref = &r.values[row * W];
                const int32_t* top = &r.top_ids[row * r.n_top];
                for (size_t k = 0; k < W; ++k) {
                    const int32_t id = k < r.n_top ? top[k] : r.columns[k - r.n_top];
                    max_rel = std::max(max_rel, std::fabs(double(mine[id]) - ref[k]) / r.max_abs);
                    ++n_values;
                }
                // the arg-max over the whole row, where the reference's top two are apart
                if (double(ref[0]) - ref[1] >= 1e-4 * r.max_abs) {
                    ++argmax_checked;
                    argmax_same += std::max_element(mine, mine + V) - mine == top[0];
                }
                if (row == r.full_row) {
                    for (size_t v = 0; v < V; ++v) {
                        max_rel = std::max(max_rel, std::fabs(double(mine[v]) - r.full[v]) / r.max_abs);
                    }
                    n_values += V;
                }
            }
        }
        MESSAGE(name << ": " << n_values << " logits, max relative error " << max_rel << "; arg-max checked at "
                     << argmax_checked << " positions");
        CHECK(n_values > V);
        CHECK(max_rel < 1e-5);
        CHECK(argmax_checked > 0);
        CHECK(argmax_same == argmax_checked);
    }
}

TEST_CASE("real BPE vocabularies: greedy continuation and its decoded text match transformers") {
    for (const std::string& name : models) {
        CAPTURE(name);
        const bpe_reference r = load_bpe_reference(name);
        test::temp_dir dir;
        auto rt = convert_with_tokenizer(r, dir);
        for (const bpe_case& c : r.cases) {
            CAPTURE(c.name);
            const std::vector<int32_t> greedy = test::run_greedy(*rt, c.ids, static_cast<int>(c.greedy.size()));
            CHECK(greedy == c.greedy);
            CHECK(rt->tok->decode(c.greedy) == c.greedy_text);
            text_stream ts(*rt->tok, false);
            std::string streamed;
            for (int32_t id : c.greedy) streamed += ts.push(id);
            streamed += ts.flush();
            CHECK(streamed == c.greedy_text);
        }
    }
}
