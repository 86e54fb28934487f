// GGUF import: block layouts against the gguf package, every fixture family converted
// from a GGUF written by the gguf package (tests/reference/generate_gguf.py) against the
// transformers reference, vocabularies of both kinds, and bad files.

#include "conformance_util.h"
#include "convert/ggml_quants.h"
#include "convert/gguf_file.h"
#include "convert/gguf_tokenizer.h"
#include "convert/rope_scaling.h"
#include "core/error.h"
#include "format/row_codec.h"
#include "format/tensor_names.h"
#include "gguf_writer.h"
#include "test_util.h"

#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

using namespace colibri;

namespace {

// GGUF has no YaRN here (refused by name): every family's fixture and llama3's rope_freqs.
const std::vector<std::string> fixture_families = [] {
    std::vector<std::string> v = test::family_names();
    v.push_back("llama3");
    return v;
}();

std::string gguf_fixture(const std::string& name) { return test::fixture("gguf/" + name + ".gguf"); }

// The message of the colibri::error that converting `path` throws ("" when it converts).
std::string convert_error(const std::string& path, test::temp_dir& dir, errc* code = nullptr) {
    try {
        convert_gguf(path, dir.file("out.colibri"), std::nullopt, {});
    } catch (const error& e) {
        if (code != nullptr) *code = e.code();
        return e.what();
    }
    return "";
}

std::string write_gguf(test::temp_dir& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = dir.file(name);
    test::write_bytes(path, bytes);
    return path;
}

} // namespace

TEST_CASE("ggml blocks dequantise exactly as the gguf package does") {
    const gguf_file f(gguf_fixture("quants"));
    int checked = 0;
    for (const gguf_tensor& t : f.tensors()) {
        if (t.name.starts_with("expect.")) continue;
        CAPTURE(t.name);
        const gguf_tensor* e = f.find_tensor("expect." + t.name);
        REQUIRE(e != nullptr);
        REQUIRE(ggml::type_name(t.type) == t.name);
        REQUIRE(t.ne == e->ne);
        const uint64_t cols = t.ne[0], rows = t.ne[1];
        std::vector<float> got(cols), want(cols);
        for (uint64_t r = 0; r < rows; ++r) {
            ggml::dequantize_row(t.type, t.data + r * ggml::row_bytes(t.type, cols), got.data(),
                                 static_cast<int64_t>(cols));
            std::memcpy(want.data(), e->data + r * cols * 4, cols * 4);
            for (uint64_t i = 0; i < cols; ++i) {
                if (got[i] != want[i])
                    FAIL_CHECK("row " << r << " element " << i << ": " << got[i] << " != " << want[i]);
            }
        }
        ++checked;
    }
    CHECK(checked == 14); // F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K IQ4_NL IQ4_XS Q2_K Q3_K
}

TEST_CASE("every family converted from GGUF matches transformers") {
    for (const std::string& family : fixture_families) {
        CAPTURE(family);
        const test::reference r = test::load_reference(family);
        test::temp_dir dir;
        const std::string out = dir.file(family + ".colibri");
        const convert_summary s = convert_gguf(gguf_fixture(family), out, format::dtype::f32, {});
        CHECK(s.family == find_hf_family(r.architecture)->name());
        auto rt = load_runtime(out, "cpu", 2);
        REQUIRE(rt->mdl->hp().n_vocab == uint32_t(r.n_vocab));
        const test::error_stats st = test::compare(r, test::run_logits(*rt, r.prompt, 7));
        MESSAGE(family << " from GGUF, f32: max relative logit error " << st.max_rel);
        CHECK(st.max_rel < 1e-5);
        CHECK(test::run_greedy(*rt, r.prompt, static_cast<int>(r.greedy.size())) == r.greedy);
        // the vocabulary came from the GGUF metadata: text -> ids as the reference
        std::vector<int32_t> ids;
        if (rt->tok->add_bos()) ids.push_back(rt->tok->bos_id());
        rt->tok->encode("def route(x):\n    return softmax(x)[:2]", ids);
        CHECK(ids == r.prompt);
    }
}

