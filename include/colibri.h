/* Colibri engine C API.
 *
 * Load a .colibri model, create sessions (each owns a KV cache and scratch buffers),
 * generate text with a per-token callback. Every function that can fail returns a
 * colibri_status; colibri_last_error() gives the message of the last failure on the
 * calling thread. No function throws or aborts on bad input.
 *
 * A model and its sessions may be freed in any order: the weights stay until the last of
 * them is freed. Calls on a model and its sessions may come from several threads; they run
 * one at a time (the model's buffers serve one call at a time).
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Stable status codes. */
typedef enum colibri_status {
    COLIBRI_OK = 0,
    COLIBRI_ERR_INVALID_ARGUMENT = 1, /**< a parameter is out of range or NULL */
    COLIBRI_ERR_IO = 2,               /**< file missing, unreadable, not a regular file */
    COLIBRI_ERR_FORMAT = 3,           /**< the model file is corrupt, truncated or inconsistent */
    COLIBRI_ERR_UNSUPPORTED = 4,      /**< valid but unsupported: newer version, device, dtype */
    COLIBRI_ERR_OUT_OF_MEMORY = 5,
    COLIBRI_ERR_CONTEXT_FULL = 6, /**< the prompt does not fit the context (a completion that fills it
                                       ends with COLIBRI_FINISH_CONTEXT) */
    COLIBRI_ERR_CANCELLED = 7,    /**< not returned: a stop or a cancel gives COLIBRI_OK with finish reason
                                       COLIBRI_FINISH_CANCELLED (the number is kept) */
    COLIBRI_ERR_INTERNAL = 8,
    COLIBRI_ERR_DEVICE = 9 /**< the device failed (a GPU error): the model and its sessions cannot be used again;
                              free them (a long-running process should restart) */
} colibri_status;

typedef struct colibri_model colibri_model;
typedef struct colibri_session colibri_session;

/** Message of the last failed call on this thread ("" when none; a function returning a
 *  colibri_status clears it when it succeeds). Valid until the next call. */
const char* colibri_last_error(void);

/** Name of a status code ("ok", "invalid_argument", ...). */
const char* colibri_status_name(colibri_status status);

typedef struct colibri_model_params {
    const char* device; /**< "cpu" (default when NULL) or "cuda:N" */
    int n_threads;      /**< 0: the CPUs this process may use */
    int gpu_memory_mib; /**< on a GPU: device memory for the weights, MiB (0: no limit); the routed experts
                             that do not fit are copied in when a token needs them */
    int page_in;        /**< 1: map the file's pages in on a background thread of the lowest priority
                             after loading, so that the first request does not pay for the page faults
                             (a server), unless the file is larger than the memory available; 0: pages
                             are mapped in as requests touch them */
} colibri_model_params;

/** Fills defaults: device "cpu", n_threads 0, gpu_memory_mib 0, page_in 0. */
void colibri_model_params_init(colibri_model_params* params);

/** Maps and validates the file. On failure *out is NULL. */
colibri_status colibri_model_load(const char* path, const colibri_model_params* params, colibri_model** out);
void colibri_model_free(colibri_model* model);

typedef struct colibri_model_info {
    const char* architecture; /**< e.g. "mixtral", "qwen3_moe", "llama" */
    const char* quant;        /**< weight type of the matrices: "f32", "q8_0", ... */
    const char* backend;      /**< "cpu" or "cuda:N" */
    int n_threads;
    int n_layer, n_embd, n_head, n_head_kv, head_dim;
    int n_expert, n_expert_used;
    int n_vocab, n_ctx;
    int32_t bos_id, eos_id;
    uint64_t n_params;        /**< all parameters */
    uint64_t n_params_active; /**< parameters touched per token */
    uint64_t file_size;
    const char* fim; /**< FIM template detected in the vocabulary, "none" when absent */
    int fim_spm;     /**< 1 when the model was trained with suffix-first FIM prompts, else 0 */
} colibri_model_info;

/** Strings in *info stay valid while the model lives. */
colibri_status colibri_model_get_info(const colibri_model* model, colibri_model_info* info);

/** What a GPU's expert cache did (gpu_memory_mib): all zero without one. */
typedef struct colibri_expert_cache_stats {
    int slots_per_layer; /**< experts each MoE layer keeps on the device; 0: every expert stays once used */
    uint64_t hits;       /**< experts a token needed that were on the device */
    uint64_t misses;     /**< experts copied in */
    uint64_t bytes_copied;
} colibri_expert_cache_stats;

colibri_status colibri_model_expert_cache(const colibri_model* model, colibri_expert_cache_stats* stats);

