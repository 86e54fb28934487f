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
