// The byte-level BPE tokenizer against ids recorded from the Hugging Face tokenizers
// library (tests/reference/generate_bpe.py) for three real tokenizer.json files, and its
// payload reader against malformed sections.

#include "convert/bpe_import.h"
#include "convert/convert.h"
#include "core/error.h"
#include "format/model_file.h"
#include "generate/generate.h"
#include "test_util.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

#include <algorithm>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

using namespace colibri;
using json = nlohmann::json;

namespace {

std::string tokenizer_dir(const std::string& name) { return test::fixture("tokenizers/" + name); }

std::unique_ptr<tokenizer> load(const tokenizer_section& sec) {
    return make_bpe_tokenizer(sec.payload, sec.header, sec.n_tokens, "test");
}

json cases(const std::string& name) {
    std::ifstream in(tokenizer_dir(name) + "/cases.json");
    return json::parse(in).at("cases");
}

std::string from_hex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
}

std::string case_text(const json& c) {
    return c.contains("bytes_hex") ? from_hex(c["bytes_hex"].get<std::string>()) : c["text"].get<std::string>();
}

// Encodes, decodes and streams every recorded case; returns how many were lossless.
int check_against_reference(const std::string& name) {
    const tokenizer_section sec = import_tokenizer_json(tokenizer_dir(name) + "/tokenizer.json");
    const auto tok = load(sec);
    const json all = cases(name);
    REQUIRE(all.size() >= 40);
    int lossless = 0;
    for (const json& c : all) {
        const std::string text = case_text(c);
        CAPTURE(name);
        CAPTURE(c["name"].get<std::string>());
        std::vector<int32_t> ids, as_text;
        tok->encode(text, ids, special_tokens::parsed);
        CHECK(ids == c["ids"].get<std::vector<int32_t>>());
        tok->encode(text, as_text);
        CHECK(as_text == c["ids_as_text"].get<std::vector<int32_t>>());
        const std::string decoded = tok->decode(ids);
        CHECK(decoded == c["decoded"].get<std::string>());
        if (c["lossless"].get<bool>()) {
            CHECK(decoded == text);
            ++lossless;
        }
        text_stream stream(*tok, true);
        std::string streamed;
        for (int32_t id : ids) streamed += stream.push(id);
        streamed += stream.flush();
        CHECK(streamed == decoded);
    }
    return lossless;
}

// A small BPE tokenizer.json that uses every step kind the payload has. The ids and
// expectations below were checked with the reference library (Tokenizer.from_str).
json tiny_tokenizer_json() {
    return json::parse(R"json({
      "added_tokens": [{"id": 11, "content": "<s>", "single_word": false, "lstrip": false,
                        "rstrip": false, "normalized": false, "special": true},
                       {"id": 12, "content": "<mask>", "single_word": false, "lstrip": true,
                        "rstrip": true, "normalized": false, "special": false}],
      "normalizer": {"type": "Sequence", "normalizers": [
          {"type": "NFC"}, {"type": "Prepend", "prepend": "▁"},
          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Digits", "individual_digits": true},
          {"type": "Split", "pattern": {"Regex": "\\s+(?!\\S)"}, "behavior": "Isolated", "invert": false}]},
      "decoder": {"type": "Sequence", "decoders": [
          {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
          {"type": "ByteFallback"}, {"type": "Fuse"},
          {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
                "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "abc": 5, "▁": 6,
                          "<0x41>": 7, "<0xC3>": 8, "<0xA9>": 9, "1": 10},
                "merges": [["a", "b"], ["ab", "c"]]}
    })json");
}

tokenizer_section tiny_section(const test::temp_dir& dir, const json& j) {
    const std::string path = dir.file("tokenizer.json");
    std::ofstream(path) << j.dump();
    return import_tokenizer_json(path);
}

} // namespace

TEST_CASE("BPE ids match the reference library: Qwen3 (NFC, split regex, byte-level)") {
    CHECK(check_against_reference("qwen3") >= 30);
}

TEST_CASE("BPE ids match the reference library: DeepSeek-V3 (three split regexes, normalized added tokens)") {
    CHECK(check_against_reference("deepseek-v3") >= 30);
}

TEST_CASE("BPE ids match the reference library: Llama-2 (no pre-tokenizer, byte fallback)") {
    CHECK(check_against_reference("llama2") >= 30);
}