typedef struct colibri_session_params {
    int n_ctx; /**< 0: the model's context length, at most 4096 */
    int n_batch; /**< most prompt tokens evaluated at once, 1..4096 (0: 128); a prompt can be cancelled between a batch's layers */
} colibri_session_params;

void colibri_session_params_init(colibri_session_params* params);

/** A session holds its KV cache and every buffer the per-token path needs. */
colibri_status colibri_session_create(colibri_model* model, const colibri_session_params* params,
                                      colibri_session** out);
void colibri_session_free(colibri_session* session);

/** Another file given as context for a completion (an open buffer, a yanked snippet). */
typedef struct colibri_context_file {
    const char* name; /**< its path or name (NULL: none) */
    size_t name_len;
    const char* text;
    size_t text_len;
} colibri_context_file;

typedef struct colibri_generate_params {
    int max_tokens;          /**< tokens to generate at most (default 128) */
    float temperature;       /**< 0: greedy (default 0.8) */
    int top_k;               /**< 0: off (default 40) */
    float top_p;             /**< 1: off (default 0.95) */
    float min_p;             /**< 0: off (default 0.05) */
    float repeat_penalty;    /**< 1: off (default 1.0) */
    int repeat_last_n;       /**< window of the repetition penalty (default 64) */
    uint64_t seed;           /**< same seed, same tokens */
    const char* const* stop; /**< stop strings; generation ends before the match */
    size_t n_stop;
    int add_bos; /**< -1: the model's default, 0: no, 1: yes */
    /** Text after the cursor (NULL: none). With a suffix the prompt is the text before the
     *  cursor and the model fills in the middle with its FIM tokens; a model without them
     *  completes the prompt alone (see colibri_generate_result.fim). */
    const char* suffix;
    size_t suffix_len;
    /** FIM template: NULL or "auto" detects it from the vocabulary; "starcoder", "qwen",
     *  "deepseek", "codellama", "codestral" force one; "none" ignores the suffix. */
    const char* fim;
    /** Polled between prompt batches and tokens, and between the layers of each (NULL:
     *  never); nonzero cancels (finish reason CANCELLED), also while the prompt is still
     *  being processed. */
    int (*cancel)(void* cancel_user);
    void* cancel_user;
    /** Ends the completion before the newline that would start line max_lines + 1 (the
     *  first line is the rest of the cursor's line); 0: no limit (default). */
    int max_lines;
    /** Nonzero: ends the completion before a line indented less than the prompt's last
     *  line (the cursor's line); blank lines never end it (default 0). */
    int stop_on_dedent;
    /** FIM prompt order. 1: the suffix first ([prefix] [suffix] suffix [middle] prefix),
     *  so that text typed at the cursor only changes the prompt's end and the cached prompt
     *  stays valid up to the cursor; only for models trained with that order (StarCoder,
     *  CodeLlama, Colibri's default model). 0: prefix-suffix-middle. -1 (default): the
     *  order the model file records (colibri_model_info.fim_spm). */
    int fim_spm;
    /** Nonzero: text in the prompt or suffix that spells a special token (`<|endoftext|>`,
     *  `<fim_prefix>`) becomes that token. 0 (default): user text is always encoded as
     *  text, and only BOS and the FIM framing are control tokens. */
    int parse_special;
    /** Nonzero (default): speculative decoding with drafts from the context, which gives
     *  the tokens of plain decoding in fewer steps where the completion repeats its
     *  context; 0: one token per step. */
    int speculative;
    /** Other files' text placed before the prompt (NULL: none). Models with repository
     *  tokens (StarCoder, Qwen2.5-Coder) get it in their trained layout ([file_sep] name,
     *  text per file); others get each text after a "--- snippet ---" line. Only as much of
     *  its end as leaves room for the prompt and max_tokens is used. */
    const colibri_context_file* context;
    size_t n_context;
    /** Ends the completion before a line indented by fewer whitespace characters than this
     *  (blank lines never end it); 0: no limit (default). With stop_on_dedent the larger
     *  bound holds. */
    int min_indent;
} colibri_generate_params;

void colibri_generate_params_init(colibri_generate_params* params);

/** Why generation ended. */
typedef enum colibri_finish_reason {
    COLIBRI_FINISH_LENGTH = 0, /**< max_tokens reached */
    COLIBRI_FINISH_EOS = 1,    /**< end-of-sequence token */
    COLIBRI_FINISH_STOP = 2,   /**< a stop string matched */
    COLIBRI_FINISH_CANCELLED = 3,
    COLIBRI_FINISH_CONTEXT = 4 /**< the context is full */
} colibri_finish_reason;

