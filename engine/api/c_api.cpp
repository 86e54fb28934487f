// The C API: exceptions end here and become status codes plus a thread-local message.

#include "colibri.h"

#include "api/runtime.h"
#include "convert/tokenizer_file.h"
#include "core/error.h"
#include "generate/generate.h"

#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>

namespace {

// What a model's sessions share with it: it lives until the model and all its sessions are
// freed, in any order. One call at a time runs on it (the backend's buffers are per call).
struct model_core {
    std::unique_ptr<colibri::runtime> rt;
    std::mutex busy;
};

} // namespace

struct colibri_model {
    std::shared_ptr<model_core> core;
    std::string quant;
};

struct colibri_session {
    std::shared_ptr<model_core> core; // first: destroyed after the session that uses it
    std::unique_ptr<colibri::session> s;
    std::unique_ptr<colibri::sampler> smp;
    colibri::draft_policy drafts; // across the session's requests
};

namespace {

thread_local std::string last_error;

colibri_status fail(colibri_status st, const char* msg) noexcept {
    try {
        last_error = msg;
    } catch (...) { // no memory for the message
        last_error.clear();
    }
    return st;
}

// Runs f, turning every exception into a status.
template <class F>
colibri_status guarded(F&& f) noexcept {
    try {
        last_error.clear();
        return f();
    } catch (const colibri::error& e) {
        return fail(static_cast<colibri_status>(e.code()), e.what());
    } catch (const std::bad_alloc&) {
        return fail(COLIBRI_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& e) {
        return fail(COLIBRI_ERR_INTERNAL, e.what());
    } catch (...) {
        return fail(COLIBRI_ERR_INTERNAL, "an unknown exception");
    }
}

} // namespace

extern "C" {

const char* colibri_last_error(void) { return last_error.c_str(); }

const char* colibri_status_name(colibri_status status) {
    switch (status) {
    case COLIBRI_OK: return "ok";
    case COLIBRI_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case COLIBRI_ERR_IO: return "io";
    case COLIBRI_ERR_FORMAT: return "format";
    case COLIBRI_ERR_UNSUPPORTED: return "unsupported";
    case COLIBRI_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case COLIBRI_ERR_CONTEXT_FULL: return "context_full";
    case COLIBRI_ERR_CANCELLED: return "cancelled";
    case COLIBRI_ERR_INTERNAL: return "internal";
    case COLIBRI_ERR_DEVICE: return "device";
    }
    return "unknown";
}

void colibri_model_params_init(colibri_model_params* params) {
    if (params == nullptr) return;
    params->device = "cpu";
    params->n_threads = 0;
    params->gpu_memory_mib = 0;
    params->page_in = 0;
}

colibri_status colibri_model_load(const char* path, const colibri_model_params* params, colibri_model** out) {
    if (out != nullptr) *out = nullptr;
    if (path == nullptr || out == nullptr) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
    return guarded([&] {
        colibri_model_params p;
        colibri_model_params_init(&p);
        if (params != nullptr) p = *params;
        auto m = std::make_unique<colibri_model>();
        if (p.gpu_memory_mib < 0) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "gpu_memory_mib must not be negative");
        m->core = std::make_shared<model_core>();
        auto& rt = m->core->rt;
        rt = colibri::load_runtime(path, p.device != nullptr ? p.device : "cpu", p.n_threads, false,
                                   size_t(p.gpu_memory_mib) << 20);
        if (p.page_in != 0) colibri::start_page_in(*rt);
        m->quant =
            std::string(colibri::format::dtype_name(static_cast<colibri::format::dtype>(rt->mdl->hp().weight_type)));
        *out = m.release();
        return COLIBRI_OK;
    });
}

void colibri_model_free(colibri_model* model) {
    if (model == nullptr) return;
    {
        const std::lock_guard<std::mutex> lock(model->core->busy);
        model->core->rt->paging.reset(); // stops mapping pages in, though sessions keep the weights
    }
    delete model;
}

colibri_status colibri_model_get_info(const colibri_model* model, colibri_model_info* info) {
    if (model == nullptr || info == nullptr)
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "model and info must not be NULL");
    return guarded([&] {
        const colibri::runtime& rt = *model->core->rt;
        const auto& hp = rt.mdl->hp();
        info->architecture = colibri::format::arch_name(static_cast<colibri::format::arch>(hp.arch)).data();
        info->quant = model->quant.c_str();
        info->backend = rt.device.c_str();
        info->n_threads = rt.be->n_threads();
        info->n_layer = static_cast<int>(hp.n_layer);
        info->n_embd = static_cast<int>(hp.n_embd);
        info->n_head = static_cast<int>(hp.n_head);
        info->n_head_kv = static_cast<int>(hp.n_head_kv);
        info->head_dim = static_cast<int>(hp.head_dim);
        info->n_expert = static_cast<int>(hp.n_expert);
        info->n_expert_used = static_cast<int>(hp.n_expert_used);
        info->n_vocab = static_cast<int>(hp.n_vocab);
        info->n_ctx = static_cast<int>(hp.n_ctx);
        info->bos_id = rt.tok->bos_id();
        info->eos_id = rt.tok->eos_id();
        info->n_params = rt.mdl->n_params();
        info->n_params_active = rt.mdl->n_params_active();
        info->file_size = rt.mdl->file().file_size();
        info->fim = colibri::fim_kind_name(colibri::detect_fim(*rt.tok).kind).data();
        info->fim_spm = rt.tok->fim_suffix_first() ? 1 : 0;
        return COLIBRI_OK;
    });
}