TEST_CASE("byte-level BPE is lossless on random text, ill-formed bytes read as U+FFFD") {
    // Fragments that NFC leaves alone, so Qwen3's normaliser changes nothing either; no '<',
    // so no added token can match. Ill-formed fragments may join their neighbours.
    const std::vector<std::string> fragments = {"a",
                                                "Z",
                                                "if ",
                                                "  ",
                                                "\t",
                                                "\n",
                                                "\r\n",
                                                "123",
                                                "4567",
                                                "\xC3\xA9",
                                                "\xE4\xB8\xAD\xE6\x96\x87",
                                                "\xF0\x9F\x9A\x80",
                                                "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
                                                "\x80",
                                                "\xE2\x82",
                                                "\xF0",
                                                "'s",
                                                "'LL",
                                                "::",
                                                "->",
                                                "\xC2\xA0",
                                                "\xC2\x85",
                                                "\xD9\xA3",
                                                "x_y",
                                                "{}",
                                                "    ",
                                                "\xFF"};
    std::mt19937 rng(7);
    for (const char* name : {"qwen3", "deepseek-v3"}) {
        CAPTURE(name);
        const auto sec = import_tokenizer_json(tokenizer_dir(name) + "/tokenizer.json");
        const auto tok = load(sec);
        for (int n = 0; n < 300; ++n) {
            std::string text;
            const int len = static_cast<int>(rng() % 40);
            for (int k = 0; k < len; ++k) text += fragments[rng() % fragments.size()];
            CAPTURE(text);
            std::vector<int32_t> ids;
            tok->encode(text, ids);
            std::string expect;
            unicode::append_utf8_lossy(expect, text);
            CHECK(tok->decode(ids) == expect);
        }
    }
}

TEST_CASE("any bytes encode to ids inside the vocabulary") {
    std::mt19937 rng(11);
    for (const char* name : {"qwen3", "deepseek-v3", "llama2"}) {
        CAPTURE(name);
        const auto sec = import_tokenizer_json(tokenizer_dir(name) + "/tokenizer.json");
        const auto tok = load(sec);
        int n_ids = 0;
        for (int n = 0; n < 200; ++n) {
            std::string text(rng() % 64, '\0');
            for (auto& c : text) c = static_cast<char>(rng() % 256);
            std::vector<int32_t> ids;
            tok->encode(text, ids);
            for (int32_t id : ids) {
                REQUIRE(id >= 0);
                REQUIRE(id < tok->n_vocab());
            }
            n_ids += static_cast<int>(ids.size());
            std::string streamed;
            text_stream stream(*tok, true);
            for (int32_t id : ids) streamed += stream.push(id);
            streamed += stream.flush();
            CHECK(streamed == tok->decode(ids));
        }
        CHECK(n_ids > 1000);
    }
}

TEST_CASE("streaming any ids of a byte-level tokenizer gives decode's text, ill-formed bytes included") {
    std::mt19937 rng(3);
    for (const char* name : {"qwen3", "deepseek-v3"}) {
        CAPTURE(name);
        const auto tok = load(import_tokenizer_json(tokenizer_dir(name) + "/tokenizer.json"));
        CHECK(tok->replaces_maximal_subparts());
        // Ids of single bytes 0xA1..0xFF (byte-level characters U+00A1..U+00FF; none is
        // UTF-8 on its own), mixed with ordinary ids.
        std::vector<int32_t> byte_ids;
        for (uint32_t b = 0xA1; b <= 0xFF; ++b) {
            if (b == 0xAD) continue; // the soft hyphen is moved out of the way, like controls
            std::string p;
            unicode::append_utf8(p, b);
            if (const int32_t id = tok->piece_to_id(p); id >= 0) byte_ids.push_back(id);
        }
        REQUIRE(byte_ids.size() > 80);
        for (int n = 0; n < 300; ++n) {
            std::vector<int32_t> ids;
            const int len = 1 + static_cast<int>(rng() % 12);
            for (int k = 0; k < len; ++k) {
                ids.push_back(rng() % 2 ? byte_ids[rng() % byte_ids.size()]
                                        : static_cast<int32_t>(rng() % tok->n_vocab()));
            }
            CAPTURE(ids);
            text_stream stream(*tok, true);
            std::string streamed;
            for (int32_t id : ids) streamed += stream.push(id);
            streamed += stream.flush();
            CHECK(streamed == tok->decode(ids));
        }
    }
}

