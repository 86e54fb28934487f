#include "core/error.h"
#include "generate/generate.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <doctest/doctest.h>
#include <numeric>

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

namespace {
std::string limit_all(line_limiter& l, std::initializer_list<std::string_view> pieces) {
    std::string out;
    for (std::string_view p : pieces) out += l.push(p);
    return out;
}
} // namespace

TEST_CASE("max_lines ends the completion before the newline that starts the next line") {
    line_limiter one(1, -1);
    CHECK(limit_all(one, {"return x", " + 1\n", "next"}) == "return x + 1");
    CHECK(one.matched());
    CHECK(one.push("more").empty());
    CHECK(one.flush().empty());

    line_limiter three(3, -1);
    CHECK(limit_all(three, {"a\nb", "\n\nd\ne"}) == "a\nb\n");
    CHECK(three.matched());

    line_limiter off(0, -1);
    CHECK(limit_all(off, {"a\n\n", "b\n"}) == "a\n\nb\n");
    CHECK_FALSE(off.matched());
    CHECK(off.flush().empty());
}

TEST_CASE("stop on dedent holds indentation until a visible character decides") {
    line_limiter l(0, 4);
    CHECK(l.push("x = 1\n") == "x = 1"); // the newline waits for the next line
    CHECK(l.push("    ") == "");
    CHECK(l.push("  y") == "\n      y"); // deeper: emitted with its indentation
    CHECK(l.push("\n\n  \n") == "");     // blank lines never decide
    CHECK(l.push("    z") == "\n\n  \n    z");
    CHECK(l.push("\n\t\t\t\tw\n") == "\n\t\t\t\tw"); // a tab counts one column
    CHECK(l.push("\t\tret") == "");                  // 2 < 4
    CHECK(l.matched());
    CHECK(l.flush().empty());

    line_limiter end(0, 2);
    CHECK(end.push("a\n  ") == "a");
    CHECK_FALSE(end.matched());
    CHECK(end.flush() == "\n  "); // generation ended: the held text is released

    line_limiter both(2, 0); // indentation 0 never dedents; the line limit still applies
    CHECK(both.push("a\nb\nc") == "a\nb");
    CHECK(both.matched());
}

