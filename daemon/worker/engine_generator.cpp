#include "engine_generator.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "colibri.h"
#include "slot_policy.hpp"

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

/// One model and a pool of sessions (KV-cache slots). A request runs on the slot whose
/// cache shares the longest prefix with its prompt (slot_policy.hpp); slots are created on
/// first use, and emptied least recently used first to keep the cached tokens of all of
/// them under the memory cap. A session's cache takes memory only for the tokens it holds.
class engine_generator final : public generator {
public:
    explicit engine_generator(const worker_options& opts)
        : slots_(static_cast<std::size_t>(opts.slots)), cap_bytes_(static_cast<std::size_t>(opts.cache_mb) << 20),
          fim_spm_(opts.fim_spm), batch_(opts.batch) {
        colibri_model_params mp;
        colibri_model_params_init(&mp);
        mp.device = opts.device.c_str();
        mp.gpu_memory_mib = opts.gpu_memory_mib;
        mp.n_threads = opts.threads;
        mp.page_in = 1; // requests come later: the first should not pay for the page faults
        if (auto s = colibri_model_load(opts.model.c_str(), &mp, &model_); s != COLIBRI_OK)
            throw std::runtime_error("cannot load model '" + opts.model + "': " + last_error(s));
        try {
            session(0); // the first slot now: a model that cannot hold a session fails at start
        } catch (...) {
            colibri_model_free(model_);
            throw;
        }
        token_bytes_ = colibri_session_token_bytes(slots_[0].s);
    }

    ~engine_generator() override {
        for (auto& entry : slots_) colibri_session_free(entry.s);
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
                {"n_ctx", colibri_session_n_ctx(slots_[0].s)}, // what a completion may take
                {"n_ctx_train", mi.n_ctx},
                {"n_params", mi.n_params},
                {"n_params_active", mi.n_params_active},
                {"file_size", mi.file_size},
                {"fim", mi.fim ? mi.fim : "none"},
                {"fim_order", (fim_spm_ < 0 ? mi.fim_spm != 0 : fim_spm_ != 0) ? "spm" : "psm"},
                {"prompt_batch", colibri_session_n_batch(slots_[0].s)},
                {"cache", cache_stats()}};
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
        gp.max_lines = req.max_lines;
        gp.stop_on_dedent = req.stop_on_dedent ? 1 : 0;
        gp.min_indent = req.min_indent;
        std::vector<colibri_context_file> context;
        for (const auto& f : req.context)
            context.push_back({f.filename.data(), f.filename.size(), f.text.data(), f.text.size()});
        gp.context = context.empty() ? nullptr : context.data();
        gp.n_context = context.size();
        gp.speculative = req.speculative ? 1 : 0;
        gp.fim_spm = fim_spm_;
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

        colibri_session* const s = place(req, gp);
        colibri_generate_result r{};
        const auto status = colibri_generate(
            s, req.prompt.data(), req.prompt.size(), &gp,
            [](void* user, const char* piece, size_t len) -> int {
                return static_cast<piece_sink*>(user)->piece(std::string_view(piece, len)) ? 0 : 1;
            },
            &sink, &r);
        ++stats_.requests;
        if (status == COLIBRI_OK) {
            stats_.prompt_tokens += static_cast<std::uint64_t>(r.n_prompt_tokens);
            stats_.cached_tokens += static_cast<std::uint64_t>(r.n_cached_tokens);
            if (r.n_cached_tokens > 0) ++stats_.hits;
        }
        if (status == COLIBRI_ERR_INVALID_ARGUMENT || status == COLIBRI_ERR_CONTEXT_FULL)
            throw generate_error(p::error_code::invalid_request, last_error(status));
        if (status == COLIBRI_ERR_DEVICE) throw device_failure(last_error(status));
        if (status != COLIBRI_OK) throw generate_error(p::error_code::internal, last_error(status));

