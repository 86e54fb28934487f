#include "core/error.h"
#include "generate/generate.h"
#include "tokenizer/tokenizer.h"

#include <doctest/doctest.h>

using namespace colibri;

TEST_CASE("stop strings are found across piece boundaries and never emitted") {
    stop_matcher m({"\n\n", "END"});
    std::string out;
    out += m.push("hello E");
    CHECK(out == "hello "); // "E" may start "END"
    out += m.push("N");
    CHECK(out == "hello ");
    out += m.push("x world\n");
    CHECK(out == "hello ENx world");
    CHECK_FALSE(m.matched());
    out += m.push("\nmore");
    CHECK(m.matched());
    CHECK(out == "hello ENx world");
    CHECK(m.push("ignored").empty());
}

TEST_CASE("text held back by a stop prefix is released at the end") {
    stop_matcher m({"abc"});
    CHECK(m.push("xxab") == "xx");
    CHECK(m.flush() == "ab");
}

TEST_CASE("no stop strings: text passes straight through") {
    stop_matcher m({});
    CHECK(m.push("a") == "a");
    CHECK(m.push("") == "");
    CHECK(m.flush().empty());
}

TEST_CASE("UTF-8 helpers") {
    CHECK(utf8_complete_prefix("abc") == 3);
    CHECK(utf8_complete_prefix("a\xE4\xB8") == 1);     // 中 cut after 2 of 3 bytes
    CHECK(utf8_complete_prefix("a\xE4\xB8\xAD") == 4); // complete
    CHECK(utf8_complete_prefix("\xF0\x9F\x98") == 0);  // emoji cut
    std::string out;
    append_valid_utf8(out, "ok\xFF\xE4\xB8\xAD\x80");
    CHECK(out == "ok\xEF\xBF\xBD\xE4\xB8\xAD\xEF\xBF\xBD");
    out.clear();
    append_valid_utf8(out, "\xC0\xAF"); // overlong '/'
    CHECK(out == "\xEF\xBF\xBD\xEF\xBF\xBD");
}

#include "api/runtime.h"
#include "convert/convert.h"
#include "test_util.h"

namespace {

std::string complete(session& s, const runtime& rt, const std::string& prompt, generate_result* out = nullptr) {
    sampler smp(static_cast<int>(rt.mdl->hp().n_vocab));
    generate_request req;
    req.prompt = prompt;
    req.max_tokens = 12;
    req.sampling.temperature = 0.0f;
    std::string text;
    const generate_result r = generate(s, *rt.tok, smp, req, [&](std::string_view p) {
        text.append(p);
        return true;
    });
    if (out != nullptr) *out = r;
    return text;
}

} // namespace

TEST_CASE("a prompt that extends the last one reuses the cache and completes identically") {
    test::temp_dir dir;
    for (format::dtype type : {format::dtype::f32, format::dtype::q8_0}) {
    CAPTURE(format::dtype_name(type));
    const std::string path = dir.file("qwen2.colibri");
    convert_checkpoint(test::fixture("qwen2_moe"), path, type, {});
    auto rt = load_runtime(path, "cpu", 2);
    session warm(*rt->mdl, *rt->be, 256, 8);
    const std::string a = "def route(x):\n    return softmax(x)";
    const std::string b = a + "[:2] + 1";
    generate_result r1, r2, r3;
    const std::string first = complete(warm, *rt, a, &r1);
    CHECK(r1.n_cached_tokens == 0);
    const std::string reused = complete(warm, *rt, b, &r2);
    CHECK(r2.n_cached_tokens > 0);
    CHECK(r2.n_cached_tokens < r2.n_prompt_tokens);
    // the same prompt on a fresh session: identical text
    session cold(*rt->mdl, *rt->be, 256, 8);
    CHECK(complete(cold, *rt, b, &r3) == reused);
    CHECK(r3.n_cached_tokens == 0);
    // the whole prompt again: all but the last token from the cache, same text
    generate_result r4;
    CHECK(complete(warm, *rt, b, &r4) == reused);
    CHECK(r4.n_cached_tokens == r4.n_prompt_tokens - 1);
    // back to the shorter prompt: only the shared prefix is reused, text as before
    generate_result r5;
    CHECK(complete(warm, *rt, a, &r5) == first);
    CHECK(r5.n_cached_tokens <= r1.n_prompt_tokens - 1);
    }
}

#include "generate/fim.h"

#include <map>

