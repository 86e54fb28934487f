/* The C API from C: load, inspect, generate with a callback, and clear errors. */

#include "colibri.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define EXPECT(cond)                                                                                                   \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond);                             \
            ++failures;                                                                                                \
        }                                                                                                              \
    } while (0)

struct collected {
    char text[4096];
    size_t len;
    int calls;
};

static int on_piece(void* user, const char* piece, size_t len) {
    struct collected* c = (struct collected*)user;
    if (c->len + len < sizeof(c->text)) {
        memcpy(c->text + c->len, piece, len);
        c->len += len;
    }
    c->calls++;
    return 0;
}

static int cancel_now(void* user) {
    ++*(int*)user;
    return 1;
}

static int stop_after_two(void* user, const char* piece, size_t len) {
    (void)piece;
    (void)len;
    return ++*(int*)user >= 2;
}

/* Stops on the piece numbered *user (counting from 1). */
struct stop_at {
    int at, calls;
};
static int stop_at_piece(void* user, const char* piece, size_t len) {
    (void)piece;
    (void)len;
    struct stop_at* s = (struct stop_at*)user;
    return ++s->calls >= s->at;
}

/* A thread's greedy completions on its own session of a shared model. */
struct worker {
    colibri_session* session;
    struct collected text[3];
    colibri_status status[3];
};
static void* run_worker(void* arg) {
    struct worker* w = (struct worker*)arg;
    colibri_generate_params gp;
    colibri_generate_params_init(&gp);
    gp.max_tokens = 12;
    gp.temperature = 0.0f;
    for (int i = 0; i < 3; ++i) {
        colibri_session_reset(w->session);
        w->status[i] = colibri_generate(w->session, "def f(x):", 9, &gp, on_piece, &w->text[i], NULL);
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_c_api MODEL\n");
        return 2;
    }
    colibri_model* model = NULL;

    /* a missing file: an I/O error naming it, no model */
    EXPECT(colibri_model_load("/nonexistent/m.colibri", NULL, &model) == COLIBRI_ERR_IO);
    EXPECT(model == NULL);
    EXPECT(strstr(colibri_last_error(), "/nonexistent/m.colibri") != NULL);
    EXPECT(strcmp(colibri_status_name(COLIBRI_ERR_FORMAT), "format") == 0);

    /* fill-in-the-middle families' spellings, for prompts built as text */
    colibri_fim_text fim;
    EXPECT(colibri_fim_text_of("qwen", &fim) == COLIBRI_OK);
    EXPECT(strcmp(fim.prefix, "<|fim_prefix|>") == 0 && strcmp(fim.middle, "<|fim_middle|>") == 0);
    EXPECT(strcmp(fim.repo_name, "<|repo_name|>") == 0 && strcmp(fim.file_sep, "<|file_sep|>") == 0);
    EXPECT(colibri_fim_text_of("codestral", &fim) == COLIBRI_OK);
    EXPECT(strcmp(fim.suffix, "[SUFFIX]") == 0 && fim.middle[0] == '\0' && fim.repo_name[0] == '\0');
    EXPECT(colibri_fim_text_of("gpt", &fim) == COLIBRI_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(colibri_last_error(), "gpt") != NULL);

    /* the FIM family of a tokenizer file: the test model's vocabulary has none */
    const char* family = NULL;
    EXPECT(colibri_fim_family_of_tokenizer(argv[1], &family) == COLIBRI_OK && strcmp(family, "none") == 0);
    EXPECT(colibri_fim_family_of_tokenizer("/nonexistent/tokenizer.json", &family) == COLIBRI_ERR_IO);
    EXPECT(strstr(colibri_last_error(), "/nonexistent/tokenizer.json") != NULL);
    EXPECT(colibri_fim_family_of_tokenizer(NULL, &family) == COLIBRI_ERR_INVALID_ARGUMENT);
    EXPECT(colibri_fim_family_of_tokenizer(__FILE__, &family) == COLIBRI_ERR_FORMAT);
    EXPECT(strstr(colibri_last_error(), "neither a GGUF file") != NULL);
    EXPECT(colibri_fim_family_of_tokenizer("/", &family) == COLIBRI_ERR_IO);
    EXPECT(strstr(colibri_last_error(), "is a directory") != NULL);
    EXPECT(colibri_fim_text_of("qwen", &fim) == COLIBRI_OK && colibri_last_error()[0] == '\0'); /* cleared */

    /* an unknown device */
    colibri_model_params mp;
    colibri_model_params_init(&mp);
    EXPECT(mp.gpu_memory_mib == 0);
    EXPECT(mp.page_in == 0);
    mp.device = "tpu:0";
    EXPECT(colibri_model_load(argv[1], &mp, &model) == COLIBRI_ERR_INVALID_ARGUMENT);
    mp.device = "cpu";
    mp.gpu_memory_mib = -1;
    EXPECT(colibri_model_load(argv[1], &mp, &model) == COLIBRI_ERR_INVALID_ARGUMENT);
    mp.gpu_memory_mib = 0;
    EXPECT(strcmp(colibri_status_name(COLIBRI_ERR_DEVICE), "device") == 0);

    mp.device = "cpu";
    mp.n_threads = 2;
    mp.page_in = 1; /* the pages mapped in while this test runs the model */
    EXPECT(colibri_model_load(argv[1], &mp, &model) == COLIBRI_OK);
    if (model == NULL) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], colibri_last_error());
        return 1;
    }
    colibri_model_info info;
    EXPECT(colibri_model_get_info(model, &info) == COLIBRI_OK);
    EXPECT(strcmp(info.architecture, "llama") == 0);
    EXPECT(strcmp(info.backend, "cpu") == 0);
    EXPECT(info.n_threads == 2);
    EXPECT(info.n_layer == 2);
    EXPECT(info.bos_id == 1 && info.eos_id == 2);
    colibri_expert_cache_stats ec;
    memset(&ec, 0xff, sizeof ec);
    EXPECT(colibri_model_expert_cache(model, &ec) == COLIBRI_OK); /* no GPU budget: all zero */
    EXPECT(ec.slots_per_layer == 0 && ec.hits == 0 && ec.misses == 0 && ec.bytes_copied == 0);
    EXPECT(colibri_model_expert_cache(model, NULL) == COLIBRI_ERR_INVALID_ARGUMENT);

    int32_t ids[64];
    size_t n_ids = 0;
    EXPECT(colibri_tokenize(model, "def f(x):", 9, ids, 64, &n_ids) == COLIBRI_OK);
    EXPECT(n_ids > 0 && n_ids < 10);

    colibri_session* session = NULL;
    EXPECT(colibri_session_create(model, NULL, &session) == COLIBRI_OK);

    colibri_generate_params gp;
    colibri_generate_params_init(&gp);
    gp.max_tokens = 12;
    gp.temperature = 0.0f;
    struct collected a = {{0}, 0, 0}, b = {{0}, 0, 0};
    colibri_generate_result res;
    EXPECT(colibri_generate(session, "def f(x):", 9, &gp, on_piece, &a, &res) == COLIBRI_OK);
    EXPECT(res.n_generated_tokens == 12 || res.finish_reason == COLIBRI_FINISH_EOS);
    EXPECT(res.n_prompt_tokens == (int)n_ids + 1); /* with BOS */
    EXPECT(a.calls > 0);
    /* greedy twice: the same text */
    EXPECT(colibri_generate(session, "def f(x):", 9, &gp, on_piece, &b, &res) == COLIBRI_OK);
    EXPECT(a.len == b.len && memcmp(a.text, b.text, a.len) == 0);

    /* the cache is reused: all prompt tokens but the last are cached after a call */
    size_t cached = 0, n_prompt = 0;
    EXPECT(colibri_prompt_match(model, &session, 1, "def f(x):", 9, &gp, &cached, &n_prompt) == COLIBRI_OK);
    EXPECT(cached == n_ids);
    EXPECT(n_prompt == n_ids + 1);
    EXPECT(colibri_session_n_cached(session) >= (int)n_ids + 1);
    EXPECT(colibri_session_token_bytes(session) > 0);
    EXPECT(colibri_generate(session, "def f(x):", 9, &gp, NULL, NULL, &res) == COLIBRI_OK);
    EXPECT(res.n_cached_tokens == (int)n_ids);
    EXPECT(strcmp(res.fim, "none") == 0);
    EXPECT(colibri_session_memory(session) > 0);
    EXPECT(colibri_session_reset(session) == COLIBRI_OK);
    EXPECT(colibri_session_n_cached(session) == 0);
    EXPECT(colibri_prompt_match(model, &session, 1, "def f(x):", 9, &gp, &cached, NULL) == COLIBRI_OK);
    EXPECT(cached == 0);
    EXPECT(colibri_prompt_match(model, NULL, 0, "def f(x):", 9, &gp, NULL, &n_prompt) == COLIBRI_OK);
    EXPECT(n_prompt == n_ids + 1);
    gp.fim = "bogus";
    EXPECT(colibri_prompt_match(model, &session, 1, "x", 1, &gp, &cached, NULL) == COLIBRI_ERR_INVALID_ARGUMENT);
    gp.fim = NULL;
    EXPECT(strcmp(info.fim, "none") == 0);

    /* the callback stops generation */
    int calls = 0;
    gp.max_tokens = 50;
    EXPECT(colibri_generate(session, "x", 1, &gp, stop_after_two, &calls, &res) == COLIBRI_OK);
    EXPECT(res.finish_reason == COLIBRI_FINISH_CANCELLED);
    EXPECT(calls == 2);

    /* stopping on the last piece cancels too, when that piece is the text held back until the
       end: a stop string that starts with the completion's last character holds it back */
    {
        struct collected full = {{0}, 0, 0};
        gp.max_tokens = 12;
        EXPECT(colibri_generate(session, "def f(x):", 9, &gp, on_piece, &full, &res) == COLIBRI_OK);
        EXPECT(full.len > 0 && res.finish_reason == COLIBRI_FINISH_LENGTH);
        char stop[3] = {full.len > 0 ? full.text[full.len - 1] : 'x', '\x01', '\0'};
        const char* stops[1] = {stop};
        gp.stop = stops;
        gp.n_stop = 1;
        struct collected held = {{0}, 0, 0};
        EXPECT(colibri_generate(session, "def f(x):", 9, &gp, on_piece, &held, &res) == COLIBRI_OK);
        EXPECT(held.len == full.len && memcmp(held.text, full.text, full.len) == 0);
        EXPECT(res.finish_reason == COLIBRI_FINISH_LENGTH);
        struct stop_at last = {held.calls, 0};
        EXPECT(colibri_generate(session, "def f(x):", 9, &gp, stop_at_piece, &last, &res) == COLIBRI_OK);
        EXPECT(last.calls == held.calls);
        EXPECT(res.finish_reason == COLIBRI_FINISH_CANCELLED);
        gp.stop = NULL;
        gp.n_stop = 0;
        gp.max_tokens = 50;
    }

    /* cancelled before the prompt is processed: no text, finish reason CANCELLED */
    int polls = 0;
    struct collected none = {{0}, 0, 0};
    gp.cancel = cancel_now;
    gp.cancel_user = &polls;
    EXPECT(colibri_generate(session, "def g(y):", 9, &gp, on_piece, &none, &res) == COLIBRI_OK);
    EXPECT(res.finish_reason == COLIBRI_FINISH_CANCELLED);
    EXPECT(res.n_generated_tokens == 0);
    EXPECT(none.calls == 0);
    EXPECT(polls == 1);
    gp.cancel = NULL;

    /* bad parameters are refused, and the session stays usable */
    gp.top_p = 2.0f;
    EXPECT(colibri_generate(session, "x", 1, &gp, NULL, NULL, &res) == COLIBRI_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(colibri_last_error(), "top_p") != NULL);
    gp.top_p = 1.0f;
    gp.max_tokens = 2;
    EXPECT(colibri_generate(session, "x", 1, &gp, NULL, NULL, &res) == COLIBRI_OK);

    /* a prompt longer than the context */
    colibri_session* small = NULL;
    colibri_session_params sp;
    colibri_session_params_init(&sp);
    sp.n_ctx = 4;
    EXPECT(colibri_session_create(model, &sp, &small) == COLIBRI_OK);
    EXPECT(colibri_generate(small, "a long prompt that does not fit", 31, &gp, NULL, NULL, &res) ==
           COLIBRI_ERR_CONTEXT_FULL);

    /* the batch size: refused out of range; a prompt one token at a time gives the same text */
    sp.n_ctx = 0;
    colibri_session* single = NULL;
    sp.n_batch = -1;
    EXPECT(colibri_session_create(model, &sp, &single) == COLIBRI_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(colibri_last_error(), "n_batch") != NULL);
    sp.n_batch = 4097;
    EXPECT(colibri_session_create(model, &sp, &single) == COLIBRI_ERR_INVALID_ARGUMENT);
    EXPECT(single == NULL);
    sp.n_batch = 1;
    EXPECT(colibri_session_create(model, &sp, &single) == COLIBRI_OK);
    EXPECT(colibri_session_n_batch(single) == 1);
    EXPECT(colibri_session_n_batch(session) == 128); /* the default */
    EXPECT(colibri_session_n_batch(NULL) == 0);
    EXPECT(colibri_session_n_ctx(session) == info.n_ctx); /* the model's, under 4096 */
    EXPECT(colibri_session_n_ctx(small) == 4);
    EXPECT(colibri_session_n_ctx(NULL) == 0);
    struct collected c = {{0}, 0, 0};
    gp.max_tokens = 12;
    gp.cancel = NULL;
    EXPECT(colibri_generate(single, "def f(x):", 9, &gp, on_piece, &c, &res) == COLIBRI_OK);
    EXPECT(a.len > 0 && a.len == c.len && memcmp(a.text, c.text, a.len) == 0);
    colibri_session_free(single);

    /* two threads, a session each on the one model: each gets the text of a single thread */
    {
        struct worker w[2];
        memset(w, 0, sizeof w);
        EXPECT(colibri_session_create(model, NULL, &w[0].session) == COLIBRI_OK);
        EXPECT(colibri_session_create(model, NULL, &w[1].session) == COLIBRI_OK);
        pthread_t th[2];
        for (int i = 0; i < 2; ++i) EXPECT(pthread_create(&th[i], NULL, run_worker, &w[i]) == 0);
        for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; ++i) {
            for (int k = 0; k < 3; ++k) {
                EXPECT(w[i].status[k] == COLIBRI_OK);
                EXPECT(w[i].text[k].len == a.len && memcmp(w[i].text[k].text, a.text, a.len) == 0);
            }
            colibri_session_free(w[i].session);
        }
    }

    colibri_session_free(small);
    colibri_session_free(session);

    /* the model freed before its session: the session still works, then frees the weights */
    colibri_session* last = NULL;
    EXPECT(colibri_session_create(model, NULL, &last) == COLIBRI_OK);
    colibri_model_free(model);
    struct collected after = {{0}, 0, 0};
    gp.max_tokens = 12;
    EXPECT(colibri_generate(last, "def f(x):", 9, &gp, on_piece, &after, &res) == COLIBRI_OK);
    EXPECT(after.len == a.len && memcmp(after.text, a.text, a.len) == 0);
    colibri_session_free(last);
    colibri_model_free(NULL);
    colibri_session_free(NULL);
    if (failures == 0) printf("c api: all expectations met\n");
    return failures == 0 ? 0 : 1;
}