        result out;
        out.reason = map_finish(r.finish_reason);
        out.tokens.prompt_tokens = r.n_prompt_tokens;
        out.tokens.completion_tokens = r.n_generated_tokens;
        out.tokens.cached_tokens = r.n_cached_tokens;
        out.tokens.drafted_tokens = r.n_drafted_tokens;
        out.tokens.accepted_tokens = r.n_accepted_tokens;
        out.prefill_ms = r.prompt_ms;
        out.decode_ms = r.generate_ms;
        return out;
    }

    nlohmann::json cache_stats() const override {
        std::size_t used = 0, tokens = 0;
        nlohmann::json per_slot = nlohmann::json::array();
        for (const auto& entry : slots_) {
            const auto n = static_cast<std::size_t>(colibri_session_n_cached(entry.s));
            used += n > 0 ? 1 : 0;
            tokens += n;
            per_slot.push_back(n);
        }
        colibri_expert_cache_stats ec{};
        colibri_model_expert_cache(model_, &ec);
        nlohmann::json experts = nullptr; // only with a GPU weight budget
        if (ec.slots_per_layer > 0)
            experts = {{"slots_per_layer", ec.slots_per_layer},
                       {"hits", ec.hits},
                       {"misses", ec.misses},
                       {"bytes_copied", ec.bytes_copied}};
        return {{"slots", slots_.size()},
                {"experts", experts},
                {"slots_used", used},
                {"slot_tokens", per_slot},
                {"memory_bytes", tokens * token_bytes_},
                {"memory_cap_bytes", cap_bytes_},
                {"token_bytes", token_bytes_},
                {"requests", stats_.requests},
                {"hits", stats_.hits},
                {"prompt_tokens", stats_.prompt_tokens},
                {"cached_tokens", stats_.cached_tokens},
                {"hit_rate", stats_.prompt_tokens > 0
                                 ? static_cast<double>(stats_.cached_tokens) / static_cast<double>(stats_.prompt_tokens)
                                 : 0.0},
                {"evictions", stats_.evictions}};
    }

private:
    struct slot {
        colibri_session* s = nullptr; ///< created on first use
        std::uint64_t last_used = 0;
        std::string session; ///< the request session that used it last ("" for none)
    };

    colibri_session* session(std::size_t i) {
        if (slots_[i].s == nullptr) {
            colibri_session_params sp;
            colibri_session_params_init(&sp);
            sp.n_batch = batch_;
            if (auto st = colibri_session_create(model_, &sp, &slots_[i].s); st != COLIBRI_OK)
                throw std::runtime_error("cannot create a session: " + last_error(st));
        }
        return slots_[i].s;
    }

    /// Picks the slot for this request and empties others as the memory cap requires.
    colibri_session* place(const p::complete_request& req, const colibri_generate_params& gp) {
        std::vector<colibri_session*> live;
        std::vector<std::size_t> live_index;
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            if (slots_[i].s != nullptr && colibri_session_n_cached(slots_[i].s) > 0) {
                live.push_back(slots_[i].s);
                live_index.push_back(i);
            }
        }
        std::vector<std::size_t> reusable(live.size());
        std::size_t n_prompt = 0;
        if (auto st = colibri_prompt_match(model_, live.data(), live.size(), req.prompt.data(), req.prompt.size(), &gp,
                                           reusable.data(), &n_prompt);
            st != COLIBRI_OK)
            throw generate_error(st == COLIBRI_ERR_INVALID_ARGUMENT ? p::error_code::invalid_request
                                                                    : p::error_code::internal,
                                 last_error(st));
        std::vector<slot_state> states(slots_.size());
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            states[i].n_cached = static_cast<std::size_t>(colibri_session_n_cached(slots_[i].s));
            states[i].last_used = slots_[i].last_used;
            states[i].same_session = !req.session.empty() && slots_[i].session == req.session;
        }
        for (std::size_t k = 0; k < live.size(); ++k) states[live_index[k]].reusable = reusable[k];
        const std::size_t chosen = choose_slot(states);
        const slot_state& c = states[chosen];
        if (c.n_cached > 0 && (c.reusable == 0 || (2 * c.reusable < c.n_cached && !c.same_session)))
            ++stats_.evictions; // replaced
        const std::size_t need = n_prompt + static_cast<std::size_t>(std::max(0, req.max_tokens));
        for (std::size_t i : slots_to_evict(states, chosen, need, token_bytes_, cap_bytes_)) {
            colibri_session_reset(slots_[i].s);
            ++stats_.evictions;
        }
        slots_[chosen].last_used = ++clock_;
        slots_[chosen].session = req.session;
        return session(chosen);
    }

    struct counters {
        std::uint64_t requests = 0, hits = 0, prompt_tokens = 0, cached_tokens = 0, evictions = 0;
    };

    colibri_model* model_ = nullptr;
    std::vector<slot> slots_;
    std::size_t cap_bytes_;
    int fim_spm_; // 1 suffix first, 0 prefix first, -1 the model file's order
    int batch_;   // prompt tokens per eval (0: the engine's default)
    std::size_t token_bytes_ = 0;
    std::uint64_t clock_ = 0;
    counters stats_;
};

} // namespace

std::unique_ptr<generator> make_engine_generator(const worker_options& opts) {
    return std::make_unique<engine_generator>(opts);
}

} // namespace colibri::worker