TEST_CASE("the cursor's indentation is the last line's leading whitespace") {
    CHECK(last_line_indent("def f():\n    return ") == 4);
    CHECK(last_line_indent("x") == 0);
    CHECK(last_line_indent("a\n\t  ") == 3);
    CHECK(last_line_indent("a\n") == 0);
    CHECK(last_line_indent("") == 0);
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

// The qwen2_moe fixture converted to q8_0 in dir, on two threads.
std::unique_ptr<runtime> qwen2_moe_q8(const test::temp_dir& dir) {
    const std::string path = dir.file("qwen2.colibri");
    convert_checkpoint(test::fixture("qwen2_moe"), path, format::dtype::q8_0, {});
    return load_runtime(path, "cpu", 2);
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

TEST_CASE("a prompt batch abandoned between layers leaves the session as it was") {
    test::temp_dir dir;
    auto rt = qwen2_moe_q8(dir);
    REQUIRE(rt->mdl->hp().n_layer >= 2);
    const size_t n_vocab = rt->mdl->hp().n_vocab;
    const std::vector<int32_t> a = {11, 12, 13, 14, 15, 16}, b = {21, 22, 23, 24, 25};
    session s(*rt->mdl, *rt->be, 64, 8);
    s.eval(a.data(), int(a.size()));
    const std::vector<float> after_a(s.logits(), s.logits() + n_vocab);
    int asked = 0;
    const std::function<bool()> stop_now = [&] { return ++asked >= 1; };
    CHECK_FALSE(s.eval(b.data(), int(b.size()), stop_now));
    CHECK(asked == 1); // after the first layer
    CHECK(s.n_past() == int(a.size()));
    CHECK(std::vector<int32_t>(s.history().begin(), s.history().end()) == a);
    CHECK(std::equal(after_a.begin(), after_a.end(), s.logits()));
    // the batch again, to the end: the bits of a session that never abandoned it
    int asked_later = 0;
    CHECK(s.eval(b.data(), int(b.size()), [&] { return ++asked_later > 1000; }));
    CHECK(asked_later == int(rt->mdl->hp().n_layer) - 1);
    session fresh(*rt->mdl, *rt->be, 64, 8);
    fresh.eval(a.data(), int(a.size()));
    fresh.eval(b.data(), int(b.size()));
    CHECK(std::equal(fresh.logits(), fresh.logits() + n_vocab, s.logits()));
    // a decode step stops the same way
    const std::vector<float> after_b(s.logits(), s.logits() + n_vocab);
    int asked_one = 0;
    CHECK_FALSE(s.eval(b.data(), 1, [&] { return ++asked_one > 0; }));
    CHECK(asked_one == 1);
    CHECK(s.n_past() == int(a.size() + b.size()));
    CHECK(std::equal(after_b.begin(), after_b.end(), s.logits()));
}

// A greedy completion of a short prompt on the qwen2_moe fixture whose cancel check
// answers true from its stop_at-th poll on.
struct cancelled_run {
    std::unique_ptr<runtime> rt;
    std::unique_ptr<session> s;
    generate_request req;
    generate_result r;
    int polls = 0, pieces = 0;
};

void run_cancelled(cancelled_run& c, const test::temp_dir& dir, int stop_at, int max_tokens = 8) {
    c.rt = qwen2_moe_q8(dir);
    c.s = std::make_unique<session>(*c.rt->mdl, *c.rt->be, 256, 64);
    sampler smp(static_cast<int>(c.rt->mdl->hp().n_vocab));
    c.req.prompt = "def route(x):\n    return softmax(x)";
    c.req.max_tokens = max_tokens;
    c.req.sampling.temperature = 0.0f;
    c.req.cancelled = [&c, stop_at] { return ++c.polls >= stop_at; };
    c.r = generate(*c.s, *c.rt->tok, smp, c.req, [&c](std::string_view) { return ++c.pieces > 0; });
}

TEST_CASE("a cancel during a decode step ends the completion with the token emitted and uncached") {
    test::temp_dir dir;
    cancelled_run c;
    const int layers = static_cast<int>(qwen2_moe_q8(dir)->mdl->hp().n_layer);
    // the prompt (one batch: a poll before it and one per layer after the first), then the
    // first token's check before its pick, then its step's first poll between layers
    const int stop_at = 1 + (layers - 1) + 1 + 1;
    run_cancelled(c, dir, stop_at);
    CHECK(c.r.reason == finish_reason::cancelled);
    CHECK(c.polls == stop_at);
    CHECK(c.r.n_generated_tokens == 1);
    CHECK(c.s->n_past() == c.r.n_prompt_tokens); // the emitted token's step was abandoned
}

TEST_CASE("a cancel during a prompt batch ends the completion before the batch does") {
    test::temp_dir dir;
    cancelled_run c;
    run_cancelled(c, dir, 2); // before the batch: no; after its first layer: yes
    CHECK(c.r.reason == finish_reason::cancelled);
    CHECK(c.polls == 2);
    CHECK(c.r.n_generated_tokens == 0);
    CHECK(c.pieces == 0);
    CHECK(c.s->n_past() == 0); // the one batch was the whole prompt: nothing cached
    // the same prompt completes as on a fresh session
    session fresh(*c.rt->mdl, *c.rt->be, 256, 64);
    generate_result r1, r2;
    const std::string prompt(c.req.prompt);
    CHECK(complete(*c.s, *c.rt, prompt, &r1) == complete(fresh, *c.rt, prompt, &r2));
    CHECK(r1.n_cached_tokens == 0);
}

TEST_CASE("a cancelled warm-up still caches the prompt batch it was in") {
    // A warm-up (no tokens to generate) leaves its prompt for the request that follows,
    // usually the one that supersedes it: its batch is not abandoned between layers.
    test::temp_dir dir;
    cancelled_run c;
    run_cancelled(c, dir, 2, 0);                 // the cancel answers true from the first layer on
    CHECK(c.polls == 1);                         // asked before the batch, not between its layers
    CHECK(c.s->n_past() == c.r.n_prompt_tokens); // the one batch: all of the prompt
    generate_result r;
    complete(*c.s, *c.rt, std::string(c.req.prompt), &r);
    CHECK(r.n_cached_tokens == c.r.n_prompt_tokens - 1); // the last token is evaluated again for its logits
}

#include "generate/fim.h"

#include <map>

namespace {

// A vocabulary of named special pieces; text encodes one id per byte (1000 + byte).
class fake_tokenizer final : public tokenizer {
public:
    explicit fake_tokenizer(std::map<std::string, int32_t> pieces) : pieces_(std::move(pieces)) {}
    void encode(std::string_view text, std::vector<int32_t>& out, special_tokens) const override {
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
    const fake_tokenizer star(
        {{"<fim_prefix>", 1}, {"<fim_suffix>", 2}, {"<fim_middle>", 3}, {"<|endoftext|>", 4}, {"<fim_pad>", 5}});
    const fake_tokenizer qwen({{"<|fim_prefix|>", 7},
                               {"<|fim_suffix|>", 8},
                               {"<|fim_middle|>", 9},
                               {"<|endoftext|>", 10},
                               {"<|fim_pad|>", 11}});
    const fake_tokenizer deepseek({{"<\xEF\xBD\x9C"
                                    "fim\xE2\x96\x81"
                                    "begin\xEF\xBD\x9C>",
                                    20},
                                   {"<\xEF\xBD\x9C"
                                    "fim\xE2\x96\x81"
                                    "hole\xEF\xBD\x9C>",
                                    21},
                                   {"<\xEF\xBD\x9C"
                                    "fim\xE2\x96\x81"
                                    "end\xEF\xBD\x9C>",
                                    22}});
    const fake_tokenizer codellama(
        {{"\xE2\x96\x81<PRE>", 30}, {"\xE2\x96\x81<SUF>", 31}, {"\xE2\x96\x81<MID>", 32}, {"\xE2\x96\x81<EOT>", 33}});
    const fake_tokenizer granite(
        {{"<fim_prefix>", 1}, {"<fim_suffix>", 2}, {"<fim_middle>", 3}, {"<|end_of_text|>", 0}});
    const fake_tokenizer codestral({{"</s>", 2}, {"[PREFIX]", 12}, {"[SUFFIX]", 13}, {"[MIDDLE]", 14}});
    const fake_tokenizer plain({{"<s>", 1}});

    fim_template t = detect_fim(star);
    CHECK(t.kind == fim_kind::starcoder);
    CHECK(t.stop == std::vector<int32_t>{4, 5});
    t = detect_fim(granite);
    CHECK(t.kind == fim_kind::starcoder);
    CHECK(t.stop == std::vector<int32_t>{0});
    t = detect_fim(codestral);
    CHECK(t.kind == fim_kind::codestral);
    CHECK(t.stop == std::vector<int32_t>{2});
    for (const fim_order order : {fim_order::psm, fim_order::spm}) { // Codestral's own order either way
        std::vector<int32_t> c;
        build_fim_prompt(codestral, t, "ab", "c", order, c);
        CHECK(c == std::vector<int32_t>{13, 1000 + 'c', 12, 1000 + 'a', 1000 + 'b'});
    }
    CHECK(detect_fim(qwen).kind == fim_kind::qwen);
    CHECK(detect_fim(deepseek).kind == fim_kind::deepseek);
    t = detect_fim(codellama);
    CHECK(t.kind == fim_kind::codellama);
    CHECK(t.stop == std::vector<int32_t>{33});
    CHECK(detect_fim(plain).kind == fim_kind::none);
    CHECK(fim_kind_name(fim_kind::deepseek) == "deepseek");

    // prefix-suffix-middle order
    std::vector<int32_t> ids;
    build_fim_prompt(qwen, detect_fim(qwen), "ab", "c", fim_order::psm, ids);
    CHECK(ids == std::vector<int32_t>{7, 1000 + 'a', 1000 + 'b', 8, 1000 + 'c', 9});
    // suffix first: the prefix comes last, so typing at the cursor changes only the end
    ids.clear();
    build_fim_prompt(qwen, detect_fim(qwen), "ab", "c", fim_order::spm, ids);
    CHECK(ids == std::vector<int32_t>{7, 8, 1000 + 'c', 9, 1000 + 'a', 1000 + 'b'});

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

TEST_CASE("the converter records the FIM order from tokenizer_config.json or its option") {
    test::temp_dir dir;
    const std::string ckpt = dir.file("ckpt");
    std::filesystem::copy(test::fixture("mixtral"), ckpt); // the directory's files
    auto order_of = [&](const std::optional<fim_order>& option) {
        const std::string path = dir.file("m.colibri");
        convert_checkpoint(ckpt, path, format::dtype::f32, {}, option);
        return load_runtime(path, "cpu", 1)->tok->fim_suffix_first();
    };
    auto write_config = [&](const std::string& text) { std::ofstream(ckpt + "/tokenizer_config.json") << text; };
    CHECK_FALSE(order_of(std::nullopt)); // no tokenizer_config.json: prefix first
    write_config(R"({"add_bos_token": true, "fim_order": "spm"})");
    CHECK(order_of(std::nullopt));
    CHECK_FALSE(order_of(fim_order::psm)); // the option wins
    write_config(R"({"fim_order": "psm"})");
    CHECK_FALSE(order_of(std::nullopt));
    CHECK(order_of(fim_order::spm));
    write_config(R"({"fim_order": "middle-first"})");
    try {
        order_of(std::nullopt);
        FAIL("a bad fim_order was accepted");
    } catch (const error& e) {
        CHECK(e.code() == errc::invalid_argument);
        CHECK(std::string(e.what()).find(
                  "tokenizer_config.json: fim_order must be 'psm' or 'spm' (got 'middle-first')") != std::string::npos);
    }
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

TEST_CASE("line limits cut the default model's completion where the unlimited one has the line break") {
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 2);
    const std::string prompt = "class Stack:\n    def push(self, item):\n        ";
    auto run = [&](int max_lines, bool dedent) {
        session s(*rt->mdl, *rt->be, 256, 16);
        sampler smp(static_cast<int>(rt->mdl->hp().n_vocab));
        generate_request req;
        req.prompt = prompt;
        req.max_tokens = 64;
        req.sampling.temperature = 0.0f;
        req.max_lines = max_lines;
        req.stop_on_dedent = dedent;
        std::string text;
        const generate_result r = generate(s, *rt->tok, smp, req, [&](std::string_view p) {
            text.append(p);
            return true;
        });
        return std::make_pair(text, r.reason);
    };
    const auto [full, full_reason] = run(0, false);
    CAPTURE(full);
    // The unlimited completion spans several lines, one of them indented less than the
    // cursor's 8 columns, so that every limit below cuts something.
    const size_t first_nl = full.find('\n');
    REQUIRE(first_nl != std::string::npos);
    // The cut comes before the first newline of the blank lines ahead of the dedented line.
    size_t dedent_at = std::string::npos, run_start = std::string::npos;
    for (size_t nl = first_nl; nl != std::string::npos && dedent_at == std::string::npos;
         nl = full.find('\n', nl + 1)) {
        if (run_start == std::string::npos) run_start = nl;
        size_t i = nl + 1;
        while (i < full.size() && (full[i] == ' ' || full[i] == '\t')) ++i;
        if (i == full.size() || full[i] == '\n' || full[i] == '\r') continue; // blank so far
        if (i - (nl + 1) < 8) dedent_at = run_start;
        run_start = std::string::npos;
    }
    REQUIRE(dedent_at != std::string::npos);

    const auto [one, one_reason] = run(1, false);
    CHECK(one == full.substr(0, first_nl));
    CHECK(one_reason == finish_reason::stop);
    const size_t second_nl = full.find('\n', first_nl + 1);
    if (second_nl != std::string::npos) CHECK(run(2, false).first == full.substr(0, second_nl));
    const auto [dedented, dedent_reason] = run(0, true);
    CHECK(dedented == full.substr(0, dedent_at));
    CHECK(dedent_reason == finish_reason::stop);
}

TEST_CASE("user text that spells FIM or end-of-text tokens stays text in the prompt; parsing is an opt-in") {
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 1);
    const tokenizer& tok = *rt->tok;
    const fim_template fim = detect_fim(tok);
    REQUIRE(fim.kind == fim_kind::starcoder);
    generate_request req;
    req.prompt = "s = '<fim_suffix>' # <fim_middle>\n";
    req.suffix = "t = \"<fim_prefix></s>\"\n";
    fim_template used;
    const std::vector<int32_t> ids = prompt_tokens(tok, req, 4096, &used);
    for (const int32_t framing : {fim.prefix, fim.suffix, fim.middle}) {
        CHECK(std::count(ids.begin(), ids.end(), framing) == 1); // the engine's own framing only
    }
    CHECK(std::count(ids.begin(), ids.end(), tok.eos_id()) == 0);
    // the text between the framing tokens decodes back to the user's text
    const auto at = [&](int32_t id) { return size_t(std::find(ids.begin(), ids.end(), id) - ids.begin()); };
    const std::string suffix_text =
        tok.decode(std::span(ids).subspan(at(fim.suffix) + 1, at(fim.middle) - at(fim.suffix) - 1));
    CHECK(suffix_text == req.suffix.value());

    req.specials = special_tokens::parsed;
    const std::vector<int32_t> parsed = prompt_tokens(tok, req, 4096);
    CHECK(std::count(parsed.begin(), parsed.end(), fim.suffix) == 2);
    CHECK(std::count(parsed.begin(), parsed.end(), fim.middle) == 2);
    CHECK(std::count(parsed.begin(), parsed.end(), tok.eos_id()) == 1);
}

TEST_CASE("context files go between BOS and the FIM prompt, each after a snippet line, keeping the end that fits") {
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 1);
    const tokenizer& tok = *rt->tok;
    const fim_template fim = detect_fim(tok);
    REQUIRE(fim.kind == fim_kind::starcoder);
    REQUIRE(fim.file_sep < 0); // the default model has no repository tokens
    const std::vector<context_file> files = {{"util.py", "def helper():\n    return 1\n"}, {"", "x = helper()\n"}};
    generate_request req;
    req.prompt = "def main():\n    ";
    req.suffix = "\n";
    req.max_tokens = 16;
    const std::vector<int32_t> plain = prompt_tokens(tok, req, 4096);
    req.context = files;
    const std::vector<int32_t> ids = prompt_tokens(tok, req, 4096);

    const auto head = std::find(plain.begin(), plain.end(), fim.prefix) - plain.begin();
    std::vector<int32_t> want(plain.begin(), plain.begin() + head);
    for (const context_file& f : files) {
        tok.encode("\n\n--- snippet ---\n\n", want);
        tok.encode(f.text, want);
    }
    want.insert(want.end(), plain.begin() + head, plain.end());
    CHECK(ids == want);

    // A small context keeps the context's end: the prompt and max_tokens still fit.
    const auto ctx_len = static_cast<std::ptrdiff_t>(ids.size() - plain.size());
    const int n_ctx = static_cast<int>(plain.size()) + req.max_tokens + 1 + 5;
    const std::vector<int32_t> cut = prompt_tokens(tok, req, n_ctx);
    REQUIRE(cut.size() == plain.size() + 5);
    CHECK(std::equal(cut.begin() + head, cut.begin() + head + 5, ids.begin() + head + ctx_len - 5));
    CHECK(prompt_tokens(tok, req, static_cast<int>(plain.size())) == plain);
}

TEST_CASE("a prefix and suffix longer than the context keep what is nearest the cursor") {
    // the rule alone: a quarter of the room at most for the suffix, the prefix's end in steps
    std::vector<int32_t> pre(1000), suf(500);
    std::iota(pre.begin(), pre.end(), 0);
    std::iota(suf.begin(), suf.end(), 10000);
    std::vector<int32_t> p = pre, s = suf;
    fit_fim_parts(p, s, 400);
    CHECK(s.size() == 100);
    CHECK(s.front() == 10000); // the suffix's start
    CHECK(p.back() == 999);    // the prefix's end
    CHECK(p.size() + s.size() <= 400);
    CHECK((1000 - p.size()) % fim_prefix_step == 0); // cut in steps
    p = std::vector<int32_t>(pre.begin(), pre.begin() + 100);
    s = suf;
    fit_fim_parts(p, s, 400); // a short prefix leaves the suffix more
    CHECK(p.size() == 100);
    CHECK(s.size() == 300);
    p = pre;
    s = suf;
    fit_fim_parts(p, s, 0); // no room: nothing cut (the request is refused)
    CHECK(p.size() == 1000);
    CHECK(s.size() == 500);

    // the default model's FIM prompt: it fits, and typing at the cursor keeps its first tokens
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 1);
    const tokenizer& tok = *rt->tok;
    std::string body;
    for (int i = 0; i < 300; ++i)
        body += "    total += values[" + std::to_string(i) + "] * weights[" + std::to_string(i) + "]\n";
    const std::string prompt = "def score(values, weights):\n    total = 0\n" + body + "    ret",
                      suffix = "urn total\n\n\n" + body, typed_on = prompt + "u";
    generate_request req;
    req.prompt = prompt;
    req.suffix = suffix;
    req.max_tokens = 32;
    const int n_ctx = 512;
    fim_template fim;
    const std::vector<int32_t> ids = prompt_tokens(tok, req, n_ctx, &fim);
    REQUIRE(fim.kind == fim_kind::starcoder);
    CHECK(static_cast<int>(ids.size()) + req.max_tokens + 1 <= n_ctx);
    CHECK(static_cast<int>(ids.size()) + req.max_tokens + 1 > n_ctx - fim_prefix_step);
    const std::vector<int32_t> full = prompt_tokens(tok, req, 1 << 20);
    const auto at = [](const std::vector<int32_t>& v, int32_t id) {
        return std::find(v.begin(), v.end(), id) - v.begin();
    };
    CHECK(tok.decode(ids).find("    ret") != std::string::npos); // the prefix's end
    CHECK(tok.decode(std::span(ids).subspan(size_t(at(ids, fim.suffix)) + 1, 8)) ==
          tok.decode(std::span(full).subspan(size_t(at(full, fim.suffix)) + 1, 8))); // the suffix's start
    req.prompt = typed_on;
    const std::vector<int32_t> typed = prompt_tokens(tok, req, n_ctx);
    const size_t same = size_t(std::mismatch(ids.begin(), ids.end(), typed.begin(), typed.end()).first - ids.begin());
    CHECK(same + 4 >= ids.size()); // all but the last few tokens: the cached prompt holds

    // generated in a session of that context: a completion, where it used to be refused
    session small(*rt->mdl, *rt->be, n_ctx);
    sampler smp(static_cast<int>(rt->mdl->hp().n_vocab));
    req.sampling.temperature = 0.0f;
    const generate_result r = generate(small, tok, smp, req, [](std::string_view) { return true; });
    CHECK(r.n_prompt_tokens == static_cast<int>(typed.size()));
    CHECK(r.n_generated_tokens > 0);
}

#include "generate/draft.h"

TEST_CASE("drafts are what followed the latest earlier occurrence of the longest suffix, or the copy read on") {
    ngram_drafter d;
    std::vector<int32_t> t = {1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3};
    // suffix [2 3] last seen ending at 9 (then 4 7 8); [8 2 3] never before
    CHECK(d.draft(t, 3) == std::vector<int32_t>{4, 7, 8});
    t.push_back(4); // [2 3 4] seen twice: the latest is followed by 7 8 2 ...
    CHECK(d.draft(t, 2) == std::vector<int32_t>{7, 8});
    t.push_back(7);
    t.push_back(6); // [7 6] never seen: the copy goes on past 6 where it had 8 (one token differs)
    CHECK(d.draft(t, 4) == std::vector<int32_t>{2, 3, 4, 7});
    t.push_back(5);
    t.push_back(0); // two tokens in a row unlike the copy's (2 3), and [5 0], [0] never seen: none
    CHECK(d.draft(t, 4).empty());
    t.push_back(9); // no copy holds: a single token, [9] followed by 2 3 4 7
    CHECK(d.draft(t, 4) == std::vector<int32_t>{2, 3, 4, 7});
    t.push_back(1);
    t.push_back(2); // [1 2]: at the start, followed by 3 4 5 9
    CHECK(d.draft(t, 4) == std::vector<int32_t>{3, 4, 5, 9});
    CHECK(d.draft(t, 0).empty());
    // a different, shorter text starts over
    const std::vector<int32_t> u = {5, 6, 5, 6};
    CHECK(d.draft(u, 3) == std::vector<int32_t>{5, 6, 5}); // [5 6] ended at 2: 5 6, then on as it went
}

TEST_CASE("a copy that holds stays before a later occurrence of a suffix no longer than its own") {
    ngram_drafter d;
    std::vector<int32_t> t = {0, 1, 4, 5, 6, 7, 8, 9, 5, 6, 3, 0, 1};
    CHECK(d.draft(t, 4) == std::vector<int32_t>{4, 5, 6, 7});
    for (const int32_t id : {2, 5, 6}) t.push_back(id); // 2 for 4, then the copy again
    // [5 6] last seen before 3, [2 5 6] never: the copy, right on [5 6] too, goes on
    CHECK(d.draft(t, 2) == std::vector<int32_t>{7, 8});
    // a longer suffix seen elsewhere wins: [9 5 6] was followed by 3
    std::vector<int32_t> u = {0, 1, 4, 5, 6, 7, 8, 9, 5, 6, 3, 0, 1};
    ngram_drafter e;
    CHECK(e.draft(u, 1) == std::vector<int32_t>{4});
    for (const int32_t id : {9, 5, 6}) u.push_back(id);
    CHECK(e.draft(u, 2) == std::vector<int32_t>{3, 0});
}

TEST_CASE("numbers of each width: steps between them, and a number stepped") {
    // a vocabulary with "0".."9" (ids 100 + v), "00".."99" but "42" (200 + v) and "100" (300)
    const number_tokens n([](std::string_view p) -> int32_t {
        if (p.size() == 3) return p == "100" ? 300 : -1;
        const int v = std::stoi(std::string(p));
        return p.size() == 1 ? 100 + v : v == 42 ? -1 : 200 + v;
    });
    CHECK(n.step(103, 107) == 4);
    CHECK(n.step(207, 203) == -4);
    CHECK_FALSE(n.step(107, 207).has_value()); // "7" and "07": other widths
    CHECK_FALSE(n.step(107, 5).has_value());
    CHECK(n.stepped(108, 1) == 109);
    CHECK(n.stepped(109, 1) == -1); // past "9" in one digit
    CHECK(n.stepped(100, -1) == -1);
    CHECK(n.stepped(241, 1) == -1); // "42" is not a token
    CHECK(n.stepped(299, 1) == -1); // "100" has three digits
    CHECK(n.stepped(300, 0) == 300);
    CHECK(n.stepped(7, 1) == -1); // not a number
}

TEST_CASE("a copy of a copy that stepped a number steps it as far again") {
    const number_tokens n([](std::string_view p) -> int32_t { return p.size() == 1 ? 100 + (p[0] - '0') : -1; });
    ngram_drafter d(&n);
    // "f 1 ( x ) ;" then "f" again: the copy drafts "1 ( x ) ;"
    std::vector<int32_t> t = {5, 6, 101, 7, 8, 9, 5, 6};
    CHECK(d.draft(t, 4) == std::vector<int32_t>{101, 7, 8, 9});
    t.push_back(102); // the text wrote 2 where the copy had 1: a step of one
    CHECK(d.draft(t, 3) == std::vector<int32_t>{7, 8, 9});
    for (const int32_t id : {7, 8, 9, 5, 6}) t.push_back(id);
    // the latest "f" is followed by the 2 that stepped its source's 1: drafted as 3
    CHECK(d.draft(t, 4) == std::vector<int32_t>{103, 7, 8, 9});
    t.push_back(103);
    t.push_back(7);
    CHECK(d.draft(t, 2) == std::vector<int32_t>{8, 9}); // the stepped 3 was no miss
    // a step past the width drafts the number as it was
    std::vector<int32_t> u = {5, 6, 108, 7, 5, 6};
    ngram_drafter e(&n);
    CHECK(e.draft(u, 1) == std::vector<int32_t>{108});
    u.push_back(109);
    u.push_back(7);
    u.push_back(5);
    u.push_back(6);
    CHECK(e.draft(u, 2) == std::vector<int32_t>{109, 7});
    // without numbers, copies are drafted as they are
    ngram_drafter plain;
    const std::vector<int32_t> v = {5, 6, 101, 7, 8, 9, 5, 6, 102, 7, 8, 9, 5, 6};
    CHECK(plain.draft(v, 1) == std::vector<int32_t>{102});
}

TEST_CASE("the draft length is the one with the most expected tokens per unit of time") {
    draft_policy p;
    CHECK(p.length(5) == 0); // nothing timed: a plain step first
    // a small dense model: rows cost little until the products turn compute-bound; each
    // size is tried once the one below it is timed
    p.timed(1, 4.0);
    CHECK(p.length(5) == 1);
    CHECK(p.length(0) == 0);
    p.timed(2, 4.0);
    CHECK(p.length(5) == 2);
    p.timed(3, 4.5);
    CHECK(p.length(5) == 3);
    p.timed(4, 5.2);
    for (int i = 0; i < 8; ++i) p.judged(3, 3);
    CHECK(p.acceptance() > 0.95);
    CHECK(p.length(3) == 3);
    for (int i = 0; i < 12; ++i) p.judged(3, 0); // nothing kept: one draft still costs nothing
    CHECK(p.acceptance() < 0.2);
    CHECK(p.length(3) == 1);
    // an MoE: each row reads its own experts
    draft_policy moe;
    moe.timed(1, 10);
    moe.timed(2, 16);
    moe.timed(3, 22);
    CHECK(moe.length(3) == 3); // four not timed yet: taken to cost what three do
    moe.timed(4, 28);
    for (int i = 0; i < 8; ++i) moe.judged(3, 3);
    CHECK(moe.length(3) == 3); // 3.7 tokens in 28 ms against 1 in 10
    for (int i = 0; i < 8; ++i) moe.judged(3, 0);
    CHECK(moe.acceptance() < 0.4);
    CHECK(moe.length(3) == 0); // most drafts refused: one token a step is the fastest
    CHECK(moe.length(2) == 0);
    // a fixed length, whatever the times
    draft_policy two = draft_policy::fixed(2);
    CHECK(two.length(5) == 2);
    CHECK(two.length(1) == 1);
    two.timed(1, 1.0);
    two.timed(3, 100.0);
    CHECK(two.length(5) == 2);
    // a time spoilt by a pause comes back halfway to the smaller size's every forget_after
    // passes without it, until drafting would pay at that cost and it is timed again
    draft_policy spiky;
    spiky.timed(1, 1.0);
    spiky.timed(2, 50.0);
    for (int i = 0; i < 8; ++i) spiky.judged(1, 1); // drafts that come true
    int passes = 0;
    for (; spiky.length(1) == 0 && passes < 10 * draft_policy::forget_after; ++passes) spiky.timed(1, 1.0);
    // 50 -> 25.5 -> 13.3 -> 7.1 -> 4.1 -> 2.5 -> 1.8 ms, where 1.98 tokens a pass pay
    CHECK(passes == 6 * draft_policy::forget_after);
    CHECK(spiky.length(1) == 1);
    // the lowered time was a guess: the pass's own time replaces it
    spiky.timed(2, 2.2);
    CHECK(spiky.length(1) == 0); // 1.98 tokens in 2.2 ms against 1 in 1.0
}

TEST_CASE("drafts after a pass that kept all its drafts are judged apart from those after a refusal") {
    // a text whose copies run long and then end: after a wholly kept pass the next drafts are
    // mostly kept too; after a refusal, mostly refused
    draft_policy p;
    for (int i = 0; i < 12; ++i) {
        for (int j = 0; j < 8; ++j) p.judged(3, 3);
        for (int j = 0; j < 6; ++j) p.judged(3, 0);
    }
    CHECK(p.acceptance() < 0.35); // after a refusal: 0.30
    p.judged(3, 0);
    p.judged(1, 1);              // a plain step whose guess came true: inside a copy again
    CHECK(p.acceptance() > 0.9); // 0.93
    // passes that turn compute-bound past four tokens (a small dense model on two cores)
    const double ms[] = {4.0, 4.0, 4.3, 4.7, 5.4, 6.2, 7.6, 8.8};
    for (int n = 1; n <= 8; ++n) p.timed(n, ms[n - 1]);
    CHECK(p.length(8) == 4); // 4.4 tokens in 5.4 ms
    p.judged(3, 1);
    CHECK(p.length(8) == 1); // after a refusal (0.34): 1.3 tokens in 4.0 ms
}

namespace {

struct run_result {
    std::string text;
    generate_result r;
};

// With drafts, three a pass whatever the host's timing (the default model is too small for
// drafts to pay on time: its passes cost by the token)
run_result run_generate(const runtime& rt, const generate_request& base, bool speculative) {
    session s(*rt.mdl, *rt.be, 256, 16);
    sampler smp(static_cast<int>(rt.mdl->hp().n_vocab));
    generate_request req = base;
    req.speculative = speculative;
    draft_policy three = draft_policy::fixed(3);
    if (req.drafts == nullptr) req.drafts = &three;
    run_result out;
    out.r = generate(s, *rt.tok, smp, req, [&](std::string_view p) {
        out.text.append(p);
        return true;
    });
    CHECK(s.n_past() <= out.r.n_prompt_tokens + out.r.n_generated_tokens); // no rejected draft left cached
    return out;
}

} // namespace

TEST_CASE(
    "speculative decoding gives plain decoding's tokens on every family, greedy and sampled, within every limit") {
    test::temp_dir dir;
    int accepted = 0;
    // a prompt that repeats itself, so that the drafts have something to copy
    const std::string prompt =
        "def route(x):\n    return softmax(x)[:2]\n\ndef route(x):\n    return softmax(x)[:2]\n\ndef route(";
    for (const std::string& family : test::family_names()) {
        CAPTURE(family);
        const std::string path = dir.file(family + ".colibri");
        convert_checkpoint(test::fixture(family), path, format::dtype::q8_0, {});
        auto rt = load_runtime(path, "cpu", 2);
        for (int variant = 0; variant < 6; ++variant) {
            CAPTURE(variant);
            generate_request req;
            req.prompt = prompt;
            req.max_tokens = 40;
            req.sampling.temperature = 0.0f;
            if (variant == 1 || variant == 2) { // seeded sampling: the same samples in the same order
                req.sampling.temperature = 0.9f;
                req.sampling.seed = uint64_t(variant);
            }
            if (variant == 3) req.stop = {"x)", "\n\n"};
            if (variant == 4) req.max_lines = 2, req.stop_on_dedent = true;
            if (variant == 5) req.max_tokens = 3;
            const run_result plain = run_generate(*rt, req, false), spec = run_generate(*rt, req, true);
            CHECK(spec.text == plain.text);
            CHECK(spec.r.reason == plain.r.reason);
            CHECK(spec.r.n_generated_tokens == plain.r.n_generated_tokens);
            CHECK(plain.r.n_drafted_tokens == 0);
            CHECK(spec.r.n_accepted_tokens <= spec.r.n_drafted_tokens);
            accepted += spec.r.n_accepted_tokens;
        }
    }
    CHECK(accepted > 0);
}

TEST_CASE("a copy-heavy completion of the default model keeps most drafts, with the same text") {
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 2);
    const std::string prompt =
        "class Stack:\n    def push(self, item):\n        self.items.append(item)\n"
        "        self.size += 1\n        return self\n\n\nclass Queue:\n    def push(self, item):\n";
    generate_request req;
    req.prompt = prompt; // a view: the string outlives the request
    req.max_tokens = 48;
    req.sampling.temperature = 0.0f;
    const run_result plain = run_generate(*rt, req, false), spec = run_generate(*rt, req, true);
    CAPTURE(plain.text);
    CHECK(spec.text == plain.text);
    CHECK(spec.r.n_drafted_tokens > 0);
    MESSAGE("drafts kept: " << spec.r.n_accepted_tokens << " of " << spec.r.n_drafted_tokens);
    CHECK(spec.r.n_accepted_tokens * 2 > spec.r.n_drafted_tokens);
}

TEST_CASE("sampled with drafts, fifty seeds give plain decoding's fifty completions") {
    // The same draws in the same order: every seed's text is plain decoding's, so the
    // distribution over seeds is too
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 2);
    const std::string prompt = "class Stack:\n    def pop(self):\n        item = self.items.pop()\n"
                               "        self.size -= 1\n        return item\n\n\nclass Queue:\n    def pop(self):\n";
    generate_request req;
    req.prompt = prompt;
    req.max_tokens = 24;
    req.sampling.temperature = 0.7f;
    int accepted = 0, distinct = 0;
    std::string last;
    for (uint64_t seed = 1; seed <= 50; ++seed) {
        CAPTURE(seed);
        req.sampling.seed = seed;
        const run_result plain = run_generate(*rt, req, false), spec = run_generate(*rt, req, true);
        CHECK(spec.text == plain.text);
        accepted += spec.r.n_accepted_tokens;
        distinct += plain.text != last ? 1 : 0;
        last = plain.text;
    }
    CHECK(accepted > 10); // drafts kept under sampling too
    CHECK(distinct > 10); // the seeds do sample different texts
}