typedef struct colibri_generate_result {
    colibri_finish_reason finish_reason;
    int n_prompt_tokens;
    int n_generated_tokens;
    double prompt_ms;      /**< prefill time */
    double generate_ms;    /**< decode time (after the first token) */
    int n_cached_tokens;   /**< prompt tokens reused from the session's cache */
    const char* fim;       /**< FIM template used ("none": plain completion); static string */
    int n_drafted_tokens;  /**< tokens drafted from the context and verified */
    int n_accepted_tokens; /**< of those, the ones kept */
} colibri_generate_result;

/**
 * Called for each piece of completion text. Pieces concatenate to exactly the completion
 * text and never split a UTF-8 character; stop strings are never emitted. Return nonzero
 * to stop (the call then returns COLIBRI_OK with finish reason CANCELLED).
 */
typedef int (*colibri_piece_callback)(void* user, const char* piece, size_t len);

/**
 * Tokenizes prompt, prefills, generates. The session keeps its cache between calls: the
 * longest common token prefix with the previous prompt (and its completion) is reused, so a
 * prompt that extends the last one pays only for its new tokens.
 */
colibri_status colibri_generate(colibri_session* session, const char* prompt, size_t prompt_len,
                                const colibri_generate_params* params, colibri_piece_callback callback, void* user,
                                colibri_generate_result* result);

/**
 * Tokenizes the prompt once, as colibri_generate would from these arguments (FIM framing
 * included), and tells for each of sessions[0..n_sessions) how many of its tokens that
 * session could reuse from its cache (n_reusable[i]), so that a caller with several
 * sessions can pick the one that saves the most work. *n_prompt_tokens (may be NULL) gets
 * the prompt's length in tokens. Every session must belong to `model`.
 */
colibri_status colibri_prompt_match(const colibri_model* model, colibri_session* const* sessions, size_t n_sessions,
                                    const char* prompt, size_t prompt_len, const colibri_generate_params* params,
                                    size_t* n_reusable, size_t* n_prompt_tokens);

/** The spellings of a fill-in-the-middle family's tokens, for a prompt built as text that a
 *  server tokenizes (parsing special tokens), as the remote backend sends it. */
typedef struct colibri_fim_text {
    const char* prefix;
    const char* suffix;
    const char* middle;    /**< "" for codestral, whose prompt is [SUFFIX] suffix [PREFIX] prefix */
    const char* repo_name; /**< repository-level tokens ("" when the family has none) */
    const char* file_sep;
} colibri_fim_text;

/** Fills *text for family ("starcoder", "qwen", "deepseek", "codellama", "codestral");
 *  static strings. COLIBRI_ERR_INVALID_ARGUMENT for another name. */
colibri_status colibri_fim_text_of(const char* family, colibri_fim_text* text);

/** The fill-in-the-middle family whose tokens the tokenizer in `path` has, as the engine
 *  detects it for a model: "starcoder", "qwen", "deepseek", "codellama", "codestral", or
 *  "none". `path` is a GGUF file, a Hugging Face tokenizer.json or a .colibri file;
 *  *family gets a static string. */
colibri_status colibri_fim_family_of_tokenizer(const char* path, const char** family);

/** Forgets the session's cached tokens and, on the CPU, gives their memory back (a GPU's
 *  cache keeps its memory for the session's life). */
colibri_status colibri_session_reset(colibri_session* session);

/** Tokens the session's KV cache holds (0 for NULL). */
int colibri_session_n_cached(const colibri_session* session);
/** Most prompt tokens the session evaluates at once (its n_batch); 0 for NULL. */
int colibri_session_n_batch(const colibri_session* session);
/** Tokens the session's context holds at most, prompt and completion (its n_ctx); 0 for NULL. */
int colibri_session_n_ctx(const colibri_session* session);

/** Bytes of KV cache one cached token takes: on the CPU the cache's memory grows with the
 *  tokens it holds, and shrinks when they are forgotten (0 for NULL). */
size_t colibri_session_token_bytes(const colibri_session* session);

/** Bytes of memory the session's buffers and KV cache take at most (0 for NULL). */
size_t colibri_session_memory(const colibri_session* session);

/** Tokenizes text into ids (no BOS); text that spells a special token stays text. Returns
 *  the number of ids; writes at most capacity. */
colibri_status colibri_tokenize(const colibri_model* model, const char* text, size_t len, int32_t* ids, size_t capacity,
                                size_t* n_ids);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_H */