TEST_CASE("an older deepseek2 file with kv_b unsplit and the heads' sizes as key and value lengths converts the same") {
    // llama.cpp's converter used to write attn_kv_b [n_head * (nope + v), lora] whole and
    // state the heads' own sizes as key_length / value_length, with head_count_kv = n_head
    const gguf_file g(gguf_fixture("deepseek2"));
    const std::string a = "deepseek2.";
    const uint32_t H = static_cast<uint32_t>(*g.get_uint(a + "attention.head_count"));
    const uint32_t L = static_cast<uint32_t>(*g.get_uint(a + "attention.kv_lora_rank"));
    const uint32_t qk = static_cast<uint32_t>(*g.get_uint(a + "attention.key_length_mla"));
    const uint32_t v = static_cast<uint32_t>(*g.get_uint(a + "attention.value_length_mla"));
    const uint32_t nope = qk - static_cast<uint32_t>(*g.get_uint(a + "rope.dimension_count"));
    test::gguf_builder b(g);
    b.erase(a + "attention.key_length_mla");
    b.erase(a + "attention.value_length_mla");
    b.set(a + "attention.key_length", qk);
    b.set(a + "attention.value_length", v);
    b.set(a + "attention.head_count_kv", H);
    const uint32_t n_layer = static_cast<uint32_t>(*g.get_uint(a + "block_count"));
    for (uint32_t il = 0; il < n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const gguf_tensor* kb = g.find_tensor(p + "attn_k_b.weight"); // [H][L][nope]
        const gguf_tensor* vb = g.find_tensor(p + "attn_v_b.weight"); // [H][v][L]
        REQUIRE((kb != nullptr && vb != nullptr && kb->type == ggml::f32 && vb->type == ggml::f32));
        const auto* k = reinterpret_cast<const float*>(kb->data);
        const auto* vv = reinterpret_cast<const float*>(vb->data);
        std::vector<float> kv(size_t(H) * (nope + v) * L); // [H][nope + v][L]
        for (uint32_t h = 0; h < H; ++h) {
            for (uint32_t c = 0; c < L; ++c) {
                for (uint32_t i = 0; i < nope; ++i)
                    kv[(size_t(h) * (nope + v) + i) * L + c] = k[(size_t(h) * L + c) * nope + i];
                for (uint32_t j = 0; j < v; ++j)
                    kv[(size_t(h) * (nope + v) + nope + j) * L + c] = vv[(size_t(h) * v + j) * L + c];
            }
        }
        b.erase_tensor(p + "attn_k_b.weight");
        b.erase_tensor(p + "attn_v_b.weight");
        std::vector<uint8_t> bytes(kv.size() * 4);
        std::memcpy(bytes.data(), kv.data(), bytes.size());
        b.add_tensor(p + "attn_kv_b.weight", ggml::f32, {L, uint64_t(H) * (nope + v)}, std::move(bytes));
    }
    test::temp_dir dir;
    const std::string in = dir.file("old.gguf"), out = dir.file("old.colibri");
    const std::vector<uint8_t> bytes = b.bytes();
    std::ofstream(in, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    convert_gguf(in, out, format::dtype::f32, {});
    auto rt = load_runtime(out, "cpu", 2);
    const test::reference r = test::load_reference("deepseek2");
    const test::error_stats st = test::compare(r, test::run_logits(*rt, r.prompt, 7));
    CHECK(st.max_rel < 1e-5);
}

TEST_CASE("a sentencepiece vocabulary from GGUF tokenizes as the original model") {
    test::temp_dir dir;
    const std::string out = dir.file("llama.colibri");
    convert_gguf(gguf_fixture("llama"), out, std::nullopt, {});
    auto rt = load_runtime(out, "cpu", 1);
    std::ifstream in(test::fixture("tokenizer/cases.json"));
    const auto cases = nlohmann::json::parse(in);
    REQUIRE(cases.size() > 30);
    for (const auto& c : cases) {
        const std::string text = c["text"].get<std::string>();
        CAPTURE(text);
        std::vector<int32_t> ids;
        rt->tok->encode(text, ids);
        CHECK(ids == c["ids"].get<std::vector<int32_t>>());
        CHECK(rt->tok->decode(ids) == c["decoded"].get<std::string>());
    }
    CHECK(rt->tok->add_bos());
    CHECK(rt->tok->bos_id() == 1);
    CHECK(rt->tok->eos_id() == 2);
}

TEST_CASE("GGUF Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 blocks are copied byte for byte") {
    const test::reference r = test::load_reference("llama");
    struct expectation {
        const char* file;
        format::dtype kept;
        bool copied;
        double max_requant_error; // relative RMS error the conversion adds
        double min_top1, max_kl;  // against the float64 reference
    };
    const expectation cases[] = {
        {"llama-q8_0", format::dtype::q8_0, true, 0.0, 0.85, 6e-3},
        {"llama-q4_0", format::dtype::q4_0, true, 0.0, 0.25, 0.6},
        {"llama-q4_1", format::dtype::q4_1, true, 0.0, 0.25, 0.6},
        {"llama-q5_0", format::dtype::q5_0, true, 0.0, 0.5, 0.2},
        {"llama-q5_1", format::dtype::q5_1, true, 0.0, 0.5, 0.2},
    };
    for (const expectation& e : cases) {
        const std::string file = e.file;
        CAPTURE(file);
        test::temp_dir dir;
        const std::string out = dir.file("m.colibri");
        const convert_summary s = convert_gguf(gguf_fixture(e.file), out, std::nullopt, {});
        bool found = false;
        for (const type_conversion& c : s.conversions) {
            if (c.from == "F32") continue; // norms
            found = true;
            CHECK(c.to == e.kept);
            CHECK(c.copied == e.copied);
            MESSAGE(file << ": " << c.from << " -> " << format::dtype_name(c.to) << ", added relative RMS error "
                         << c.rms_rel_error());
            CHECK(c.rms_rel_error() <= e.max_requant_error);
            if (!e.copied) CHECK(c.rms_rel_error() > 0);
        }
        CHECK(found);
        auto rt = load_runtime(out, "cpu", 2);
        const test::error_stats st = test::compare(r, test::run_logits(*rt, r.prompt, 32));
        MESSAGE(file << ": top-1 agreement " << st.top1 << ", mean KL " << st.mean_kl);
        CHECK(st.top1 >= e.min_top1);
        CHECK(st.mean_kl <= e.max_kl);
        if (e.copied) {
            // byte for byte: attn_v as stored, attn_q with llama.cpp's row order undone (q4_0
            // and q8_0 matrices are stored interleaved: their rows are compared taken back)
            const gguf_file g(gguf_fixture(e.file));
            const model_file mf(out);
            const auto row_of = [](const tensor_view& t, uint64_t row_index) {
                const uint64_t rb = format::row_bytes(t.type, t.cols());
                std::vector<uint8_t> row(t.data + row_index * rb, t.data + (row_index + 1) * rb);
                if (format::is_interleaved(t.type)) format::x8_row(t.type, t.data, t.cols(), row_index, row.data());
                return row;
            };
            const tensor_view* v = mf.find("blk.0.attn_v.weight");
            const gguf_tensor* gv = g.find_tensor("blk.0.attn_v.weight");
            REQUIRE((v != nullptr && gv != nullptr));
            CHECK(v->size == gv->size);
            CHECK(v->type == format::matmul_storage(e.kept, v->rows()));
            const uint64_t rb = ggml::row_bytes(gv->type, gv->ne[0]);
            for (uint64_t row = 0; row < v->rows(); ++row) {
                CHECK(std::memcmp(row_of(*v, row).data(), gv->data + row * rb, rb) == 0);
            }
            const tensor_view* q = mf.find("blk.0.attn_q.weight");
            const gguf_tensor* gq = g.find_tensor("blk.0.attn_q.weight");
            REQUIRE((q != nullptr && gq != nullptr));
            const uint64_t head = 16;
            for (uint64_t row = 0; row < q->rows(); ++row) {
                const uint64_t h = row / head, j = (row % head) / (head / 2), i = row % (head / 2);
                CHECK(std::memcmp(row_of(*q, row).data(), gq->data + (h * head + 2 * i + j) * rb, rb) == 0);
            }
        }
    }
}

TEST_CASE("llama.cpp's K-quant, IQ4 and Q4_1/Q5_0/Q5_1 files keep their blocks and give llama.cpp's logits") {
    // tests/reference/generate_gguf_kquants.py: a random Llama of 256-wide rows quantised by
    // llama.cpp, and llama.cpp's logits for the llama fixture's prompt on each file
    const test::reference prompt = test::load_reference("llama");
    test::reference f32 = prompt;
    f32.logits = test::read_array<float>(test::fixture("gguf/kquant-f32.logits.bin"));
    REQUIRE(f32.logits.size() == prompt.prompt.size() * 512);
    struct expectation {
        const char* name;
        std::vector<std::string> types; // the ggml types of its matrices
    };
    const expectation cases[] = {{"q4_k_m", {"Q4_K", "Q6_K"}},
                                 {"q5_k_m", {"Q5_K", "Q6_K"}},
                                 {"q6_k", {"Q6_K"}},
                                 {"iq4_xs", {"IQ4_XS", "Q6_K"}},
                                 {"iq4_nl", {"IQ4_NL", "Q6_K"}},
                                 {"q4_1", {"Q4_1", "Q6_K"}},
                                 {"q5_0", {"Q5_0", "Q6_K"}},
                                 {"q5_1", {"Q5_1", "Q6_K"}},
                                 {"q2_k", {"Q2_K", "Q3_K", "Q6_K"}},
                                 {"q3_k_m", {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}}};
    const auto lower = [](std::string t) {
        for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
        return t;
    };
    for (const expectation& e : cases) {
        const std::string file = std::string("kquant-") + e.name;
        CAPTURE(file);
        test::temp_dir dir;
        const std::string out = dir.file("m.colibri");
        const convert_summary s = convert_gguf(gguf_fixture(file), out, std::nullopt, {});
        std::vector<std::string> seen;
        for (const type_conversion& c : s.conversions) {
            if (c.from == "F32") continue; // norms
            seen.push_back(c.from);
            CHECK(c.copied);
            CHECK(format::dtype_name(c.to) == lower(c.from));
        }
        std::sort(seen.begin(), seen.end());
        CHECK(seen == e.types);
        // the blocks as llama.cpp wrote them: the matrices' rows interleaved by eights, the
        // embedding table's as they were
        const gguf_file g(gguf_fixture(file));
        const model_file mf(out);
        for (const char* name :
             {"blk.1.attn_v.weight", "blk.0.ffn_down.weight", "output.weight", "token_embd.weight"}) {
            CAPTURE(name);
            const tensor_view* v = mf.find(name);
            const gguf_tensor* gv = g.find_tensor(name);
            REQUIRE((v != nullptr && gv != nullptr));
            const std::string type = lower(ggml::type_name(gv->type));
            const bool table = std::string(name) == "token_embd.weight";
            CHECK(format::dtype_name(format::row_type(v->type)) == type);
            CHECK(format::is_interleaved(v->type) ==
                  (!table && format::is_interleaved(format::matmul_storage(format::row_type(v->type), v->rows()))));
            REQUIRE(v->size == gv->size);
            const uint64_t rb = format::row_bytes(v->type, v->cols());
            std::vector<uint8_t> row(rb);
            for (uint64_t r = 0; r < v->rows(); ++r) {
                if (!format::is_interleaved(v->type)) std::memcpy(row.data(), v->data + r * rb, rb);
                else format::x8_row(v->type, v->data, v->cols(), r, row.data());
                if (std::memcmp(row.data(), static_cast<const uint8_t*>(gv->data) + r * rb, rb) != 0) {
                    FAIL_CHECK("row " << r << " differs from llama.cpp's");
                    break;
                }
            }
        }
        // against llama.cpp on the same file: the two differ only in how the activations are
        // rounded to int8 (blocks of 32 here, of 256 there), far less than the weights' own
        // error, which is llama.cpp's against the F32 original
        test::reference llamacpp = prompt;
        llamacpp.logits = test::read_array<float>(test::fixture("gguf/" + file + ".logits.bin"));
        const test::error_stats theirs = test::compare(f32, llamacpp.logits);
        for (int threads : {1, 2}) {
            auto rt = load_runtime(out, "cpu", threads);
            for (int batch : {1, 7, 32}) {
                const std::vector<float> ours = test::run_logits(*rt, prompt.prompt, batch);
                const test::error_stats same = test::compare(llamacpp, ours), orig = test::compare(f32, ours);
                MESSAGE(file << ", batch " << batch << ": against llama.cpp on the file max rel " << same.max_rel
                             << ", top-1 " << same.top1 << " (tie gap " << same.tie_gap
                             << "); against the F32 original top-1 " << orig.top1 << ", mean KL " << orig.mean_kl
                             << " (llama.cpp: max rel " << theirs.max_rel << ", top-1 " << theirs.top1 << ", mean KL "
                             << theirs.mean_kl << ")");
                CHECK(same.max_rel <= 0.04);
                CHECK(same.max_rel <= theirs.max_rel / 2);
                // at most 2 of 23 arg-maxes differ, each a near-tie: llama.cpp puts our pick within
                // 1% of its largest |logit| of its own top
                CHECK(same.top1 >= 0.9);
                CHECK(same.tie_gap <= 0.01);
                CHECK(orig.top1 >= theirs.top1 - 0.1);
                CHECK(orig.mean_kl <= theirs.mean_kl * 1.5);
            }
        }
    }
}

TEST_CASE("--quant q4_k_m and q5_k_m pick llama.cpp's types and lose no more than llama.cpp's quantiser") {
    const test::reference prompt = test::load_reference("llama");
    test::reference f32 = prompt;
    f32.logits = test::read_array<float>(test::fixture("gguf/kquant-f32.logits.bin"));
    for (const char* mix : {"q4_k_m", "q5_k_m"}) {
        CAPTURE(mix);
        const quant_choice q = quant_choice::parse(mix);
        CHECK(q.is_mix());
        CHECK(q.name() == mix);
        // tensor by tensor the type llama.cpp's quantiser gave it
        const std::string file = std::string("kquant-") + mix;
        const gguf_file theirs(gguf_fixture(file));
        int matrices = 0;
        for (const gguf_tensor& t : theirs.tensors()) {
            if (t.ne.size() != 2) continue;
            CAPTURE(t.name);
            std::string type = ggml::type_name(t.type);
            for (char& c : type) c = char(std::tolower(static_cast<unsigned char>(c)));
            CHECK(format::dtype_name(q.matrix_type(t.name, t.ne[0], {2, 0, false})) == type);
            ++matrices;
        }
        CHECK(matrices == 2 + 2 * 7);
        // our quantiser and llama.cpp's on the same weights (the Q6_K file's, the closest to
        // the original there is), each against the F32 original
        const test::error_stats ref = test::compare(
            f32, test::read_array<float>(test::fixture("gguf/kquant-q6_k-to-" + std::string(mix) + ".logits.bin")));
        test::temp_dir dir;
        convert_gguf(gguf_fixture("kquant-q6_k"), dir.file("m.colibri"), q, {});
        auto rt = load_runtime(dir.file("m.colibri"), "cpu", 2);
        const test::error_stats ours = test::compare(f32, test::run_logits(*rt, prompt.prompt, 7));
        MESSAGE(std::string(mix) << " against the F32 original: ours top-1 " << ours.top1 << ", mean KL "
                                 << ours.mean_kl << "; llama.cpp's top-1 " << ref.top1 << ", mean KL " << ref.mean_kl);
        CHECK(ours.top1 >= ref.top1 - 0.05);
        CHECK(ours.mean_kl <= ref.mean_kl * 1.1);
    }
    // llama.cpp's rules beyond that model: eight experts, tied embeddings, rows that do not
    // fill a super-block
    const quant_choice q4 = quant_choice::parse("q4_k_m"), q5 = quant_choice::parse("q5_k_m");
    const mix_shape moe{32, 8, true};
    CHECK(q4.matrix_type("blk.3.attn_k.weight", 4096, moe) == format::dtype::q8_0);
    CHECK(q4.matrix_type("blk.3.attn_v.weight", 4096, moe) == format::dtype::q8_0);
    CHECK(q4.matrix_type("blk.3.attn_q.weight", 4096, moe) == format::dtype::q4_k);
    CHECK(q4.matrix_type("blk.3.attn_output.weight", 4096, moe) == format::dtype::q5_k);
    CHECK(q5.matrix_type("blk.3.attn_output.weight", 4096, moe) == format::dtype::q5_k);
    CHECK(q4.matrix_type("blk.3.ffn_down_exps.7.weight", 14336, moe) == format::dtype::q6_k); // the first eighth
    CHECK(q4.matrix_type("blk.5.ffn_down_exps.7.weight", 14336, moe) == format::dtype::q4_k);
    CHECK(q4.matrix_type("blk.6.ffn_down_exps.7.weight", 14336, moe) == format::dtype::q6_k);  // every third
    CHECK(q4.matrix_type("blk.28.ffn_down_exps.0.weight", 14336, moe) == format::dtype::q6_k); // the last eighth
    CHECK(q4.matrix_type("blk.27.ffn_down_exps.0.weight", 14336, moe) == format::dtype::q6_k);
    CHECK(q4.matrix_type("blk.26.ffn_down_exps.0.weight", 14336, moe) == format::dtype::q4_k);
    CHECK(q4.matrix_type("blk.6.ffn_gate_exps.7.weight", 4096, moe) == format::dtype::q4_k);
    CHECK(q4.matrix_type("token_embd.weight", 4096, moe) == format::dtype::q6_k);
    CHECK(q4.matrix_type("token_embd.weight", 4096, {32, 8, false}) == format::dtype::q4_k);
    CHECK(q4.matrix_type("blk.6.ffn_up.weight", 896, moe) == format::dtype::q8_0); // 896: not whole super-blocks
    CHECK(q4.matrix_type("blk.6.ffn_up.weight", 48, moe) == format::dtype::f16);   // nor whole blocks of 32
    CHECK(quant_choice::parse("q6_k").matrix_type("output.weight", 4096, moe) == format::dtype::q6_k);
    CHECK(quant_choice::parse("q4_k").matrix_type("output.weight", 4096, moe) ==
          format::dtype::q4_k); // one type for all
    CHECK_THROWS_WITH_AS(quant_choice::parse("q4_kx8"), doctest::Contains("unknown --quant 'q4_kx8'"), colibri::error);
    CHECK_THROWS_WITH_AS(quant_choice::parse("q3_k_m"), doctest::Contains("q4_k_m, q5_k_m"), colibri::error);
}

TEST_CASE("an explicit --quant applies to every matrix of a GGUF") {
    test::temp_dir dir;
    const convert_summary s = convert_gguf(gguf_fixture("mixtral"), dir.file("m.colibri"), format::dtype::q8_0, {});
    bool saw_q8 = false;
    for (const type_conversion& c : s.conversions) {
        // F16 matrices to q8_0; the routers to f32; rows of 48 (not whole blocks) stay f16
        if (c.from == "F16")
            CHECK((c.to == format::dtype::q8_0 || c.to == format::dtype::f32 || c.to == format::dtype::f16));
        saw_q8 |= c.to == format::dtype::q8_0;
    }
    CHECK(saw_q8);
    auto rt = load_runtime(dir.file("m.colibri"), "cpu", 1);
    CHECK(rt->mdl->hp().weight_type == uint32_t(format::dtype::q8_0x8)); // the q8_0 matrices are stored interleaved
    const model_file mf(dir.file("m.colibri"));
    CHECK(mf.find("blk.0.ffn_gate_inp.weight")->type == format::dtype::f32);
    CHECK(mf.find("blk.1.ffn_gate_exps.3.weight")->type == format::dtype::q8_0x8);
    CHECK(mf.find("blk.1.ffn_down_exps.3.weight")->type == format::dtype::f16);
    CHECK(mf.find("blk.0.attn_q.weight")->type == format::dtype::q8_0x8);
}

namespace {

// A GGUF holding only the vocabulary of a tokenizer.json, as llama.cpp's converter writes
// it: tokens by id, merges as "a b", added tokens typed control (special) or user-defined.
std::vector<uint8_t> bpe_vocab_gguf(const std::string& tokenizer_json, const std::string& pre) {
    std::ifstream in(tokenizer_json);
    const auto j = nlohmann::json::parse(in);
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    auto put = [&](const std::string& text, size_t id, int32_t type) {
        if (tokens.size() <= id) {
            tokens.resize(id + 1);
            types.resize(id + 1, 5);
        }
        tokens[id] = text;
        types[id] = type;
    };
    for (const auto& [text, id] : j["model"]["vocab"].items()) put(text, id.get<size_t>(), 1);
    for (const auto& a : j["added_tokens"])
        put(a["content"].get<std::string>(), a["id"].get<size_t>(), a["special"].get<bool>() ? 3 : 4);
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i].empty()) tokens[i] = "[PAD" + std::to_string(i) + "]";
    }
    std::vector<std::string> merges;
    for (const auto& m : j["model"]["merges"]) {
        merges.push_back(m.is_string() ? m.get<std::string>()
                                       : m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
    test::gguf_builder b;
    b.set("general.architecture", std::string("llama"));
    b.set("tokenizer.ggml.model", std::string("gpt2"));
    b.set("tokenizer.ggml.pre", pre);
    b.set("tokenizer.ggml.tokens", tokens);
    b.set("tokenizer.ggml.token_type", types);
    b.set("tokenizer.ggml.merges", merges);
    b.set("tokenizer.ggml.eos_token_id", uint32_t(1));
    return b.bytes();
}

} // namespace

