// The .colibri loader refuses every kind of broken file with a message naming the file
// and the problem, and never crashes.

#include "api/runtime.h"
#include "convert/convert.h"
#include "core/crc32.h"
#include "core/error.h"
#include "format/model_file.h"
#include "format/row_codec.h"
#include "format/writer.h"
#include "model/model.h"
#include "model/session.h"
#include "test_util.h"

#include <csignal>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <sys/resource.h>

using namespace colibri;

namespace {

// Loads path and returns the error (code, message); fails the test if loading succeeds.
std::pair<errc, std::string> load_error(const std::string& path) {
    try {
        model m(path);
    } catch (const error& e) {
        return {e.code(), e.what()};
    }
    FAIL("loading " << path << " did not fail");
    return {};
}

// The header of a small dense llama (one layer, dim 32, 512 tokens) and a sentencepiece
// tokenizer's.
std::pair<format::hparams, format::tokenizer_header> small_llama_header() {
    format::hparams hp{};
    hp.arch = static_cast<uint32_t>(format::arch::llama);
    hp.n_layer = 1;
    hp.n_embd = 32;
    hp.n_head = 2;
    hp.n_head_kv = 2;
    hp.head_dim = 16;
    hp.n_ff = 64;
    hp.n_vocab = 512;
    hp.n_ctx = 64;
    hp.rope_theta = 10000;
    hp.norm_eps = 1e-5f;
    hp.embedding_scale = hp.residual_scale = hp.logit_scale = 1;
    format::tokenizer_header th{};
    th.kind = 1;
    th.bos_id = 1;
    th.eos_id = 2;
    th.pad_id = -1;
    return {hp, th};
}

void fix_header_crc(std::vector<uint8_t>& bytes) {
    format::header h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    h.header_crc32 = 0;
    h.header_crc32 = crc32(&h, sizeof(h));
    std::memcpy(bytes.data(), &h, sizeof(h));
}

} // namespace

TEST_CASE("a written model loads back with the same hyperparameters and tensors") {
    test::temp_dir dir;
    const std::string path = dir.file("m.colibri");
    const auto sum = write_random_model(test::small_random_model(), path, format::dtype::q8_0, {});
    model m(path);
    CHECK(m.hp().n_layer == 2);
    CHECK(m.hp().n_expert == 4);
    CHECK(m.file().tensors().size() == sum.n_tensors);
    CHECK(m.n_params() == sum.n_params);
    CHECK(m.n_params_active() == sum.n_params_active);
    CHECK(m.n_params_active() < m.n_params());
    CHECK(m.file().file_size() == sum.file_size);
    const tensor_view* t = m.file().find("blk.1.ffn_down_exps.3.weight");
    REQUIRE(t != nullptr);
    CHECK(t->type == format::dtype::q8_0x8); // a q8_0 matrix of 64 rows, stored interleaved
    CHECK(t->shape[0] == 64);
    CHECK(t->shape[1] == 32);
    CHECK(reinterpret_cast<uintptr_t>(t->data) % 64 == 0);
    // router kept at f32 whatever the matrix type
    CHECK(m.file().find("blk.0.ffn_gate_inp.weight")->type == format::dtype::f32);
    // one expert's three matrices are adjacent in the file: gate, up, down
    const tensor_view* g = m.file().find("blk.0.ffn_gate_exps.1.weight");
    const tensor_view* u = m.file().find("blk.0.ffn_up_exps.1.weight");
    const tensor_view* d = m.file().find("blk.0.ffn_down_exps.1.weight");
    CHECK(u->data == g->data + format::align_up(g->size));
    CHECK(d->data == u->data + format::align_up(u->size));
}

