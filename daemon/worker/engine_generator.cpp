#include "engine_generator.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "colibri.h"

namespace colibri::worker {

namespace p = protocol;

namespace {

std::string last_error(colibri_status status) {
    std::string msg = colibri_last_error();
    if (msg.empty()) msg = colibri_status_name(status);
    return msg;
}

p::finish_reason map_finish(colibri_finish_reason r) {
    switch (r) {
    case COLIBRI_FINISH_LENGTH: return p::finish_reason::length;
    case COLIBRI_FINISH_EOS: return p::finish_reason::stop;
    case COLIBRI_FINISH_STOP: return p::finish_reason::stop;
    case COLIBRI_FINISH_CANCELLED: return p::finish_reason::cancelled;
    case COLIBRI_FINISH_CONTEXT: return p::finish_reason::length;
    }
    return p::finish_reason::stop;
}

class engine_generator final : public generator {
public:
    explicit engine_generator(const worker_options& opts) {
        colibri_model_params mp;
        colibri_model_params_init(&mp);
        mp.device = opts.device.c_str();
        mp.n_threads = opts.threads;
        if (auto s = colibri_model_load(opts.model.c_str(), &mp, &model_); s != COLIBRI_OK)
            throw std::runtime_error("cannot load model '" + opts.model + "': " + last_error(s));
        colibri_session_params sp;
        colibri_session_params_init(&sp);
        if (auto s = colibri_session_create(model_, &sp, &session_); s != COLIBRI_OK) {
            colibri_model_free(model_);
            throw std::runtime_error("cannot create a session: " + last_error(s));
        }
    }

    ~engine_generator() override {
        colibri_session_free(session_);
        colibri_model_free(model_);
    }

    nlohmann::json info() const override {
        colibri_model_info mi{};
        if (colibri_model_get_info(model_, &mi) != COLIBRI_OK) return nlohmann::json::object();
        return {{"architecture", mi.architecture ? mi.architecture : ""},
                {"quant", mi.quant ? mi.quant : ""},
                {"backend", mi.backend ? mi.backend : ""},
                {"n_threads", mi.n_threads},
                {"n_layer", mi.n_layer},
                {"n_embd", mi.n_embd},
                {"n_expert", mi.n_expert},
                {"n_expert_used", mi.n_expert_used},
                {"n_vocab", mi.n_vocab},
                {"n_ctx", mi.n_ctx},
                {"n_params", mi.n_params},
                {"n_params_active", mi.n_params_active},
                {"file_size", mi.file_size},
                {"fim", mi.fim ? mi.fim : "none"}};
    }

    result generate(const p::worker::run_msg& job, piece_sink& sink) override {
        const auto& req = job.req;
        colibri_generate_params gp;
        colibri_generate_params_init(&gp);
        gp.max_tokens = req.max_tokens;
        gp.temperature = req.temperature;
        gp.top_k = req.top_k;
        gp.top_p = req.top_p;
        gp.min_p = req.min_p;
        gp.repeat_penalty = req.repeat_penalty;
        gp.seed = job.seed;
        std::vector<const char*> stop;
        for (const auto& s : req.stop) stop.push_back(s.c_str());
        gp.stop = stop.empty() ? nullptr : stop.data();
        gp.n_stop = stop.size();
        if (!req.suffix.empty()) {
            gp.suffix = req.suffix.data();
            gp.suffix_len = req.suffix.size();
        }
        // Polled between prompt chunks too: a cancel stops a long prefill promptly, and the
        // watchdog hears that a long prefill is progressing.
        gp.cancel = [](void* user) -> int { return static_cast<piece_sink*>(user)->poll() ? 1 : 0; };
        gp.cancel_user = &sink;

        colibri_generate_result r{};
        const auto status = colibri_generate(
            session_, req.prompt.data(), req.prompt.size(), &gp,
            [](void* user, const char* piece, size_t len) -> int {
                return static_cast<piece_sink*>(user)->piece(std::string_view(piece, len)) ? 0 : 1;
            },
            &sink, &r);
        if (status == COLIBRI_ERR_INVALID_ARGUMENT || status == COLIBRI_ERR_CONTEXT_FULL)
            throw generate_error(p::error_code::invalid_request, last_error(status));
        if (status != COLIBRI_OK) throw generate_error(p::error_code::internal, last_error(status));

        result out;
        out.reason = map_finish(r.finish_reason);
        out.tokens.prompt_tokens = r.n_prompt_tokens;
        out.tokens.completion_tokens = r.n_generated_tokens;
        out.tokens.cached_tokens = r.n_cached_tokens;
        out.prefill_ms = r.prompt_ms;
        out.decode_ms = r.generate_ms;
        return out;
    }

private:
    colibri_model* model_ = nullptr;
    colibri_session* session_ = nullptr;
};

} // namespace

std::unique_ptr<generator> make_engine_generator(const worker_options& opts) {
    return std::make_unique<engine_generator>(opts);
}

} // namespace colibri::worker