TEST_CASE("a byte-level BPE vocabulary from GGUF gives the reference ids") {
    const std::pair<std::string, std::string> cases[] = {{"qwen3", "qwen2"}, {"deepseek-v3", "deepseek-v3"}};
    for (const auto& [name, pre] : cases) {
        CAPTURE(name);
        test::temp_dir dir;
        const std::string path =
            write_gguf(dir, "vocab.gguf", bpe_vocab_gguf(test::fixture("tokenizers/" + name + "/tokenizer.json"), pre));
        const gguf_file f(path);
        const tokenizer_section sec = import_gguf_tokenizer(f);
        CHECK(sec.header.kind == uint32_t(format::tokenizer_kind::bpe));
        auto tok = make_tokenizer(sec.header, sec.payload, sec.n_tokens, path);
        std::ifstream in(test::fixture("tokenizers/" + name + "/cases.json"));
        const auto cases_json = nlohmann::json::parse(in).at("cases");
        int n = 0;
        for (const auto& c : cases_json) {
            if (!c.contains("ids") || !c.contains("text") || c.contains("bytes_hex")) continue;
            const std::string text = c["text"].get<std::string>();
            CAPTURE(text);
            std::vector<int32_t> ids, as_text;
            tok->encode(text, ids, special_tokens::parsed);
            CHECK(ids == c["ids"].get<std::vector<int32_t>>());
            tok->encode(text, as_text);
            CHECK(as_text == c["ids_as_text"].get<std::vector<int32_t>>());
            ++n;
        }
        CHECK(n > 30);
    }
}