namespace {

// A vocabulary of named special pieces; text encodes one id per byte (1000 + byte).
class fake_tokenizer final : public tokenizer {
public:
    explicit fake_tokenizer(std::map<std::string, int32_t> pieces) : pieces_(std::move(pieces)) {}
    void encode(std::string_view text, std::vector<int32_t>& out) const override {
        for (unsigned char c : text) out.push_back(1000 + c);
    }
    std::string decode(std::span<const int32_t>) const override { return {}; }
    void append_bytes(int32_t, std::string&) const override {}
    std::string piece(int32_t) const override { return {}; }
    bool is_control(int32_t) const override { return false; }
    int32_t piece_to_id(std::string_view p) const override {
        auto it = pieces_.find(std::string(p));
        return it == pieces_.end() ? -1 : it->second;
    }
    int32_t n_vocab() const override { return 2000; }

private:
    std::map<std::string, int32_t> pieces_;
};

} // namespace

TEST_CASE("fill-in-the-middle templates are detected from the vocabulary") {
    const fake_tokenizer star({{"<fim_prefix>", 1}, {"<fim_suffix>", 2}, {"<fim_middle>", 3}, {"<|endoftext|>", 4}, {"<fim_pad>", 5}});
    const fake_tokenizer qwen({{"<|fim_prefix|>", 7}, {"<|fim_suffix|>", 8}, {"<|fim_middle|>", 9}, {"<|endoftext|>", 10}, {"<|fim_pad|>", 11}});
    const fake_tokenizer deepseek({{"<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", 20},
                                   {"<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", 21},
                                   {"<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", 22}});
    const fake_tokenizer codellama({{"\xE2\x96\x81<PRE>", 30}, {"\xE2\x96\x81<SUF>", 31}, {"\xE2\x96\x81<MID>", 32}, {"\xE2\x96\x81<EOT>", 33}});
    const fake_tokenizer plain({{"<s>", 1}});

    fim_template t = detect_fim(star);
    CHECK(t.kind == fim_kind::starcoder);
    CHECK(t.stop == std::vector<int32_t>{4, 5});
    CHECK(detect_fim(qwen).kind == fim_kind::qwen);
    CHECK(detect_fim(deepseek).kind == fim_kind::deepseek);
    t = detect_fim(codellama);
    CHECK(t.kind == fim_kind::codellama);
    CHECK(t.stop == std::vector<int32_t>{33});
    CHECK(detect_fim(plain).kind == fim_kind::none);
    CHECK(fim_kind_name(fim_kind::deepseek) == "deepseek");

    // prefix-suffix-middle order
    std::vector<int32_t> ids;
    build_fim_prompt(qwen, detect_fim(qwen), "ab", "c", ids);
    CHECK(ids == std::vector<int32_t>{7, 1000 + 'a', 1000 + 'b', 8, 1000 + 'c', 9});

    // forcing a family the vocabulary lacks names the missing token
    try {
        fim_for(plain, fim_kind::starcoder);
        FAIL("no error");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("<fim_prefix>") != std::string::npos);
    }
    fim_kind k;
    CHECK(parse_fim_kind("codellama", k));
    CHECK(k == fim_kind::codellama);
    CHECK_FALSE(parse_fim_kind("santacoder", k));
}

TEST_CASE("a suffix on a model without FIM tokens completes the prompt alone") {
    test::temp_dir dir;
    const std::string path = dir.file("llama.colibri");
    convert_checkpoint(test::fixture("llama"), path, format::dtype::f32, {});
    auto rt = load_runtime(path, "cpu", 1);
    session s(*rt->mdl, *rt->be, 128, 8);
    sampler smp(static_cast<int>(rt->mdl->hp().n_vocab));
    generate_request req;
    req.prompt = "def f(x):";
    req.max_tokens = 4;
    req.sampling.temperature = 0.0f;
    const generate_result plain = generate(s, *rt->tok, smp, req, [](std::string_view) { return true; });
    req.suffix = "    return x";
    const generate_result with_suffix = generate(s, *rt->tok, smp, req, [](std::string_view) { return true; });
    CHECK(with_suffix.fim == fim_kind::none);
    CHECK(with_suffix.n_prompt_tokens == plain.n_prompt_tokens);
    req.fim = fim_kind::qwen;
    CHECK_THROWS_AS(generate(s, *rt->tok, smp, req, [](std::string_view) { return true; }), error);
}
