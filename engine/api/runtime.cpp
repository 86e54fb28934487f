#include "api/runtime.h"

#include "core/cpu_count.h"
#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_query.h"

#include <algorithm>
#include <charconv>

namespace colibri {

device_spec parse_device(const std::string& text) {
    if (text.empty() || text == "cpu") return {};
    if (text.rfind("cuda", 0) == 0) {
        device_spec d{device_spec::kind::cuda, 0};
        if (text.size() == 4) return d;
        const char* b = text.data() + 5;
        const char* e = text.data() + text.size();
        auto [p, ec] = std::from_chars(b, e, d.index);
        if (text[4] == ':' && ec == std::errc() && p == e && b != e && d.index >= 0) return d;
    }
    throw error(errc::invalid_argument, "unknown device '" + text + "' (expected cpu or cuda:N)");
}

device_spec usable_device(const std::string& text) {
    const device_spec d = parse_device(text);
    if (d.type == device_spec::kind::cuda) {
        std::string why;
        const int count = cuda_device_count(why);
        if (count < 0) throw error(errc::unsupported, "device " + text + ": " + why);
        if (d.index >= count) {
            throw error(errc::unsupported,
                        "device " + text + ": " +
                            (count == 0 ? "no CUDA GPU is present" + (why.empty() ? "" : " (" + why + ")")
                                        : "only " + std::to_string(count) + " CUDA device(s) present"));
        }
    }
    return d;
}

std::unique_ptr<runtime> load_runtime(const std::string& path, const std::string& device, int n_threads,
                                      bool f32_activations, size_t device_weight_budget) {
    const device_spec d = usable_device(device);
    if (n_threads < 0) throw error(errc::invalid_argument, "thread count must be >= 0");
    auto rt = std::make_unique<runtime>();
    rt->mdl = std::make_unique<model>(path);
    rt->tok = make_tokenizer(rt->mdl->file());
    if (d.type == device_spec::kind::cuda) {
        cuda_options co;
        co.device = d.index;
        co.weight_budget = device_weight_budget;
        for (const tensor_view& t : rt->mdl->file().tensors()) co.tensors.push_back(&t);
        const auto& layers = rt->mdl->layers();
        for (size_t l = 0; l < layers.size(); ++l) {
            for (size_t e = 0; e < layers[l].experts.size(); ++e) {
                const expert_weights& x = layers[l].experts[e];
                co.experts.push_back({int(l), int(e), x.gate, x.up, x.down});
            }
        }
        rt->be = make_cuda_backend(co);
        rt->device = "cuda:" + std::to_string(d.index);
        return rt;
    }
    const auto& hp = rt->mdl->hp();
    const int64_t max_cols = std::max({hp.n_embd, hp.n_head * hp.head_dim, hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp});
    cpu_options co;
    co.n_threads = n_threads > 0 ? n_threads : usable_cpu_count();
    co.int8_activations = !f32_activations;
    rt->be = make_cpu_backend(co, max_cols);
    rt->device = "cpu";
    return rt;
}

bool start_page_in(runtime& rt, uint64_t available) {
    const auto bytes = rt.mdl->file().bytes();
    if (available > 0 && bytes.size() > available) return false;
    rt.paging = std::make_unique<page_in>(bytes.data(), bytes.size());
    return true;
}

} // namespace colibri