TEST_CASE("a sentencepiece vocabulary names its unknown piece by id when its type says control (Gemma 3)") {
    test::temp_dir dir;
    const gguf_file llama(gguf_fixture("llama"));
    test::gguf_builder b(llama);
    const auto types = llama.int_array("tokenizer.ggml.token_type");
    std::vector<int32_t> retyped(types.begin(), types.end());
    REQUIRE(retyped[0] == 2); // <unk>
    retyped[0] = 3;           // typed control, as in Gemma 3's files
    b.set("tokenizer.ggml.token_type", retyped);
    b.set("tokenizer.ggml.unknown_token_id", uint32_t(0));
    const std::string path = write_gguf(dir, "unk-control.gguf", b.bytes());
    const gguf_file f(path);
    const tokenizer_section sec = import_gguf_tokenizer(f);
    auto tok = make_tokenizer(sec.header, sec.payload, sec.n_tokens, path);
    std::vector<int32_t> ids;
    tok->encode("def route(x):", ids);
    CHECK_FALSE(ids.empty());
    b.erase("tokenizer.ggml.unknown_token_id"); // without the id, no piece is the unknown one
    CHECK(convert_error(write_gguf(dir, "no-unk.gguf", b.bytes()), dir).find("no unknown token") != std::string::npos);
}