colibri_status colibri_model_expert_cache(const colibri_model* model, colibri_expert_cache_stats* stats) {
    if (model == nullptr || stats == nullptr)
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "model and stats must not be NULL");
    return guarded([&] {
        const std::lock_guard<std::mutex> lock(model->core->busy);
        const colibri::expert_cache_stats s = model->core->rt->be->expert_cache_usage();
        stats->slots_per_layer = s.slots_per_layer;
        stats->hits = s.hits;
        stats->misses = s.misses;
        stats->bytes_copied = s.bytes_copied;
        return COLIBRI_OK;
    });
}

void colibri_session_params_init(colibri_session_params* params) {
    if (params != nullptr) {
        params->n_ctx = 0;
        params->n_batch = 0;
    }
}

colibri_status colibri_session_create(colibri_model* model, const colibri_session_params* params,
                                      colibri_session** out) {
    if (out != nullptr) *out = nullptr;
    if (model == nullptr || out == nullptr) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "model and out must not be NULL");
    return guarded([&] {
        const int n_ctx = params != nullptr ? params->n_ctx : 0;
        const int n_batch =
            params != nullptr && params->n_batch != 0 ? params->n_batch : colibri::session::default_batch;
        if (n_ctx < 0) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "n_ctx must be >= 0");
        if (n_batch < 0 || n_batch > 4096) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "n_batch must be 0..4096");
        auto s = std::make_unique<colibri_session>();
        s->core = model->core;
        const colibri::runtime& rt = *model->core->rt;
        const std::lock_guard<std::mutex> lock(model->core->busy);
        s->s = std::make_unique<colibri::session>(*rt.mdl, *rt.be, n_ctx, n_batch);
        s->smp = std::make_unique<colibri::sampler>(static_cast<int>(rt.mdl->hp().n_vocab));
        *out = s.release();
        return COLIBRI_OK;
    });
}

void colibri_session_free(colibri_session* session) {
    if (session == nullptr) return;
    const std::shared_ptr<model_core> core = session->core; // outlives the lock
    const std::lock_guard<std::mutex> lock(core->busy);
    delete session;
}

void colibri_generate_params_init(colibri_generate_params* p) {
    if (p == nullptr) return;
    const colibri::sampling_params d;
    p->max_tokens = 128;
    p->temperature = d.temperature;
    p->top_k = d.top_k;
    p->top_p = d.top_p;
    p->min_p = d.min_p;
    p->repeat_penalty = d.repeat_penalty;
    p->repeat_last_n = d.repeat_last_n;
    p->seed = 0;
    p->stop = nullptr;
    p->n_stop = 0;
    p->add_bos = -1;
    p->suffix = nullptr;
    p->suffix_len = 0;
    p->fim = nullptr;
    p->cancel = nullptr;
    p->cancel_user = nullptr;
    p->max_lines = 0;
    p->stop_on_dedent = 0;
    p->fim_spm = -1;
    p->context = nullptr;
    p->n_context = 0;
    p->min_indent = 0;
    p->parse_special = 0;
    p->speculative = 1;
}