TEST_CASE("a latent-attention model caches one latent row per position and layer, and decodes as it prefills") {
    test::temp_dir dir;
    random_model_options o = test::small_random_model();
    o.arch = format::arch::deepseek2;
    o.n_layer = 3;
    o.n_head_kv = 1;
    o.head_dim = 40; // 32 not roped, 8 roped
    o.kv_lora_rank = 32;
    o.rope_dim = 8;
    o.v_head_dim = 16; // the output's rows of 64 (4 heads) are q8_0, and so the cache f16
    o.n_dense_lead = 1;
    o.n_ff = 48;
    o.n_ff_shexp = 32;
    const std::string path = dir.file("mla.colibri");
    write_random_model(o, path, format::dtype::q8_0, {});
    auto rt = load_runtime(path, "cpu", 2);
    CHECK(!rt->mdl->layers()[0].is_moe());
    CHECK(rt->mdl->layers()[1].is_moe());
    CHECK(rt->mdl->layers()[1].shared_gate == nullptr);
    session batch(*rt->mdl, *rt->be, 64), steps(*rt->mdl, *rt->be, 64, 1);
    CHECK(batch.token_bytes() == 3 * (32 + 8) * sizeof(uint16_t)); // f16, one row: no separate values
    const std::vector<int32_t> ids = {1, 40, 7, 300, 12, 99};
    batch.eval(ids.data(), int(ids.size()));
    for (int32_t t : ids) steps.eval(&t, 1);
    const int vocab = int(rt->mdl->hp().n_vocab);
    for (int i = 0; i < vocab; ++i) CHECK(steps.logits()[i] == doctest::Approx(batch.logits()[i]).epsilon(1e-4));
    // cut back and extended again: the same logits
    std::vector<float> before(batch.logits(), batch.logits() + vocab);
    batch.truncate(3);
    batch.eval(ids.data() + 3, 3);
    for (int i = 0; i < vocab; ++i) CHECK(batch.logits()[i] == before[size_t(i)]);
}