TEST_CASE("the code models' pre-tokenizers split as their tokenizer.json does") {
    test::temp_dir dir;
    const std::string qwen3 = test::fixture("tokenizers/qwen3/tokenizer.json");
    auto load = [&](const std::string& pre) {
        const std::string path = write_gguf(dir, pre + ".gguf", bpe_vocab_gguf(qwen3, pre));
        const gguf_file f(path);
        const tokenizer_section sec = import_gguf_tokenizer(f);
        return make_tokenizer(sec.header, sec.payload, sec.n_tokens, path);
    };
    auto ids = [](const tokenizer& tok, std::initializer_list<std::string_view> pieces) {
        std::vector<int32_t> out;
        for (std::string_view p : pieces) tok.encode(p, out);
        return out;
    };
    const auto qwen2 = load("qwen2");
    // Tekken (Codestral, Devstral): a capital starts a new word; the word in the
    // vocabulary is one token
    const auto tekken = load("tekken");
    CHECK(ids(*tekken, {"parseHttpRequest"}) == ids(*tekken, {"parse", "Http", "Request"}));
    CHECK(ids(*qwen2, {"parseHttpRequest"}) != ids(*qwen2, {"parse", "Http", "Request"}));
    // Seed-Coder: punctuation does not take the line break after it
    const auto seed = load("seed-coder");
    CHECK(ids(*seed, {"x = f(y);\n"}) == ids(*seed, {"x = f(y);", "\n"}));
    CHECK(ids(*qwen2, {"x = f(y);\n"}) != ids(*qwen2, {"x = f(y);", "\n"}));
    // DeepSeek-Coder: digits one by one, letters apart from punctuation
    const auto deepseek = load("deepseek-coder");
    CHECK(ids(*deepseek, {"v2024.x"}) == ids(*deepseek, {"v", "2", "0", "2", "4", ".", "x"}));
    for (const char* alias : {"gpt-2", "deepseek-llm", "starcoder", "falcon", "command-r", "qwen35"}) {
        CAPTURE(alias);
        CHECK_NOTHROW(load(alias));
    }
}