TEST_CASE("typing the start of the last completion drafts the rest of it from the session's cache") {
    auto rt = load_runtime(COLIBRI_SOURCE_DIR "/models/default.colibri", "cpu", 2);
    session s(*rt->mdl, *rt->be, 256, 16);
    auto complete_on = [&](session& on, const std::string& prompt) {
        sampler smp(static_cast<int>(rt->mdl->hp().n_vocab));
        draft_policy three = draft_policy::fixed(3);
        generate_request req;
        req.prompt = prompt;
        req.max_tokens = 24;
        req.sampling.temperature = 0.0f;
        req.drafts = &three;
        run_result out;
        out.r = generate(on, *rt->tok, smp, req, [&](std::string_view p) {
            out.text.append(p);
            return true;
        });
        return out;
    };
    const std::string prompt = "import os\n\n\ndef read_lines(path):\n    ";
    const run_result first = complete_on(s, prompt);
    REQUIRE(first.text.size() > 4);
    // the user types the suggestion's first characters: the next request asks again
    const std::string typed = prompt + first.text.substr(0, 3);
    const run_result again = complete_on(s, typed);
    session fresh(*rt->mdl, *rt->be, 256, 16);
    const run_result cold = complete_on(fresh, typed);
    CHECK(again.text == cold.text);
    MESSAGE("drafts kept after typing: " << again.r.n_accepted_tokens << " of " << again.r.n_drafted_tokens
                                         << "; on a fresh session " << cold.r.n_accepted_tokens << " of "
                                         << cold.r.n_drafted_tokens);
    CHECK(again.r.n_accepted_tokens > cold.r.n_accepted_tokens);
    CHECK(again.r.n_accepted_tokens * 2 > again.r.n_generated_tokens);
}
