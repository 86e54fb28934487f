// The CUDA backend against the CPU backend (label gpu; the same file on the CUDA emulation):
// whole models of every family and GGUF type, the refusal without a GPU, and recorded steps.

#include "api/runtime.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda/device_weights.h"
#include "cuda_test_util.h"
#include "device_test_util.h"
#include "model/model.h"
#include "model/session.h"
#include "test_util.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace colibri;
using namespace colibri::test;

TEST_CASE("without a usable GPU the CUDA backend is refused with the reason") {
    std::string why;
    cuda_options o;
    if (cuda_device_count(why) > 0) o.device = 99; // with a GPU: one that is not there
    check_refused([&] { make_cuda_backend(o); }, errc::unsupported, "cuda:" + std::to_string(o.device));
}

TEST_CASE("whole models of every family give the CPU's logits on the device") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 4, 250};
    for (const std::string& family : test::family_names()) {
        for (format::dtype quant : {format::dtype::f32, format::dtype::q8_0, format::dtype::q4_0}) {
            CAPTURE(family);
            CAPTURE(format::dtype_name(quant));
            const std::string path = dir.file(std::string(family) + ".colibri");
            convert_checkpoint(test::fixture(family), path, quant, {});
            auto cpu = load_runtime(path, "cpu", 2, true);
            auto gpu = load_runtime(path, "cuda:0", 0);
            const int vocab = static_cast<int>(cpu->mdl->hp().n_vocab);
            session sc(*cpu->mdl, *cpu->be, 64), sg(*gpu->mdl, *gpu->be, 64);
            const auto step = [&](const int32_t* tokens, int n) {
                sc.eval(tokens, n);
                sg.eval(tokens, n);
                check_close(std::vector<float>(sg.logits(), sg.logits() + vocab),
                            std::vector<float>(sc.logits(), sc.logits() + vocab), 1e-3f);
            };
            step(prompt.data(), int(prompt.size()));
            for (int32_t t : {7, 8, 9}) step(&t, 1);
            // a cache cut back and extended again
            sc.truncate(4);
            sg.truncate(4);
            step(prompt.data() + 4, 3);
            // a batch of 24: the products of quantised weights on the tensor cores
            std::vector<int32_t> batch(24);
            for (size_t i = 0; i < batch.size(); ++i) batch[i] = int32_t(3 + (i * 37) % 200);
            step(batch.data(), int(batch.size()));
        }
    }
}

TEST_CASE("llama.cpp's files of every GGUF type give the CPU's logits on the device") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 4, 250};
    // tests/reference/generate_gguf_kquants.py: between them every type the converter keeps
    for (const char* name :
         {"q4_k_m", "q5_k_m", "q6_k", "iq4_xs", "iq4_nl", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m"}) {
        CAPTURE(name);
        const std::string path = dir.file(std::string(name) + ".colibri");
        convert_gguf(test::fixture(std::string("gguf/kquant-") + name + ".gguf"), path, std::nullopt, {});
        auto cpu = load_runtime(path, "cpu", 2, true);
        auto gpu = load_runtime(path, "cuda:0", 0);
        const int vocab = static_cast<int>(cpu->mdl->hp().n_vocab);
        session sc(*cpu->mdl, *cpu->be, 64), sg(*gpu->mdl, *gpu->be, 64);
        sc.eval(prompt.data(), int(prompt.size()));
        sg.eval(prompt.data(), int(prompt.size()));
        check_close(std::vector<float>(sg.logits(), sg.logits() + vocab),
                    std::vector<float>(sc.logits(), sc.logits() + vocab), 1e-3f);
        const int32_t t = 9;
        sc.eval(&t, 1);
        sg.eval(&t, 1);
        check_close(std::vector<float>(sg.logits(), sg.logits() + vocab),
                    std::vector<float>(sc.logits(), sc.logits() + vocab), 1e-3f);
    }
}

TEST_CASE("the backend reports its recorded steps, and with COLIBRI_CUDA_PROFILE set each operation's device time") {
    if (!gpu_present()) return;
    test::temp_dir dir;
    const std::string path = dir.file("qwen2.colibri");
    convert_checkpoint(test::fixture("qwen2_moe"), path, format::dtype::q8_0, {});
    auto plain = load_runtime(path, "cuda:0", 0);
    CHECK(cuda_profile_report(*plain->be) == "one-token steps: 0 replayed from 0 recordings, 0 not recordable\n");
    ::setenv("COLIBRI_CUDA_PROFILE", "1", 1);
    auto profiled = load_runtime(path, "cuda:0", 0);
    ::unsetenv("COLIBRI_CUDA_PROFILE");
    const int vocab = static_cast<int>(plain->mdl->hp().n_vocab);
    session sp(*plain->mdl, *plain->be, 32), sq(*profiled->mdl, *profiled->be, 32);
    const std::vector<int32_t> prompt = {1, 15, 27, 3};
    sp.eval(prompt.data(), 4);
    sq.eval(prompt.data(), 4);
    for (int32_t t : {7, 8, 9}) { // plain steps while profiling: no graph, the same logits
        sp.eval(&t, 1);
        sq.eval(&t, 1);
        CHECK(std::vector<float>(sp.logits(), sp.logits() + vocab) ==
              std::vector<float>(sq.logits(), sq.logits() + vocab));
    }
    const std::string report = cuda_profile_report(*profiled->be);
    INFO(report);
    for (const char* op : {"product q8 batch", "product q8 1 token", "attention", "rmsnorm", "moe_one", "embed"}) {
        CHECK(report.find(op) != std::string::npos);
    }
    CHECK(report.starts_with("one-token steps: 0 replayed from 0 recordings, 0 not recordable\n"));
    // without profiling: the first step plain, the second recorded, the third replayed
    CHECK(cuda_profile_report(*plain->be) == "one-token steps: 1 replayed from 1 recordings, 0 not recordable\n");
}