namespace {

// The engine request for C parameters (strings are views into the caller's memory).
colibri_status to_request(const colibri_generate_params* params, const char* prompt, size_t prompt_len,
                          colibri::generate_request& req, std::vector<colibri::context_file>& context) {
    colibri_generate_params p;
    colibri_generate_params_init(&p);
    if (params != nullptr) p = *params;
    req.prompt = std::string_view(prompt != nullptr ? prompt : "", prompt_len);
    req.max_tokens = p.max_tokens;
    req.sampling.temperature = p.temperature;
    req.sampling.top_k = p.top_k;
    req.sampling.top_p = p.top_p;
    req.sampling.min_p = p.min_p;
    req.sampling.repeat_penalty = p.repeat_penalty;
    req.sampling.repeat_last_n = p.repeat_last_n;
    req.sampling.seed = p.seed;
    req.add_bos = p.add_bos;
    if (p.max_lines < 0) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "max_lines must be >= 0");
    req.max_lines = p.max_lines;
    req.stop_on_dedent = p.stop_on_dedent != 0;
    if (p.min_indent < 0) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "min_indent must be >= 0");
    req.min_indent = p.min_indent;
    req.speculative = p.speculative != 0;
    req.specials = p.parse_special != 0 ? colibri::special_tokens::parsed : colibri::special_tokens::as_text;
    if (p.fim_spm >= 0) req.order = p.fim_spm != 0 ? colibri::fim_order::spm : colibri::fim_order::psm;
    if (p.suffix != nullptr) req.suffix = std::string_view(p.suffix, p.suffix_len);
    if (p.fim != nullptr && std::string_view(p.fim) != "auto") {
        colibri::fim_kind k;
        if (!colibri::parse_fim_kind(p.fim, k)) {
            const std::string msg = std::string("unknown fim template '") + p.fim +
                                    "' (auto, starcoder, qwen, deepseek, codellama, codestral, none)";
            return fail(COLIBRI_ERR_INVALID_ARGUMENT, msg.c_str());
        }
        req.fim = k;
    }
    if (p.cancel != nullptr) {
        auto cancel = p.cancel;
        void* user = p.cancel_user;
        req.cancelled = [cancel, user] { return cancel(user) != 0; };
    }
    if (p.n_context > 0 && p.context == nullptr)
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "context is NULL but n_context > 0");
    for (size_t i = 0; i < p.n_context; ++i) {
        const colibri_context_file& f = p.context[i];
        if ((f.name == nullptr && f.name_len != 0) || (f.text == nullptr && f.text_len != 0))
            return fail(COLIBRI_ERR_INVALID_ARGUMENT, "a context file's name or text is NULL with a length");
        context.push_back({std::string_view(f.name != nullptr ? f.name : "", f.name_len),
                           std::string_view(f.text != nullptr ? f.text : "", f.text_len)});
    }
    req.context = context;
    if (p.n_stop > 0 && p.stop == nullptr) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "stop is NULL but n_stop > 0");
    for (size_t i = 0; i < p.n_stop; ++i) {
        if (p.stop[i] == nullptr) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "a stop string is NULL");
        req.stop.emplace_back(p.stop[i]);
    }
    return COLIBRI_OK;
}

} // namespace

colibri_status colibri_generate(colibri_session* session, const char* prompt, size_t prompt_len,
                                const colibri_generate_params* params, colibri_piece_callback callback, void* user,
                                colibri_generate_result* result) {
    if (session == nullptr || (prompt == nullptr && prompt_len != 0)) {
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "session and prompt must not be NULL");
    }
    return guarded([&] {
        colibri::generate_request req;
        std::vector<colibri::context_file> context;
        if (colibri_status st = to_request(params, prompt, prompt_len, req, context); st != COLIBRI_OK) return st;
        const colibri::runtime& rt = *session->core->rt;
        const std::lock_guard<std::mutex> lock(session->core->busy);
        req.drafts = &session->drafts;
        const colibri::generate_result r =
            colibri::generate(*session->s, *rt.tok, *session->smp, req, [&](std::string_view piece) {
                return callback == nullptr || callback(user, piece.data(), piece.size()) == 0;
            });
        if (result != nullptr) {
            result->finish_reason = static_cast<colibri_finish_reason>(r.reason);
            result->n_prompt_tokens = r.n_prompt_tokens;
            result->n_cached_tokens = r.n_cached_tokens;
            result->fim = colibri::fim_kind_name(r.fim).data();
            result->n_generated_tokens = r.n_generated_tokens;
            result->n_drafted_tokens = r.n_drafted_tokens;
            result->n_accepted_tokens = r.n_accepted_tokens;
            result->prompt_ms = r.prompt_ms;
            result->generate_ms = r.generate_ms;
        }
        return COLIBRI_OK;
    });
}

