#pragma once
// Prompt in, streamed completion text out: tokenise, prefill in batches, sample, detokenise,
// stop on EOS, stop strings, max tokens or a full context.

#include "generate/draft.h"
#include "generate/fim.h"
#include "model/session.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {

enum class finish_reason { length, eos, stop, cancelled, context };
std::string_view finish_reason_name(finish_reason r);

struct generate_request {
    std::string_view prompt; ///< with a suffix: the text before the cursor
    /// Text after the cursor: fill-in-the-middle with the model's FIM tokens. A model
    /// without them completes the prompt alone (generate_result::fim says which).
    std::optional<std::string_view> suffix;
    /// FIM template: nullopt detects it from the vocabulary; a kind forces it.
    std::optional<fim_kind> fim;
    /// Where the suffix goes in a FIM prompt; nullopt: the order the model was trained
    /// with (tokenizer::fim_suffix_first).
    std::optional<fim_order> order;
    /// Other files' text placed before the prompt (build_context_prompt); only as much of
    /// its end as leaves the prompt and max_tokens room in the context.
    std::span<const context_file> context;
    int max_tokens = 128;
    sampling_params sampling;
    std::vector<std::string> stop; ///< generation ends before the first match; never emitted
    int add_bos = -1;              ///< -1: the model's default
    /// Text that spells a special token stays text unless parsed is asked for: only BOS and
    /// the FIM framing are control tokens, so a file holding `<|endoftext|>` cannot end or
    /// steer its completion.
    special_tokens specials = special_tokens::as_text;
    /// Completion text ends before the newline that would start line max_lines + 1 (the
    /// first line is the rest of the cursor's line); 0: no limit.
    int max_lines = 0;
    /// Completion text ends before a line indented less than the prompt's last line (the
    /// cursor's line); blank lines never end it. Whitespace characters count one column each.
    bool stop_on_dedent = false;
    /// Completion text ends before a line indented by fewer whitespace characters than this
    /// (llama-server's n_indent); 0: no limit. With stop_on_dedent the larger bound holds.
    int min_indent = 0;
    /// Polled between prompt batches and tokens, and between the layers of each; true ends
    /// generation (cancelled).
    std::function<bool()> cancelled;
    /// Speculative decoding with drafts from the context (generate_result counts them): the
    /// same tokens as without, fewer steps where the completion repeats its context.
    bool speculative = true;
    /// What passes of each size took and how many drafts were kept, kept across requests
    /// (a session's: the next keystroke's request starts where the last one left off);
    /// null: this request's own.
    draft_policy* drafts = nullptr;
};

struct generate_result {
    finish_reason reason = finish_reason::length;
    int n_prompt_tokens = 0;
    int n_cached_tokens = 0; ///< prompt tokens whose cache entries were reused, not recomputed
    int n_generated_tokens = 0;
    int n_drafted_tokens = 0;      ///< drafted tokens verified
    int n_accepted_tokens = 0;     ///< of those, the ones kept
    fim_kind fim = fim_kind::none; ///< the template used (none: plain completion)
    double prompt_ms = 0;          ///< tokenisation + prefill, up to the first token's logits
    double generate_ms = 0;        ///< the rest
};

/// The prompt's token ids as generate() builds them (BOS, context files, FIM framing) for a
/// context of n_ctx tokens; sets *fim to the template used when fim is not null. Throws
/// colibri::error for a bad request.
std::vector<int32_t> prompt_tokens(const tokenizer& tok, const generate_request& req, int n_ctx,
                                   fim_template* fim = nullptr);

/// How many leading tokens of `tokens` a session with this history can reuse: the common
/// prefix, less one when it covers every token (the last one is recomputed for its logits).
size_t reusable_prefix(std::span<const int32_t> history, std::span<const int32_t> tokens);

/// Receives each piece of text; return false to stop (finish reason: cancelled).
using piece_callback = std::function<bool(std::string_view piece)>;

/// Runs one completion on `s`. The cache entries of the longest common token prefix of the
/// prompt and the session's history are reused (at least the last prompt token is
/// recomputed, for its logits); tokens are compared, so a prompt whose end tokenises
/// differently reuses only what is still valid. Throws colibri::error for a bad request
/// (invalid parameters, a prompt that does not fit the context).
generate_result generate(session& s, const tokenizer& tok, sampler& smp, const generate_request& req,
                         const piece_callback& on_piece);

/// Holds back completion text that could be the start of a stop string.
class stop_matcher {
public:
    explicit stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
    /// Adds text; returns what can be emitted now. Sets matched() when a stop string occurred
    /// (then the returned text ends right before it and further text is ignored).
    std::string push(std::string_view text);
    /// Text still held back (no stop string matched).
    std::string flush();
    bool matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool matched_ = false;
};

/// Ends completion text at line boundaries: before the newline that would start line
/// max_lines + 1 (0: no limit), or before a line whose indentation is below min_indent
/// columns (-1: off). After a newline, whitespace is held back until the line's first
/// visible character decides whether it is emitted.
class line_limiter {
public:
    line_limiter(int max_lines, int min_indent) : max_lines_(max_lines), min_indent_(min_indent) {}
    /// Adds text; returns what can be emitted now. Sets matched() when a limit was reached
    /// (the returned text then ends before the newline, and further text is ignored).
    std::string push(std::string_view text);
    /// Text still held back (no limit reached): trailing newlines and indentation.
    std::string flush();
    bool matched() const { return matched_; }

private:
    int max_lines_;
    int min_indent_;
    int newlines_ = 0;
    int indent_ = 0;
    bool in_indent_ = false; ///< inside the leading whitespace of a line after a newline
    std::string held_;
    bool matched_ = false;
};

/// Columns of leading whitespace on the last line of `text` (each space or tab counts one).
int last_line_indent(std::string_view text);

} // namespace colibri