TEST_CASE("unsupported architectures tensor types and tokenizers are refused by name") {
    test::temp_dir dir;
    const gguf_file llama(gguf_fixture("llama"));
    auto refused = [&](test::gguf_builder& b, const std::string& needle, errc want) {
        errc code{};
        const std::string msg = convert_error(write_gguf(dir, "bad.gguf", b.bytes()), dir, &code);
        CAPTURE(msg);
        CHECK(msg.find(needle) != std::string::npos);
        CHECK(msg.find("bad.gguf") != std::string::npos);
        CHECK(code == want);
    };
    {
        test::gguf_builder b(llama);
        b.set("general.architecture", std::string("mamba"));
        refused(b, "architecture 'mamba' is not supported", errc::unsupported);
    }
    {
        test::gguf_builder b(llama);
        b.set_tensor_type("blk.1.ffn_norm.weight", 9, std::vector<uint8_t>(72, 0)); // Q8_1: 2 blocks of 36 bytes
        refused(b, "tensor 'blk.1.ffn_norm.weight' has type Q8_1, which is not supported", errc::unsupported);
    }
    {
        test::gguf_builder b(llama);
        b.set("tokenizer.ggml.model", std::string("t5"));
        refused(b, "tokenizer model 't5'", errc::unsupported);
    }
    {
        test::gguf_builder b(llama);
        b.set("tokenizer.ggml.model", std::string("gpt2"));
        b.set("tokenizer.ggml.pre", std::string("jais"));
        refused(b, "pre-tokenizer 'jais'", errc::unsupported);
    }
    {
        test::gguf_builder b(llama);
        b.set("llama.rope.scaling.type", std::string("yarn"));
        refused(b, "RoPE scaling 'yarn'", errc::unsupported);
    }
    {
        test::gguf_builder b(llama);
        std::vector<float> norm(64, 1.0f); // blk.0.attn_norm.weight: [64] F32
        norm[17] = std::numeric_limits<float>::quiet_NaN();
        std::vector<uint8_t> bytes(norm.size() * sizeof(float));
        std::memcpy(bytes.data(), norm.data(), bytes.size());
        b.set_tensor_type("blk.0.attn_norm.weight", 0, bytes);
        refused(b, "tensor 'blk.0.attn_norm.weight' holds a value that is not finite (row 0)", errc::format);
        CHECK_FALSE(std::filesystem::exists(dir.file("out.colibri")));
    }
    {
        test::gguf_builder b(llama);
        b.erase_tensor("blk.1.attn_k.weight");
        refused(b, "tensor 'blk.1.attn_k.weight' is missing", errc::format);
    }
    {
        test::gguf_builder b(llama);
        b.erase("tokenizer.ggml.model");
        refused(b, "tokenizer.ggml.model is missing", errc::format);
    }
}