TEST_CASE("broken model files are refused with a clear error") {
    test::temp_dir dir;
    const std::string good = dir.file("good.colibri");
    write_random_model(test::small_random_model(), good, format::dtype::f16, {});
    const auto bytes = test::read_bytes(good);
    auto variant = [&](const std::string& name, const std::vector<uint8_t>& b) {
        const std::string p = dir.file(name);
        test::write_bytes(p, b);
        return p;
    };

    SUBCASE("missing file") {
        auto [code, msg] = load_error(dir.file("nope.colibri"));
        CHECK(code == errc::io);
        CHECK(msg.find("nope.colibri") != std::string::npos);
        CHECK(msg.find("No such file") != std::string::npos);
    }
    SUBCASE("a directory") {
        auto [code, msg] = load_error(dir.file(""));
        CHECK(code == errc::io);
        CHECK(msg.find("directory") != std::string::npos);
    }
    SUBCASE("empty file") {
        auto [code, msg] = load_error(variant("empty.colibri", {}));
        CHECK(code == errc::format);
        CHECK(msg.find("empty") != std::string::npos);
    }
    SUBCASE("truncated file") {
        auto b = bytes;
        b.resize(b.size() / 2);
        auto [code, msg] = load_error(variant("trunc.colibri", b));
        CHECK(code == errc::format);
        CHECK(msg.find("truncated") != std::string::npos);
        CHECK(msg.find("trunc.colibri") != std::string::npos);
    }
    SUBCASE("shorter than the header") {
        auto b = bytes;
        b.resize(100);
        auto [code, msg] = load_error(variant("short.colibri", b));
        CHECK(msg.find("truncated") != std::string::npos);
    }
    SUBCASE("wrong magic") {
        auto b = bytes;
        b[0] = 'G';
        auto [code, msg] = load_error(variant("magic.colibri", b));
        CHECK(code == errc::format);
        CHECK(msg.find("magic") != std::string::npos);
    }
    SUBCASE("newer version") {
        auto b = bytes;
        const uint32_t v = format::version + 1;
        std::memcpy(b.data() + 8, &v, 4);
        fix_header_crc(b);
        auto [code, msg] = load_error(variant("newer.colibri", b));
        CHECK(code == errc::unsupported);
        CHECK(msg.find("version " + std::to_string(v)) != std::string::npos);
        CHECK(msg.find("newer") != std::string::npos);
    }
    SUBCASE("flipped header byte") {
        auto b = bytes;
        b[offsetof(format::header, hp) + 8] ^= 0x01; // n_embd
        auto [code, msg] = load_error(variant("flip.colibri", b));
        CHECK(code == errc::format);
        CHECK(msg.find("header checksum") != std::string::npos);
    }
    SUBCASE("tensor offset past the end") {
        auto b = bytes;
        format::header h;
        std::memcpy(&h, b.data(), sizeof(h));
        format::tensor_entry e;
        uint8_t* entry = b.data() + h.tensors.offset + 3 * format::tensor_entry_size;
        std::memcpy(&e, entry, sizeof(e));
        e.offset = h.file_size + 64 * 1000;
        std::memcpy(entry, &e, sizeof(e));
        h.tensors.crc32 = crc32(b.data() + h.tensors.offset, h.tensors.size);
        std::memcpy(b.data(), &h, sizeof(h));
        fix_header_crc(b);
        auto [code, msg] = load_error(variant("offset.colibri", b));
        CHECK(code == errc::format);
        CHECK(msg.find("outside the data section") != std::string::npos);
        CHECK(msg.find(e.name) != std::string::npos);
    }
    SUBCASE("corrupted tensor directory") {
        auto b = bytes;
        format::header h;
        std::memcpy(&h, b.data(), sizeof(h));
        b[h.tensors.offset + 5] ^= 0xFF;
        auto [code, msg] = load_error(variant("dir.colibri", b));
        CHECK(msg.find("tensor directory checksum") != std::string::npos);
    }
    SUBCASE("inconsistent latent attention and expert groups") {
        auto with = [&](const char* name, auto set) {
            auto b = bytes;
            format::header h;
            std::memcpy(&h, b.data(), sizeof(h));
            set(h.hp);
            std::memcpy(b.data(), &h, sizeof(h));
            fix_header_crc(b);
            return load_error(variant(name, b));
        };
        auto [c1, m1] = with("rope.colibri", [](format::hparams& hp) {
            hp.kv_lora_rank = 16, hp.rope_dim = 5, hp.v_head_dim = 8, hp.n_head_kv = 1;
        });
        CHECK(c1 == errc::format);
        CHECK(m1.find("rope_dim = 5") != std::string::npos);
        auto [c2, m2] = with("qlora.colibri", [](format::hparams& hp) { hp.q_lora_rank = 16; });
        CHECK(m2.find("without latent attention") != std::string::npos);
        auto [c3, m3] = with("groups.colibri", [](format::hparams& hp) { hp.n_expert_group = 3; });
        CHECK(m3.find("n_expert_group = 3") != std::string::npos);
        auto [c4, m4] = with("used.colibri", [](format::hparams& hp) { hp.n_expert_group = 4, hp.n_group_used = 0; });
        CHECK(m4.find("n_group_used = 0") != std::string::npos);
        auto [c5, m5] = with("scale.colibri", [](format::hparams& hp) { hp.expert_weights_scale = -1.0f; });
        CHECK(m5.find("expert_weights_scale") != std::string::npos);
    }
    SUBCASE("bytes appended after the last section") {
        auto b = bytes;
        b.insert(b.end(), {1, 2, 3});
        auto [code, msg] = load_error(variant("tail.colibri", b));
        CHECK(code == errc::format);
        CHECK(msg.find("3 unexpected bytes") != std::string::npos);
    }
}