TEST_CASE("threads encoding at once through the shared word cache get the reference ids") {
    const auto sec = import_tokenizer_json(tokenizer_dir("qwen3") + "/tokenizer.json");
    const auto tok = load(sec);
    const json all = cases("qwen3");
    std::vector<std::thread> threads;
    std::vector<int> mismatches(4, 0);
    for (size_t t = 0; t < mismatches.size(); ++t) {
        threads.emplace_back([&, t] {
            for (int round = 0; round < 5; ++round) {
                for (size_t k = 0; k < all.size(); ++k) {
                    const json& c = all[(k + t * 7) % all.size()];
                    std::vector<int32_t> ids;
                    tok->encode(case_text(c), ids, special_tokens::parsed);
                    if (ids != c["ids"].get<std::vector<int32_t>>()) ++mismatches[t];
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("special token ids come from tokenizer_config.json") {
    const auto qwen = import_tokenizer_json(tokenizer_dir("qwen3") + "/tokenizer.json");
    CHECK(qwen.n_tokens == 151669);
    CHECK(qwen.header.kind == static_cast<uint32_t>(format::tokenizer_kind::bpe));
    CHECK(qwen.header.bos_id == -1);
    CHECK(qwen.header.eos_id == 151645); // <|im_end|>
    CHECK(qwen.header.pad_id == 151643); // <|endoftext|>
    CHECK((qwen.header.flags & format::tok_add_bos) == 0);
    const auto ds = import_tokenizer_json(tokenizer_dir("deepseek-v3") + "/tokenizer.json");
    CHECK(ds.header.bos_id == 0);
    CHECK(ds.header.eos_id == 1);
    CHECK((ds.header.flags & format::tok_add_bos) != 0);

    const auto tok = load(qwen);
    CHECK(tok->piece_to_id("<|fim_prefix|>") == 151659);
    CHECK(tok->piece(151659) == "<|fim_prefix|>");
    CHECK(tok->is_control(151643));       // <|endoftext|>: special
    CHECK_FALSE(tok->is_control(151659)); // <|fim_prefix|>: an added token, not special
    CHECK_FALSE(tok->strips_leading_space());
    std::string bytes;
    tok->append_bytes(tok->piece_to_id("\xC4\xA0hello"), bytes); // "Ġhello"
    CHECK(bytes == " hello");
}

TEST_CASE("the tokens that spell numbers are those the tokenizer encodes digits to") {
    const auto tok = load(import_tokenizer_json(tokenizer_dir("qwen3") + "/tokenizer.json"));
    const number_tokens& numbers = tok->numbers();
    const auto id = [&](const std::string& text) {
        std::vector<int32_t> ids;
        tok->encode(text, ids);
        REQUIRE(ids.size() == 1);
        return ids[0];
    };
    for (int v = 0; v < 9; ++v) CHECK(numbers.stepped(id(std::to_string(v)), 1) == id(std::to_string(v + 1)));
    CHECK(numbers.step(id("3"), id("8")) == 5);
    CHECK(numbers.step(id("8"), id("3")) == -5);
    CHECK(numbers.stepped(id("9"), 1) == -1); // "10" is two tokens: no number of one digit
    CHECK_FALSE(numbers.step(id("3"), id("x")).has_value());
    CHECK(&tok->numbers() == &numbers); // looked up once
}

TEST_CASE("a model file carries the BPE tokenizer") {
    test::temp_dir dir;
    random_model_options o;
    o.n_layer = 1;
    o.n_embd = 16;
    o.n_head = 2;
    o.n_head_kv = 1;
    o.head_dim = 8;
    o.n_expert = 2;
    o.n_expert_used = 1;
    o.n_ff_exp = 32;
    o.n_vocab = 32000;
    o.tokenizer_model = tokenizer_dir("llama2") + "/tokenizer.json";
    const std::string path = dir.file("llama2-bpe.colibri");
    write_random_model(o, path, format::dtype::f32, {});
    const model_file file(path);
    CHECK(file.tokenizer().kind == static_cast<uint32_t>(format::tokenizer_kind::bpe));
    const auto tok = make_tokenizer(file);
    CHECK(tok->n_vocab() == 32000);
    CHECK(tok->bos_id() == 1);
    CHECK(tok->eos_id() == 2);
    CHECK(tok->add_bos());
    CHECK(tok->strips_leading_space());
    for (const json& c : cases("llama2")) {
        if (c["name"] != "python") continue;
        std::vector<int32_t> ids;
        tok->encode(c["text"].get<std::string>(), ids);
        CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    }
}

TEST_CASE("convert_checkpoint embeds tokenizer.json when there is no tokenizer.model") {
    namespace fs = std::filesystem;
    test::temp_dir dir;
    const fs::path ckpt = dir.file("ckpt");
    fs::create_directories(ckpt);
    for (const char* f : {"config.json", "model.safetensors"}) {
        fs::copy_file(test::fixture(std::string("qwen3_moe/") + f), ckpt / f);
    }
    std::ofstream(ckpt / "tokenizer.json") << tiny_tokenizer_json().dump();
    const std::string out = dir.file("bpe.colibri");
    convert_checkpoint(ckpt.string(), out, format::dtype::f32, {});
    const model_file file(out);
    CHECK(file.tokenizer().kind == static_cast<uint32_t>(format::tokenizer_kind::bpe));
    const auto tok = make_tokenizer(file);
    CHECK(tok->bos_id() == 1); // config.json's bos_token_id / eos_token_id
    CHECK(tok->eos_id() == 2);
    std::vector<int32_t> ids;
    tok->encode("abc ab", ids);
    CHECK(ids == std::vector<int32_t>{6, 5, 6, 4});

    // A vocabulary larger than the model's is refused, naming both sizes.
    fs::copy_file(tokenizer_dir("qwen3") + "/tokenizer.json", ckpt / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    try {
        convert_checkpoint(ckpt.string(), dir.file("too-big.colibri"), format::dtype::f32, {});
        FAIL("accepted a tokenizer larger than the model's vocabulary");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("151669 token ids, more than the model's vocabulary of 512") !=
              std::string::npos);
    }
}

TEST_CASE("every step kind of the payload round-trips through a small tokenizer") {
    test::temp_dir dir;
    const auto tok = load(tiny_section(dir, tiny_tokenizer_json()));
    std::vector<int32_t> ids;
    tok->encode("abc ab", ids); // "▁abc▁ab": a b -> ab, then ab c -> abc
    CHECK(ids == std::vector<int32_t>{6, 5, 6, 4});
    CHECK(tok->decode(ids) == "abc ab");
    ids.clear();
    tok->encode("a<s>b", ids, special_tokens::parsed); // each stretch between added tokens is normalised alone
    CHECK(ids == std::vector<int32_t>{6, 1, 11, 6, 2});
    CHECK(tok->decode(ids) == "a b");
    ids.clear();
    tok->encode("a  <mask>  b", ids, special_tokens::parsed); // lstrip and rstrip swallow the spaces around <mask>
    CHECK(ids == std::vector<int32_t>{6, 1, 12, 6, 2});
    CHECK(tok->decode(ids) == "a<mask> b");
    ids.clear();
    tok->encode("A\xC3\xA9zz11", ids); // A, é by byte fallback; z z fused into one unk; 1 1
    CHECK(ids == std::vector<int32_t>{6, 7, 8, 9, 0, 10, 10});
    CHECK(tok->decode(ids) == "A\xC3\xA9<unk>11"); // <unk> is no added token here: it decodes as text
}

TEST_CASE("tokens matched in normalised text are normalised themselves, as the reference does") {
    test::temp_dir dir;
    json j = tiny_tokenizer_json();
    j["added_tokens"][1]["normalized"] = true; // "<mask>" is looked for as "▁<mask>"
    j["added_tokens"][1]["lstrip"] = false;
    j["added_tokens"][1]["rstrip"] = false;
    const auto tok = load(tiny_section(dir, j));
    std::vector<int32_t> ids;
    tok->encode("a <mask> b", ids, special_tokens::parsed);
    CHECK(ids == std::vector<int32_t>{6, 1, 12, 6, 2});
    ids.clear();
    tok->encode("a<mask>b", ids, special_tokens::parsed); // no "▁<mask>" here: the characters are ordinary text
    CHECK(ids == std::vector<int32_t>{6, 1, 0, 1, 0, 2});
    ids.clear();
    tok->encode("<mask>", ids, special_tokens::parsed);
    CHECK(ids == std::vector<int32_t>{12});
}

TEST_CASE("user text that spells a control token is encoded as text unless parsing is asked for") {
    const auto tok = load(import_tokenizer_json(tokenizer_dir("qwen3") + "/tokenizer.json"));
    const int32_t endoftext = tok->piece_to_id("<|endoftext|>"), fim_prefix = tok->piece_to_id("<|fim_prefix|>");
    REQUIRE(endoftext == 151643);
    REQUIRE(fim_prefix == 151659); // not special in tokenizer.json, a control token all the same
    const std::string text = "x = '<|endoftext|>' + \"<|fim_prefix|>\" <think>";
    std::vector<int32_t> ids;
    tok->encode(text, ids);
    CHECK(std::find(ids.begin(), ids.end(), endoftext) == ids.end());
    CHECK(std::find(ids.begin(), ids.end(), fim_prefix) == ids.end());
    CHECK(std::find(ids.begin(), ids.end(), tok->piece_to_id("<think>")) != ids.end()); // an ordinary added token
    CHECK(tok->decode(ids) == text);
    for (int32_t id : ids) CHECK_FALSE(tok->is_control(id));
    std::vector<int32_t> parsed;
    tok->encode(text, parsed, special_tokens::parsed);
    CHECK(std::count(parsed.begin(), parsed.end(), endoftext) == 1);
    CHECK(std::count(parsed.begin(), parsed.end(), fim_prefix) == 1);
}

TEST_CASE("corrupt BPE payloads are refused with a clear error") {
    test::temp_dir dir;
    const tokenizer_section sec = tiny_section(dir, tiny_tokenizer_json());
    auto refuse = [&](std::vector<uint8_t> payload, const std::string& expect, uint32_t n_vocab = 64) {
        CAPTURE(expect);
        try {
            make_bpe_tokenizer(payload, sec.header, n_vocab, "model.colibri");
            FAIL("accepted a corrupt payload");
        } catch (const error& e) {
            CHECK(e.code() == errc::format);
            CHECK(std::string(e.what()).find("model.colibri: tokenizer section") != std::string::npos);
            CHECK(std::string(e.what()).find(expect) != std::string::npos);
        }
    };
    // Every truncation, at every byte.
    for (size_t n = 0; n < sec.payload.size(); ++n) {
        CAPTURE(n);
        refuse({sec.payload.begin(), sec.payload.begin() + static_cast<ptrdiff_t>(n)}, "");
    }
    auto patched = [&](size_t at, uint32_t v) {
        auto p = sec.payload;
        std::memcpy(p.data() + at, &v, 4);
        return p;
    };
    refuse(patched(0, 0x12345678), "wrong magic");
    refuse(patched(4, 9), "unsupported BPE payload version 9");
    refuse(patched(8, 1u << 30), "unknown model flags");
    refuse(patched(16, 0xFFFFFFF0u), "n_tokens");
    refuse(sec.payload, "n_tokens 13 is not in 1..n_vocab (12)", 12);
    auto trailing = sec.payload;
    trailing.push_back(0);
    refuse(trailing, "1 unexpected bytes after the last field");
    // The merge list begins after the 13 tokens; point its first left id past the vocabulary.
    size_t at = 20;
    for (int i = 0; i < 13; ++i) {
        uint32_t len;
        std::memcpy(&len, sec.payload.data() + at, 4);
        at += 4 + len;
    }
    refuse(patched(at + 4, 999), "merge left id 999 is not a model token");
    // A split pattern that does not compile.
    json bad = tiny_tokenizer_json();
    bad["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "(unclosed";
    refuse(tiny_section(dir, bad).payload, "does not compile");
}

TEST_CASE("added token ids the reference library would reassign are refused") {
    test::temp_dir dir;
    json j = tiny_tokenizer_json();
    j["added_tokens"][1]["id"] = 20; // the library would make <mask> id 12
    try {
        tiny_section(dir, j);
        FAIL("accepted");
    } catch (const error& e) {
        CHECK(e.code() == errc::format);
        CHECK(std::string(e.what()).find(
                  "added token '<mask>' has id 20 but the reference library would give it id 12") != std::string::npos);
    }
}

TEST_CASE("a tokenizer.json with values of the wrong JSON type is refused as a format error") {
    test::temp_dir dir;
    json j = tiny_tokenizer_json();
    j["model"]["dropout"] = "high";
    CHECK_THROWS_AS(tiny_section(dir, j), error);
    j = tiny_tokenizer_json();
    j["model"]["merges"][0] = 7;
    CHECK_THROWS_WITH_AS(tiny_section(dir, j), doctest::Contains("merge 0 is neither"), error);
    j = tiny_tokenizer_json();
    j["model"]["vocab"]["a"] = -1;
    CHECK_THROWS_WITH_AS(tiny_section(dir, j), doctest::Contains("vocab id of 'a' is not a valid id"), error);
    j = tiny_tokenizer_json();
    j["model"]["merges"].push_back("a zz");
    CHECK_THROWS_WITH_AS(tiny_section(dir, j), doctest::Contains("merge 2: 'zz' is not in the vocabulary"), error);
}

TEST_CASE("tokenizer.json features the engine lacks are refused by name") {
    test::temp_dir dir;
    auto refused = [&](json j, const std::string& name) {
        CAPTURE(name);
        try {
            tiny_section(dir, j);
            FAIL("accepted");
        } catch (const error& e) {
            CHECK(e.code() == errc::unsupported);
            CHECK(std::string(e.what()).find(name + " is not supported") != std::string::npos);
        }
    };
    json j = tiny_tokenizer_json();
    j["model"]["type"] = "WordPiece";
    refused(j, "model type WordPiece");
    j = tiny_tokenizer_json();
    j["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "▁"})");
    refused(j, "pre-tokenizer Metaspace");
    j = tiny_tokenizer_json();
    j["normalizer"] = json::parse(R"({"type": "Lowercase"})");
    refused(j, "normalizer Lowercase");
    j = tiny_tokenizer_json();
    j["decoder"] = json::parse(R"({"type": "WordPiece"})");
    refused(j, "decoder WordPiece");
    j = tiny_tokenizer_json();
    j["added_tokens"][0]["single_word"] = true;
    refused(j, "added token with single_word (<s>)");
    j = tiny_tokenizer_json();
    j["pre_tokenizer"] = json::parse(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})");
    refused(j, "ByteLevel pre-tokenizer with add_prefix_space");
}

TEST_CASE("ill-formed UTF-8 becomes one U+FFFD per maximal subpart, as Python and Rust read it") {
    auto lossy = [](std::string_view s) {
        std::string out;
        unicode::append_utf8_lossy(out, s);
        return out;
    };
    CHECK(lossy("caf\xC3 \xE2\x82 end\xF0\x9F\x98") == "caf\xEF\xBF\xBD \xEF\xBF\xBD end\xEF\xBF\xBD");
    CHECK(lossy("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");                 // overlong: each byte
    CHECK(lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"); // surrogate: each byte
    CHECK(lossy("ok \xE2\x82\xAC") == "ok \xE2\x82\xAC");                   // valid: unchanged
    CHECK(unicode::is_valid_utf8("plain ascii and \xE2\x82\xAC"));
    CHECK_FALSE(unicode::is_valid_utf8("\xF4\x90\x80\x80")); // past U+10FFFF
}

TEST_CASE("Oniguruma patterns are translated for PCRE2 where the two differ") {
    CHECK(onig_to_pcre2(R"(\s+(?!\S))") == R"([\s\x{85}]+(?![^\s\x{85}]))");
    CHECK(onig_to_pcre2(R"([^\s\p{L}]+)") == R"([^\s\x{85}\p{L}]+)");
    CHECK(onig_to_pcre2(R"([]a]\\s)") == R"([]a]\\s)"); // literal ']' first; an escaped backslash
    CHECK_THROWS_AS(onig_to_pcre2(R"(\h+)"), error);
}

TEST_CASE("qwen's repository tokens frame context files as Qwen2.5-Coder was trained (and llama-server sends)") {
    const auto tok = load(import_tokenizer_json(tokenizer_dir("qwen3") + "/tokenizer.json"));
    const fim_template fim = detect_fim(*tok);
    REQUIRE(fim.kind == fim_kind::qwen);
    REQUIRE(fim.repo_name == tok->piece_to_id("<|repo_name|>"));
    REQUIRE(fim.file_sep == tok->piece_to_id("<|file_sep|>"));
    const std::vector<context_file> files = {{"src/util.py", "def helper():\n    return 1\n"}, {"", "x = 1\n"}};
    generate_request req;
    req.prompt = "def main():\n    ";
    req.suffix = "\n";
    req.context = files;
    const std::vector<int32_t> ids = prompt_tokens(*tok, req, 4096);

    std::vector<int32_t> want = {fim.repo_name};
    tok->encode("myproject\n", want);
    want.push_back(fim.file_sep);
    tok->encode("src/util.py\n", want);
    tok->encode(files[0].text, want);
    want.push_back(fim.file_sep);
    tok->encode("tmp\n", want); // a chunk without a name, as llama-server names it
    tok->encode(files[1].text, want);
    want.push_back(fim.file_sep);
    tok->encode("filename\n", want);
    build_fim_prompt(*tok, fim, req.prompt, *req.suffix, fim_order::psm, want);
    CHECK(ids == want);
}
