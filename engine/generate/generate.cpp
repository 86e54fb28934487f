#include "generate/generate.h"

#include "core/error.h"
#include "generate/draft.h"

#include <algorithm>
#include <chrono>

namespace colibri {

std::string_view finish_reason_name(finish_reason r) {
    switch (r) {
    case finish_reason::length: return "length";
    case finish_reason::eos: return "eos";
    case finish_reason::stop: return "stop";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::context: return "context";
    }
    return "unknown";
}

std::string stop_matcher::push(std::string_view text) {
    if (matched_) return {};
    held_.append(text);
    // earliest complete match of any stop string
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) {
        if (s.empty()) continue;
        cut = std::min(cut, held_.find(s));
    }
    if (cut != std::string::npos) {
        matched_ = true;
        std::string out = held_.substr(0, cut);
        held_.clear();
        return out;
    }
    // keep the longest tail that is a prefix of some stop string
    size_t keep = 0;
    for (const std::string& s : stops_) {
        for (size_t len = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); len > keep; --len) {
            if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
                keep = len;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string stop_matcher::flush() {
    std::string out = matched_ ? std::string() : held_;
    held_.clear();
    return out;
}

std::string line_limiter::push(std::string_view text) {
    std::string out;
    if (matched_) return out;
    for (const char c : text) {
        if (c == '\n') {
            if (max_lines_ > 0 && newlines_ + 1 >= max_lines_) {
                matched_ = true;
                held_.clear();
                return out;
            }
            ++newlines_;
            if (min_indent_ < 0) {
                out += c;
            } else {
                held_ += c; // blank lines stay held until a visible character decides
                in_indent_ = true;
                indent_ = 0;
            }
        } else if (in_indent_ && (c == ' ' || c == '\t' || c == '\r')) {
            held_ += c;
            ++indent_;
        } else if (in_indent_) {
            if (indent_ < min_indent_) {
                matched_ = true;
                held_.clear();
                return out;
            }
            out += held_;
            out += c;
            held_.clear();
            in_indent_ = false;
        } else {
            out += c;
        }
    }
    return out;
}

std::string line_limiter::flush() {
    std::string out = matched_ ? std::string() : held_;
    held_.clear();
    return out;
}

int last_line_indent(std::string_view text) {
    const size_t nl = text.rfind('\n');
    const std::string_view line = nl == std::string_view::npos ? text : text.substr(nl + 1);
    int n = 0;
    while (static_cast<size_t>(n) < line.size() && (line[n] == ' ' || line[n] == '\t')) ++n;
    return n;
}

std::vector<int32_t> prompt_tokens(const tokenizer& tok, const generate_request& req, int n_ctx,
                                   fim_template* fim_out) {
    std::vector<int32_t> tokens;
    const bool bos = req.add_bos < 0 ? tok.add_bos() : req.add_bos != 0;
    if (bos && tok.bos_id() >= 0) tokens.push_back(tok.bos_id());
    const size_t head = tokens.size();
    fim_template fim;
    if (req.suffix) fim = req.fim ? fim_for(tok, *req.fim) : detect_fim(tok);
    if (fim.kind != fim_kind::none) {
        const fim_order order = req.order ? *req.order : tok.fim_suffix_first() ? fim_order::spm : fim_order::psm;
        // what a long file's prefix and suffix may take: the context less BOS and max_tokens
        const std::int64_t room = std::int64_t{n_ctx} - std::int64_t(tokens.size()) - std::max(0, req.max_tokens) - 1;
        build_fim_prompt(tok, fim, req.prompt, *req.suffix, order, tokens, req.specials, room);
    } else {
        tok.encode(req.prompt, tokens, req.specials);
    }
    if (!req.context.empty()) {
        // The newest context is last: keep the end of it that fits.
        std::vector<int32_t> context;
        build_context_prompt(tok, fim.kind != fim_kind::none ? fim : detect_fim(tok), req.context, context,
                             req.specials);
        const std::int64_t room = std::int64_t{n_ctx} - std::int64_t(tokens.size()) - std::max(0, req.max_tokens) - 1;
        const size_t take = static_cast<size_t>(std::clamp<std::int64_t>(room, 0, std::int64_t(context.size())));
        tokens.insert(tokens.begin() + static_cast<std::ptrdiff_t>(head),
                      context.end() - static_cast<std::ptrdiff_t>(take), context.end());
    }
    if (fim_out != nullptr) *fim_out = std::move(fim);
    return tokens;
}

size_t reusable_prefix(std::span<const int32_t> history, std::span<const int32_t> tokens) {
    size_t common = 0;
    while (common < history.size() && common + 1 < tokens.size() && history[common] == tokens[common]) ++common;
    return common;
}

generate_result generate(session& s, const tokenizer& tok, sampler& smp, const generate_request& req,
                         const piece_callback& on_piece) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    if (req.max_tokens < 0) throw error(errc::invalid_argument, "max_tokens must be >= 0");
    smp.set_params(req.sampling);

    generate_result res;
    fim_template fim;
    std::vector<int32_t> tokens = prompt_tokens(tok, req, s.n_ctx(), &fim);
    res.fim = fim.kind;
    // End-of-text tokens of the model's FIM family end generation, and so does a FIM token
    // itself (the model starting a new infilling frame), with or without a suffix.
    const fim_template family = fim.kind != fim_kind::none ? fim : detect_fim(tok);
    auto is_stop_token = [&](int32_t id) {
        return id == tok.eos_id() || std::find(family.stop.begin(), family.stop.end(), id) != family.stop.end() ||
               (family.kind != fim_kind::none && (id == family.prefix || id == family.suffix || id == family.middle));
    };
    if (tokens.empty()) throw error(errc::invalid_argument, "the prompt is empty and the model has no BOS token");
    if (static_cast<int>(tokens.size()) >= s.n_ctx()) {
        throw error(errc::context_full, "the prompt has " + std::to_string(tokens.size()) +
                                            " tokens; the context holds " + std::to_string(s.n_ctx()));
    }
    res.n_prompt_tokens = static_cast<int>(tokens.size());
    tokens.reserve(tokens.size() + static_cast<size_t>(req.max_tokens));

    // reuse the cached common prefix, prefill the rest in batches
    const size_t common = reusable_prefix(s.history(), tokens);
    // Drafts may also come from the cached text this prompt leaves behind (the last
    // completion, as the next keystroke asks again), with the few tokens before it that
    // lead into it
    std::vector<int32_t> context;
    if (req.speculative) {
        const auto h = s.history();
        const size_t from = common > size_t(ngram_drafter::max_n) ? common - size_t(ngram_drafter::max_n) : 0;
        if (common < h.size())
            context.assign(h.begin() + std::ptrdiff_t(from),
                           h.begin() + std::ptrdiff_t(std::min(h.size(), common + 1024)));
    }
    s.truncate(static_cast<int>(common));
    res.n_cached_tokens = static_cast<int>(common);
    auto cancelled = [&] { return req.cancelled && req.cancelled(); };
    // A completion's batch can be abandoned between its layers; a warm-up's (no tokens to
    // generate) is finished first: it exists to leave its prompt in the cache for the
    // request that follows, usually the very one that cancels it.
    const std::function<bool()> between_layers = req.max_tokens > 0 ? req.cancelled : std::function<bool()>();
    for (size_t i = common; i < tokens.size(); i += static_cast<size_t>(s.n_batch())) {
        const int n = static_cast<int>(std::min(tokens.size() - i, static_cast<size_t>(s.n_batch())));
        if (cancelled() || !s.eval(tokens.data() + i, n, between_layers)) {
            res.reason = finish_reason::cancelled;
            res.prompt_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
            return res;
        }
    }
    const auto t1 = clock::now();
    res.prompt_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

    text_stream stream(tok, false);
    stop_matcher stops(req.stop);
    const int indent =
        std::max(req.stop_on_dedent ? last_line_indent(req.prompt) : -1, req.min_indent > 0 ? req.min_indent : -1);
    line_limiter lines(req.max_lines, indent);
    auto emit = [&](const std::string& text) { return text.empty() || on_piece(text); };
    // One generated token through EOS, the text pipeline and the limits; false when it ends
    // generation (res.reason says why).
    auto take = [&](int32_t id) {
        if (is_stop_token(id)) {
            res.reason = finish_reason::eos;
            return false;
        }
        tokens.push_back(id);
        ++res.n_generated_tokens;
        if (!emit(lines.push(stops.push(stream.push(id))))) {
            res.reason = finish_reason::cancelled;
            return false;
        }
        if (stops.matched() || lines.matched()) {
            res.reason = finish_reason::stop;
            return false;
        }
        return true;
    };
    // Speculative decoding: the token just sampled goes into the next batch with the drafted
    // tokens after it; each row's logits are sampled in turn, as plain decoding would sample
    // them, and the drafts are kept while they are what was sampled. The first token sampled
    // otherwise ends the run and comes first in the next batch; the rejected drafts' cache
    // rows are dropped. The same samples in the same order: the same tokens as without drafts.
    // At most seven drafted tokens (draft_policy::max_k): eight tokens take one walk of the
    // weights, nine two. How many, the policy says from the passes' times and the drafts kept
    // (or, when it drafts none, from whether the drafter's guess came true): a small dense
    // model's passes turn compute-bound past four tokens, an MoE's long ones read little
    // more than its shorter ones (docs/performance-log.md).
    ngram_drafter drafter(&tok.numbers());
    draft_policy own_policy;
    draft_policy& policy = req.drafts != nullptr ? *req.drafts : own_policy;
    size_t in_context = 0; // tokens appended to the drafts' context so far
    const size_t vocab = s.get_model().hp().n_vocab;
    std::vector<int32_t> batch;
    res.reason = finish_reason::length;
    if (req.max_tokens > 0 && cancelled()) {
        res.reason = finish_reason::cancelled;
    } else if (req.max_tokens > 0) {
        int32_t id = smp.sample(s.logits(), tokens);
        while (take(id)) {
            if (res.n_generated_tokens == req.max_tokens) break;
            if (cancelled()) {
                res.reason = finish_reason::cancelled;
                break;
            }
            if (s.n_past() >= s.n_ctx()) {
                res.reason = finish_reason::context;
                break;
            }
            // drafts no further than the tokens still to generate and the context allow
            const int room = std::min({req.max_tokens - res.n_generated_tokens - 1, s.n_ctx() - s.n_past() - 1,
                                       s.n_batch() - 1, session::max_draft});
            const auto pass_start = clock::now(); // a pass's time: drafting, evaluating, sampling its rows
            const int want = req.speculative ? policy.length(room) : 0;
            batch.assign(1, id);
            int32_t shadow = -1; // with no drafts to verify, the drafter's guess is judged all the same
            if (req.speculative && room > 0) {
                context.insert(context.end(), tokens.begin() + std::ptrdiff_t(in_context), tokens.end());
                in_context = tokens.size();
                const std::vector<int32_t> d = drafter.draft(context, std::max(want, 1));
                if (want > 0) batch.insert(batch.end(), d.begin(), d.end());
                else if (!d.empty()) shadow = d[0];
            }
            const int n = static_cast<int>(batch.size());
            if (!s.eval(batch.data(), n, req.cancelled, n)) { // between its layers
                res.reason = finish_reason::cancelled;
                break;
            }
            res.n_drafted_tokens += n - 1;
            const int before = static_cast<int>(tokens.size()); // the cache: tokens, then the drafts
            int accepted = 0;
            bool go_on = true;
            id = smp.sample(s.logits(), tokens);
            while (accepted < n - 1 && id == batch[size_t(accepted) + 1]) {
                ++accepted; // its cache row holds: the text it ends, if it does, is as generated
                if (!(go_on = take(id)) || res.n_generated_tokens == req.max_tokens) break;
                id = smp.sample(s.logits() + size_t(accepted) * vocab, tokens);
            }
            res.n_accepted_tokens += accepted;
            if (n > 1) policy.judged(n - 1, accepted);
            else if (shadow >= 0) policy.judged(1, id == shadow ? 1 : 0);
            s.truncate(before + accepted); // the rejected drafts
            policy.timed(n, std::chrono::duration<double, std::milli>(clock::now() - pass_start).count());
            if (!go_on || res.n_generated_tokens == req.max_tokens) break;
        }
    }
    if (res.reason != finish_reason::cancelled && res.reason != finish_reason::stop) {
        std::string tail = lines.push(stops.push(stream.flush()));
        tail += lines.push(stops.flush());
        if (stops.matched() || lines.matched()) res.reason = finish_reason::stop;
        tail += lines.flush();
        if (!emit(tail)) res.reason = finish_reason::cancelled; // the caller stopped on the last piece
    }
    res.generate_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
    return res;
}

} // namespace colibri