TEST_CASE("a missing or mis-shaped tensor is named") {
    test::temp_dir dir;
    const std::string path = dir.file("m.colibri");
    // a well-formed file that lacks every layer tensor
    const auto [hp, th] = small_llama_header();
    auto proto = read_file_bytes(test::fixture("tokenizer/tokenizer.model"));
    {
        model_writer w(hp, th, proto);
        w.add_tensor("token_embd.weight", format::dtype::f32, {512, 32}, [](uint8_t*) {});
        w.add_tensor("output_norm.weight", format::dtype::f32, {32}, [](uint8_t*) {});
        w.add_tensor("output.weight", format::dtype::f32, {512, 32}, [](uint8_t*) {});
        w.write(path);
        auto [code, msg] = load_error(path);
        CHECK(msg.find("missing tensor 'blk.0.attn_norm.weight'") != std::string::npos);
    }
    {
        model_writer w(hp, th, proto);
        w.add_tensor("token_embd.weight", format::dtype::f32, {512, 31}, [](uint8_t*) {});
        w.write(path);
        auto [code, msg] = load_error(path);
        CHECK(msg.find("'token_embd.weight' has shape [512, 31], expected [512, 32]") != std::string::npos);
    }
}

TEST_CASE("the writer's bytes come back across its 2 MiB chunks, with producers run side by side, and a failed write "
          "leaves nothing") {
    test::temp_dir dir;
    const auto header = small_llama_header(); // not bound by name: the lambda below takes them
    const format::hparams& hp = header.first;
    const format::tokenizer_header& th = header.second;
    const auto proto = read_file_bytes(test::fixture("tokenizer/tokenizer.model"));
    // sizes that put the 2 MiB chunks' ends inside a tensor, between two and at a tensor's end
    const std::vector<std::pair<std::string, std::vector<uint64_t>>> tensors = {
        {"a", {3, 700001}}, {"b", {5}}, {"c", {2, 262144}}, {"d", {1, 1000003}}};
    const auto pattern = [](size_t t, uint64_t i) { return uint8_t((i * 131 + t * 7) ^ (i >> 11)); };
    const auto writer = [&] {
        auto w = std::make_unique<model_writer>(hp, th, proto);
        for (size_t t = 0; t < tensors.size(); ++t) {
            const auto& [name, shape] = tensors[t];
            uint64_t n = 4;
            for (uint64_t d : shape) n *= d;
            w->add_tensor(name, format::dtype::f32, shape, [&pattern, t, n](uint8_t* dst) {
                for (uint64_t i = 0; i < n; ++i) dst[i] = pattern(t, i);
            });
        }
        return w;
    };

    SUBCASE("the bytes") {
        const std::string path = dir.file("m.colibri");
        const uint64_t size = writer()->write(path);
        CHECK(size >
              uint64_t(8400012 + 20 + 2097152 + 4000012)); // the tensors, with the header and tokenizer before them
        CHECK_FALSE(std::filesystem::exists(path + ".partial"));
        const model_file f(path);
        CHECK(f.file_size() == size);
        for (size_t t = 0; t < tensors.size(); ++t) {
            const tensor_view* v = f.find(tensors[t].first);
            REQUIRE(v != nullptr);
            uint64_t wrong = 0;
            for (uint64_t i = 0; i < v->size; ++i) wrong += v->data[i] != pattern(t, i);
            CHECK_MESSAGE(wrong == 0, tensors[t].first);
        }
    }

    SUBCASE("producers run side by side: the same bytes, and a producer's error leaves nothing") {
        const std::string one = dir.file("one.colibri"), three = dir.file("three.colibri");
        writer()->write(one);
        writer()->write(three, {}, 3);
        CHECK(read_file_bytes(one) == read_file_bytes(three));
        auto w = writer();
        w->add_tensor("e", format::dtype::f32, {2}, [](uint8_t*) { throw error(errc::format, "producer e failed"); });
        const std::string path = dir.file("failed.colibri");
        CHECK_THROWS_WITH_AS(w->write(path, {}, 3), "producer e failed", error);
        CHECK_FALSE(std::filesystem::exists(path));
        CHECK_FALSE(std::filesystem::exists(path + ".partial"));
    }

    SUBCASE("a write that fails midway") {
        // the file size limit stops the writes at 3 MiB, inside the second chunk
        rlimit old{};
        REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
        rlimit lim = old;
        lim.rlim_cur = rlim_t(3) << 20;
        const auto old_handler = std::signal(SIGXFSZ, SIG_IGN); // EFBIG instead of the signal
        REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
        const std::string path = dir.file("big.colibri");
        std::string msg;
        errc code{};
        try {
            writer()->write(path);
        } catch (const error& e) {
            msg = e.what();
            code = e.code();
        }
        setrlimit(RLIMIT_FSIZE, &old);
        std::signal(SIGXFSZ, old_handler);
        CHECK(code == errc::io);
        CHECK(msg.find("big.colibri.partial: write failed: File too large") != std::string::npos);
        CHECK_FALSE(std::filesystem::exists(path));
        CHECK_FALSE(std::filesystem::exists(path + ".partial"));
    }
}

