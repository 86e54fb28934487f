// The embedded sentencepiece tokenizer against ids recorded from the reference library.

#include "convert/convert.h"
#include "format/model_file.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#include <doctest/doctest.h>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace colibri;

namespace {

struct tokenizer_fixture {
    test::temp_dir dir;
    std::unique_ptr<model_file> file;
    std::unique_ptr<tokenizer> tok;
    tokenizer_fixture() {
        const random_model_options o = test::small_random_model();
        const std::string path = dir.file("tok.colibri");
        write_random_model(o, path, format::dtype::f32, {});
        file = std::make_unique<model_file>(path);
        tok = make_tokenizer(*file);
    }
};

nlohmann::json cases() {
    std::ifstream in(test::fixture("tokenizer/cases.json"));
    return nlohmann::json::parse(in);
}

} // namespace

TEST_CASE("encode and decode match the reference sentencepiece library") {
    tokenizer_fixture f;
    const auto all = cases();
    REQUIRE(all.size() >= 20);
    for (const auto& c : all) {
        const std::string text = c["text"].get<std::string>();
        CAPTURE(text);
        std::vector<int32_t> ids;
        f.tok->encode(text, ids);
        CHECK(ids == c["ids"].get<std::vector<int32_t>>());
        CHECK(f.tok->decode(ids) == c["decoded"].get<std::string>());
        std::vector<int32_t> with_bos{f.tok->bos_id()};
        with_bos.insert(with_bos.end(), ids.begin(), ids.end());
        CHECK(with_bos == c["ids_with_bos"].get<std::vector<int32_t>>());
    }
}

TEST_CASE("streamed pieces concatenate to the decoded text and are valid UTF-8") {
    tokenizer_fixture f;
    for (const auto& c : cases()) {
        const auto ids = c["ids"].get<std::vector<int32_t>>();
        CAPTURE(c["text"].get<std::string>());
        text_stream stream(*f.tok, true);
        std::string joined;
        for (int32_t id : ids) {
            const std::string piece = stream.push(id);
            std::string valid;
            append_valid_utf8(valid, piece);
            CHECK(valid == piece); // never a split character
            joined += piece;
        }
        joined += stream.flush();
        CHECK(joined == c["decoded"].get<std::string>());
    }
}

TEST_CASE("a continuation keeps its leading space") {
    tokenizer_fixture f;
    std::vector<int32_t> ids;
    f.tok->encode("x = 1", ids);
    text_stream start(*f.tok, true), cont(*f.tok, false);
    std::string a, b;
    for (int32_t id : ids) {
        a += start.push(id);
        b += cont.push(id);
    }
    CHECK(a == "x = 1");
    CHECK(b == " x = 1");
}

TEST_CASE("BOS and EOS come from the model file") {
    tokenizer_fixture f;
    CHECK(f.tok->bos_id() == 1);
    CHECK(f.tok->eos_id() == 2);
    CHECK(f.tok->add_bos());
    CHECK(f.tok->is_control(1));
    CHECK(f.tok->piece(1) == "<s>");
}