TEST_CASE("linear RoPE scaling from GGUF metadata becomes the frequency divisors") {
    test::temp_dir dir;
    test::gguf_builder b{gguf_file(gguf_fixture("llama"))};
    b.set("llama.rope.scaling.type", std::string("linear"));
    b.set("llama.rope.scaling.factor", 4.0f);
    const std::string out = dir.file("linear.colibri");
    convert_gguf(write_gguf(dir, "linear.gguf", b.bytes()), out, std::nullopt, {});
    auto rt = load_runtime(out, "cpu", 1);
    REQUIRE(rt->mdl->rope_freqs() != nullptr);
    const auto* f = reinterpret_cast<const float*>(rt->mdl->rope_freqs()->data);
    for (uint64_t i = 0; i < rt->mdl->hp().head_dim / 2; ++i) CHECK(f[i] == 4.0f);
}

TEST_CASE("DeepSeek's YaRN from GGUF metadata: the divisors over the roped part and llama.cpp's score scale") {
    test::temp_dir dir;
    test::gguf_builder b{gguf_file(gguf_fixture("deepseek2"))};
    b.set("deepseek2.rope.scaling.type", std::string("yarn"));
    b.set("deepseek2.rope.scaling.factor", 40.0f);
    b.set("deepseek2.rope.scaling.original_context_length", uint32_t(16));
    b.set("deepseek2.rope.scaling.yarn_log_multiplier", 0.0707f); // 0.1 * mscale_all_dim, as llama.cpp writes it
    const std::string out = dir.file("yarn.colibri");
    convert_gguf(write_gguf(dir, "yarn.gguf", b.bytes()), out, std::nullopt, {});
    auto rt = load_runtime(out, "cpu", 1);
    const format::hparams& hp = rt->mdl->hp();
    REQUIRE(rt->mdl->rope_freqs() != nullptr);
    CHECK(rt->mdl->rope_freqs()->shape[0] == hp.rope_dim / 2);
    rope_scaling rs;
    rs.type = rope_scaling::kind::yarn;
    rs.factor = 40.0;
    rs.original_ctx = 16;
    const std::vector<float> want = rope_freq_factors(rs, hp.rope_theta, static_cast<int>(hp.rope_dim));
    const auto* f = reinterpret_cast<const float*>(rt->mdl->rope_freqs()->data);
    for (uint32_t i = 0; i < hp.rope_dim / 2; ++i) CHECK(f[i] == want[i]);
    const double m = 1.0 + double(0.0707f) / 0.1 * 0.1 * std::log(40.0);
    CHECK(hp.attention_scale == doctest::Approx(m * m / std::sqrt(double(hp.head_dim))).epsilon(1e-6));
    CHECK((hp.rope_attn_factor == 0.0f || hp.rope_attn_factor == 1.0f)); // cos and sin unscaled, as llama.cpp's
    // a generation at positions past the original context runs
    session s(*rt->mdl, *rt->be, 64);
    std::vector<int32_t> ids(40, 7);
    s.eval(ids.data(), int(ids.size()));
    for (int i = 0; i < int(hp.n_vocab); ++i) REQUIRE(std::isfinite(s.logits()[i]));
}