TEST_CASE("random corruption and truncation never crash the loader") {
    test::temp_dir dir;
    const std::string good = dir.file("good.colibri");
    write_random_model(test::small_random_model(), good, format::dtype::q4_0, {});
    const auto bytes = test::read_bytes(good);
    format::header h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    const std::string p = dir.file("bad.colibri");
    uint64_t state = 12345;
    int refused = 0;
    for (int i = 0; i < 300; ++i) {
        auto b = bytes;
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        if (i % 3 == 0) {
            b.resize(size_t(state >> 33) % b.size());
        } else {
            // flip bytes in the header, tokenizer or directory (the data is not checksummed)
            const size_t at = size_t(state >> 33) % size_t(h.data.offset);
            b[at] ^= uint8_t(1 + (state >> 20) % 255);
        }
        test::write_bytes(p, b);
        try {
            model m(p);
        } catch (const error&) {
            ++refused;
        }
    }
    CHECK(refused >= 290); // a flip in padding bytes may leave the file valid
}

TEST_CASE("q4_0 and q8_0 matrices are stored in interleaved groups of eight rows and an interleaved tensor that is not "
          "such a matrix is refused") {
    for (const format::dtype x8 : {format::dtype::q4_0x8, format::dtype::q8_0x8}) {
        const format::dtype plain = format::row_type(x8);
        const std::string x8_name(format::dtype_name(x8));
        CAPTURE(x8_name);
        test::temp_dir dir;
        // rows with distinct scales and values
        auto rows_of = [&](uint64_t rows, uint64_t cols) {
            std::vector<uint8_t> q(rows * format::row_bytes(plain, cols));
            for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i * 7 + i / 251);
            return q;
        };
        const auto m16 = rows_of(16, 64), m12 = rows_of(12, 64), table = rows_of(16, 64);
        // the header and tokenizer of a valid model
        write_random_model(test::small_random_model(), dir.file("base.colibri"), format::dtype::q8_0, {});
        const model_file base(dir.file("base.colibri"));
        const std::vector<uint8_t> payload(base.tokenizer_payload().begin(), base.tokenizer_payload().end());
        auto fill = [](const std::vector<uint8_t>& src) {
            return [src](uint8_t* dst) { std::memcpy(dst, src.data(), src.size()); };
        };
        const std::string path = dir.file("m.colibri");
        {
            model_writer w(base.hp(), base.tokenizer(), payload);
            w.add_tensor("m16", plain, {16, 64}, fill(m16));
            w.add_tensor("m12", plain, {12, 64}, fill(m12));                 // rows not a multiple of 8
            w.add_tensor("token_embd.weight", plain, {16, 64}, fill(table)); // looked up by row
            CHECK_THROWS_WITH_AS(w.add_tensor("bad", x8, {12, 64}, fill(m12)),
                                 doctest::Contains((x8_name + " needs a matrix with a multiple of 8 rows").c_str()),
                                 error);
            w.write(path);
        }
        {
            const model_file mf(path);
            const tensor_view* t16 = mf.find("m16");
            REQUIRE(t16 != nullptr);
            CHECK(t16->type == x8);
            CHECK(t16->size == m16.size());
            const uint64_t rb = format::row_bytes(plain, 64);
            std::vector<uint8_t> row(rb);
            for (uint64_t r = 0; r < 16; ++r) {
                format::x8_row(x8, t16->data, 64, r, row.data());
                CHECK(std::memcmp(row.data(), m16.data() + r * rb, rb) == 0);
            }
            // the layout itself: block 1 of rows 8-15 holds their scales, then four bytes of each
            // row per 32-byte chunk
            if (x8 == format::dtype::q4_0x8) {
                const auto& b = reinterpret_cast<const format::block_q4_0x8*>(t16->data)[2 + 1];
                const auto* row9 = reinterpret_cast<const format::block_q4_0*>(m16.data() + 9 * rb);
                CHECK(b.d[1] == row9[1].d);
                CHECK(std::memcmp(b.qs[2][1], row9[1].qs + 8, 4) == 0);
            } else { // eight chunks: chunk 7 holds elements 28-31
                const auto& b = reinterpret_cast<const format::block_q8_0x8*>(t16->data)[2 + 1];
                const auto* row9 = reinterpret_cast<const format::block_q8_0*>(m16.data() + 9 * rb);
                CHECK(b.d[1] == row9[1].d);
                CHECK(std::memcmp(b.qs[2][1], row9[1].qs + 8, 4) == 0);
                CHECK(std::memcmp(b.qs[7][1], row9[1].qs + 28, 4) == 0);
            }
            CHECK(mf.find("m12")->type == plain);
            CHECK(std::memcmp(mf.find("m12")->data, m12.data(), m12.size()) == 0);
            CHECK(mf.find("token_embd.weight")->type == plain);
        }
        {   // tied to the LM head, the table is a product's matrix too: interleaved, and its rows
            // looked up as they were written
            format::hparams tied = base.hp();
            tied.flags |= format::flag_tie_embeddings;
            model_writer w(tied, base.tokenizer(), payload);
            w.add_tensor("token_embd.weight", plain, {16, 64}, fill(table));
            w.write(dir.file("tied.colibri"));
            const model_file mf(dir.file("tied.colibri"));
            const tensor_view& t = *mf.find("token_embd.weight");
            CHECK(t.type == x8);
            tensor_view as_written = t;
            as_written.type = plain;
            as_written.data = table.data();
            as_written.size = table.size();
            const int32_t ids[] = {0, 9, 15, 9};
            std::vector<float> got(4 * 64), want(4 * 64);
            format::rows_to_f32(t, ids, 4, 1.0f, got.data());
            format::rows_to_f32(as_written, ids, 4, 1.0f, want.data());
            CHECK(got == want);
        }
        // a directory entry that says q4_0x8 / q8_0x8 for 12 rows
        auto bytes = test::read_bytes(path);
        format::header h;
        std::memcpy(&h, bytes.data(), sizeof(h));
        format::tensor_entry e;
        uint8_t* entry = bytes.data() + h.tensors.offset + 1 * format::tensor_entry_size;
        std::memcpy(&e, entry, sizeof(e));
        REQUIRE(std::string(e.name) == "m12");
        e.dtype = static_cast<uint32_t>(x8);
        std::memcpy(entry, &e, sizeof(e));
        h.tensors.crc32 = crc32(bytes.data() + h.tensors.offset, h.tensors.size);
        std::memcpy(bytes.data(), &h, sizeof(h));
        fix_header_crc(bytes);
        const std::string bad = dir.file("bad.colibri");
        test::write_bytes(bad, bytes);
        try {
            model_file mf(bad);
            FAIL("an interleaved tensor of 12 rows loaded");
        } catch (const error& err) {
            CHECK(err.code() == errc::format);
            CHECK(std::string(err.what())
                      .find("tensor 'm12': " + x8_name + " needs a matrix with a multiple of 8 rows") !=
                  std::string::npos);
        }
    }
}
