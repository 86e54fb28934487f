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
