#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "colibri/protocol/line_framer.hpp"

using colibri::protocol::line_framer;
using result = line_framer::result;

namespace {

std::vector<std::string> drain(line_framer& f, result* last = nullptr) {
    std::vector<std::string> lines;
    std::string line;
    result r;
    while ((r = f.next(line)) == result::line) lines.push_back(line);
    if (last) *last = r;
    return lines;
}

} // namespace

TEST_CASE("framer splits lines and keeps the unfinished tail") {
    line_framer f(64);
    f.feed("{\"a\":1}\n{\"b\":2}\n{\"c\"");
    result last;
    auto lines = drain(f, &last);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == "{\"a\":1}");
    CHECK(lines[1] == "{\"b\":2}");
    CHECK(last == result::need_more);
    CHECK(f.buffered() == 4);
    f.feed(":3}\n");
    lines = drain(f);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] == "{\"c\":3}");
    CHECK(f.buffered() == 0);
}

TEST_CASE("framer reassembles a line fed one byte at a time") {
    line_framer f(64);
    const std::string text = "hello world\nsecond\n";
    std::vector<std::string> lines;
    for (char c : text) {
        f.feed(std::string_view(&c, 1));
        for (auto& l : drain(f)) lines.push_back(l);
    }
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == "hello world");
    CHECK(lines[1] == "second");
}

TEST_CASE("framer strips one CR and skips empty lines") {
    line_framer f(64);
    f.feed("a\r\n\n\r\nb\r\r\n");
    auto lines = drain(f);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == "a");
    CHECK(lines[1] == "b\r");
}

TEST_CASE("framer accepts a line of exactly the limit and refuses one byte more") {
    line_framer f(8);
    f.feed("12345678\n");
    auto lines = drain(f);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] == "12345678");

    line_framer g(8);
    g.feed("123456789\n{\"ok\":1}\n");
    result last;
    CHECK(drain(g, &last).empty());
    CHECK(last == result::too_long);
}

TEST_CASE("framer reports too_long before the newline arrives and stays there") {
    line_framer f(8);
    f.feed("12345678");
    result last;
    CHECK(drain(f, &last).empty());
    CHECK(last == result::need_more);
    f.feed("9");
    CHECK(drain(f, &last).empty());
    CHECK(last == result::too_long);
    CHECK(f.buffered() == 0); // the oversized bytes are not kept
    f.feed("\nshort\n");
    CHECK(drain(f, &last).empty());
    CHECK(last == result::too_long);
}

TEST_CASE("framer passes binary bytes through untouched") {
    line_framer f(64);
    const std::string garbage("\x00\xff\xfe\x01\x7f", 5);
    f.feed(garbage + "\n");
    auto lines = drain(f);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] == garbage);
}

TEST_CASE("framer buffer stays bounded over many lines") {
    line_framer f(32);
    std::size_t n = 0;
    for (int i = 0; i < 10000; ++i) {
        f.feed("line " + std::to_string(i) + "\npart");
        n += drain(f).size();
        f.feed("ial\n");
        n += drain(f).size();
        CHECK(f.buffered() == 0);
    }
    CHECK(n == 20000);
}
