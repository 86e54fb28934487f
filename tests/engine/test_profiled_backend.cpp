// The timing wrapper of colibri-bench --ops: it changes no result, and it attributes every
// byte a decode step reads.

#include "api/runtime.h"
#include "convert/convert.h"
#include "model/profiled_backend.h"
#include "model/session.h"
#include "test_util.h"

#include <cstring>
#include <doctest/doctest.h>

using namespace colibri;
using op = profiled_backend::op;

TEST_CASE("through the timing wrapper every family decodes the same logits and a step's bytes are the model's") {
    test::temp_dir dir;
    const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 4, 250};
    for (const std::string& family : test::family_names()) {
        for (format::dtype quant : {format::dtype::f32, format::dtype::q4_0}) {
            CAPTURE(family);
            CAPTURE(format::dtype_name(quant));
            const std::string path = dir.file(family + ".colibri");
            convert_checkpoint(test::fixture(family), path, quant, {});
            auto rt = load_runtime(path, "cpu", 2);
            const model& m = *rt->mdl;
            const auto& hp = m.hp();
            const int vocab = static_cast<int>(hp.n_vocab);
            profiled_backend profiled(*rt->be, m);
            session plain(m, *rt->be, 64), timed(m, profiled, 64);
            const auto same_logits = [&] {
                return std::memcmp(plain.logits(), timed.logits(), size_t(vocab) * sizeof(float)) == 0;
            };
            plain.eval(prompt.data(), int(prompt.size()));
            timed.eval(prompt.data(), int(prompt.size()));
            CHECK(same_logits());
            for (const profiled_backend::op_stats& s : profiled.stats()) CHECK(s.calls == 0); // not recording yet

            const int32_t next = 42;
            const int pos = timed.n_past();
            profiled.set_recording(true);
            timed.eval(&next, 1);
            profiled.set_recording(false);
            plain.eval(&next, 1);
            CHECK(same_logits());

            const auto& st = profiled.stats();
            const auto calls = [&](op o) { return st[static_cast<size_t>(o)].calls; };
            double bytes = 0;
            for (const profiled_backend::op_stats& s : st) {
                bytes += s.bytes;
                if (s.calls > 0) CHECK(s.seconds > 0);
            }
            // the bench's bytes per decoded token: weights, then keys and values of every position
            const double expected = m.decode_weight_bytes() + double(timed.kv_bytes_read(pos));
            CHECK(bytes == doctest::Approx(expected).epsilon(1e-9));
            CHECK(st[static_cast<size_t>(op::attention)].bytes == doctest::Approx(double(timed.kv_bytes_read(pos))));
            if (hp.sliding_window > 0 && hp.sliding_window <= uint32_t(pos)) { // windows read less than the whole cache
                CHECK(timed.kv_bytes_read(pos) < timed.token_bytes() * size_t(pos + 1));
            }

            const uint64_t layers = hp.n_layer;
            uint64_t moe = 0; // layers with experts (some families start with dense ones)
            for (const layer_weights& l : m.layers()) moe += l.is_moe() ? 1 : 0;
            const bool qk_norm = m.layers().front().q_norm != nullptr;
            const layer_weights& l0 = m.layers().front();
            const int biases =
                (l0.bq != nullptr ? 3 : 0) + (l0.bo != nullptr ? 1 : 0) + (l0.dense.up_bias != nullptr ? 2 : 0);
            // a GELU MLP's up, GELU, down one by one
            const bool one_by_one = !l0.is_moe() && l0.dense.gate == nullptr;
            const bool sandwich = l0.attn_post_norm != nullptr;
            // latent attention: the latent's norm (and the query's), three products into the
            // latent space (k_b's included), three row copies around the attention, v_b's product
            const bool latent = l0.mla.kv_a != nullptr;
            const uint64_t latent_norms = latent ? (l0.mla.q_a != nullptr ? 2 : 1) : 0;
            CHECK(calls(op::embedding) == 1);
            CHECK(calls(op::norms) ==
                  (2 + latent_norms) * layers + 1 + (qk_norm ? 2 * layers : 0) + (sandwich ? 2 * layers : 0));
            CHECK(calls(op::qkv) == (latent ? 3 : 1) * layers);
            CHECK(calls(op::biases) == uint64_t(biases) * layers);
            CHECK(calls(op::rope) == 2 * layers);
            CHECK(calls(op::attention) == (latent ? 4 : 1) * layers);
            CHECK(calls(op::attention_output) == (latent ? 2 : 1) * layers);
            CHECK(calls(op::router) == moe);
            CHECK(calls(op::feed_forwards) == (one_by_one ? 3 : 1) * layers);
            CHECK(calls(op::expert_sum) == moe);
            CHECK(calls(op::residuals) == 2 * layers);
            CHECK(calls(op::lm_head) == 1);
            CHECK(calls(op::other) == (hp.logit_scale != 1.0f ? 1 : 0) + (hp.final_softcap > 0 ? 1 : 0));
        }
    }
}
