#pragma once
// colibri-bench --speculative: a copy-heavy completion with and without drafts from the
// context, the same request, the engines' real generation path.

#include <string>

namespace colibri {

/// Completion of gen_tokens after the prompt in `prompt_file` (greedy, or sampled at
/// `temperature` with seed 1, 2 ... in turn), plainly and with speculative decoding,
/// alternating, reps times each: medians of decode tok/s, the drafts kept, and whether each
/// repetition's two texts are identical (they must be). The figures as one JSON object: on
/// standard output with `json` (else text), appended to `json_file` when it is given.
/// Returns the exit status.
int run_speculative(const std::string& model_path, const std::string& prompt_file, int threads, int gen_tokens,
                    int reps, float temperature, bool json, const std::string& json_file);

} // namespace colibri