TEST_CASE("truncated and corrupted GGUF files are refused with a clear message") {
    test::temp_dir dir;
    const std::vector<uint8_t> good = test::read_bytes(gguf_fixture("llama"));
    REQUIRE(good.size() > 100000);
    // every cut in the header and metadata region, then a sample through the data
    std::vector<size_t> cuts;
    for (size_t n = 1; n < 12000; n += 7) cuts.push_back(n);
    for (size_t n = 12000; n < good.size(); n += good.size() / 40) cuts.push_back(n);
    cuts.push_back(good.size() - 1);
    for (size_t n : cuts) {
        CAPTURE(n);
        const std::string msg = convert_error(write_gguf(dir, "cut.gguf", {good.begin(), good.begin() + long(n)}), dir);
        CHECK(msg.find("cut.gguf") != std::string::npos);
    }
    auto patched = [&](size_t at, std::vector<uint8_t> bytes) {
        std::vector<uint8_t> b = good;
        std::copy(bytes.begin(), bytes.end(), b.begin() + long(at));
        return convert_error(write_gguf(dir, "bad.gguf", b), dir);
    };
    CHECK(patched(0, {'G', 'G', 'M', 'L'}).find("not a GGUF file") != std::string::npos);
    CHECK(patched(4, {1, 0, 0, 0}).find("GGUF version 1 is not supported") != std::string::npos);
    CHECK(patched(4, {9, 0, 0, 0}).find("unknown GGUF version 9") != std::string::npos);
    CHECK(patched(8, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}).find("tensor count") != std::string::npos);
    CHECK(patched(16, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}).find("metadata count") != std::string::npos);
    // random byte flips in the metadata and tensor infos: refused or converted, never a crash
    std::mt19937 rng(7);
    int refused = 0;
    for (int k = 0; k < 300; ++k) {
        std::vector<uint8_t> b = good;
        for (int flips = 0; flips < 3; ++flips) b[24 + rng() % 11000] = static_cast<uint8_t>(rng());
        try {
            convert_gguf(write_gguf(dir, "fuzz.gguf", b), dir.file("fuzz.colibri"), std::nullopt, {});
        } catch (const error& e) {
            ++refused;
            CHECK(std::string(e.what()).find("fuzz.gguf") != std::string::npos);
        }
    }
    MESSAGE(refused << " of 300 corrupted files refused");
    CHECK(refused > 0);
}

TEST_CASE("requantising every readable ggml type adds a small measured error") {
    // the error the converter's q8_0 (its default for these types) and q4_0 add to each
    // type's values, on the random blocks of quants.gguf (documented in docs/gguf.md)
    const gguf_file f(gguf_fixture("quants"));
    for (const gguf_tensor& t : f.tensors()) {
        if (t.name.starts_with("expect.")) continue;
        const uint64_t cols = t.ne[0], rows = t.ne[1];
        for (format::dtype to : {format::dtype::q8_0, format::dtype::q4_0}) {
            double err2 = 0, ref2 = 0;
            std::vector<float> x(cols), back(cols);
            std::vector<uint8_t> q(format::row_bytes(to, cols));
            for (uint64_t r = 0; r < rows; ++r) {
                ggml::dequantize_row(t.type, t.data + r * ggml::row_bytes(t.type, cols), x.data(), int64_t(cols));
                format::row_from_f32(to, x.data(), q.data(), int64_t(cols));
                format::row_to_f32(to, q.data(), back.data(), int64_t(cols));
                for (uint64_t i = 0; i < cols; ++i) {
                    err2 += (double(back[i]) - x[i]) * (double(back[i]) - x[i]);
                    ref2 += double(x[i]) * x[i];
                }
            }
            const double rel = std::sqrt(err2 / ref2);
            MESSAGE(t.name << " -> " << format::dtype_name(to) << ": relative RMS error " << rel);
            CHECK(rel < (to == format::dtype::q8_0 ? 0.01 : 0.12));
        }
    }
}