colibri_status colibri_prompt_match(const colibri_model* model, colibri_session* const* sessions, size_t n_sessions,
                                    const char* prompt, size_t prompt_len, const colibri_generate_params* params,
                                    size_t* n_reusable, size_t* n_prompt_tokens) {
    if (model == nullptr || (prompt == nullptr && prompt_len != 0) ||
        (n_sessions > 0 && (sessions == nullptr || n_reusable == nullptr))) {
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "model, prompt, sessions and n_reusable must not be NULL");
    }
    for (size_t i = 0; i < n_sessions; ++i) {
        if (sessions[i] == nullptr || sessions[i]->core != model->core) {
            return fail(COLIBRI_ERR_INVALID_ARGUMENT, "every session must be a session of this model");
        }
    }
    return guarded([&] {
        colibri::generate_request req;
        std::vector<colibri::context_file> context;
        if (colibri_status st = to_request(params, prompt, prompt_len, req, context); st != COLIBRI_OK) return st;
        const colibri::runtime& rt = *model->core->rt;
        const std::lock_guard<std::mutex> lock(model->core->busy);
        // as generate tokenizes for each session's context size (context files are cut to
        // fit it); without sessions, a new session's
        std::map<int, std::vector<int32_t>> tokens;
        const auto tokens_for = [&](int n_ctx) -> const std::vector<int32_t>& {
            auto it = tokens.find(n_ctx);
            if (it == tokens.end()) it = tokens.emplace(n_ctx, colibri::prompt_tokens(*rt.tok, req, n_ctx)).first;
            return it->second;
        };
        for (size_t i = 0; i < n_sessions; ++i)
            n_reusable[i] = colibri::reusable_prefix(sessions[i]->s->history(), tokens_for(sessions[i]->s->n_ctx()));
        if (n_prompt_tokens != nullptr) {
            const int n_ctx = n_sessions > 0 ? sessions[0]->s->n_ctx() : colibri::session::context_length(*rt.mdl, 0);
            *n_prompt_tokens = tokens_for(n_ctx).size();
        }
        return COLIBRI_OK;
    });
}

colibri_status colibri_fim_text_of(const char* family, colibri_fim_text* text) {
    return guarded([&] {
        colibri::fim_kind kind;
        colibri::fim_spellings s;
        if (family == nullptr || text == nullptr || !colibri::parse_fim_kind(family, kind) ||
            !colibri::fim_spellings_of(kind, s)) {
            const std::string msg = std::string("unknown fill-in-the-middle family '") + (family ? family : "") +
                                    "' (starcoder, qwen, deepseek, codellama, codestral)";
            return fail(COLIBRI_ERR_INVALID_ARGUMENT, msg.c_str());
        }
        // string literals, so null-terminated
        auto c_str = [](std::string_view v) { return v.empty() ? "" : v.data(); };
        *text = {c_str(s.prefix), c_str(s.suffix), c_str(s.middle), c_str(s.repo_name), c_str(s.file_sep)};
        return COLIBRI_OK;
    });
}

colibri_status colibri_fim_family_of_tokenizer(const char* path, const char** family) {
    if (path == nullptr || family == nullptr)
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "path and family must not be NULL");
    return guarded([&] {
        *family = colibri::fim_kind_name(colibri::detect_fim(*colibri::load_tokenizer_file(path)).kind).data();
        return COLIBRI_OK;
    });
}

colibri_status colibri_session_reset(colibri_session* session) {
    if (session == nullptr) return fail(COLIBRI_ERR_INVALID_ARGUMENT, "session must not be NULL");
    return guarded([&] {
        const std::lock_guard<std::mutex> lock(session->core->busy);
        session->s->truncate(0);
        return COLIBRI_OK;
    });
}

int colibri_session_n_cached(const colibri_session* session) { return session == nullptr ? 0 : session->s->n_past(); }

int colibri_session_n_batch(const colibri_session* session) { return session == nullptr ? 0 : session->s->n_batch(); }

int colibri_session_n_ctx(const colibri_session* session) { return session == nullptr ? 0 : session->s->n_ctx(); }

size_t colibri_session_token_bytes(const colibri_session* session) {
    return session == nullptr ? 0 : session->s->token_bytes();
}

size_t colibri_session_memory(const colibri_session* session) {
    return session == nullptr ? 0 : session->s->memory_bytes();
}

colibri_status colibri_tokenize(const colibri_model* model, const char* text, size_t len, int32_t* ids, size_t capacity,
                                size_t* n_ids) {
    if (model == nullptr || (text == nullptr && len != 0) || (ids == nullptr && capacity != 0)) {
        return fail(COLIBRI_ERR_INVALID_ARGUMENT, "model, text and ids must not be NULL");
    }
    return guarded([&] {
        std::vector<int32_t> v;
        model->core->rt->tok->encode(std::string_view(text != nullptr ? text : "", len), v);
        std::copy_n(v.begin(), std::min(v.size(), capacity), ids);
        if (n_ids != nullptr) *n_ids = v.size();
        return COLIBRI_OK;
    });
}

} // extern "C"
