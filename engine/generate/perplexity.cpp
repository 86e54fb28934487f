#include "generate/perplexity.h"

#include "core/error.h"
#include "model/session.h"

#include <algorithm>
#include <cmath>

namespace colibri {

perplexity_result perplexity(const model& m, backend& be, const std::vector<int32_t>& tokens, int n_ctx,
                             const std::function<void(int, int)>& progress) {
    if (n_ctx < 4) throw error(errc::invalid_argument, "perplexity needs a context of at least 4 tokens");
    if (tokens.size() < 2) throw error(errc::invalid_argument, "perplexity needs a text of at least 2 tokens");
    const int n_vocab = static_cast<int>(m.hp().n_vocab);
    const int stride = n_ctx / 2;
    const int n_batch = std::min(n_ctx, 64);
    session s(m, be, n_ctx, n_batch, true);
    const int64_t n = static_cast<int64_t>(tokens.size());
    int n_windows = 1;
    while (int64_t(n_windows - 1) * stride + n_ctx < n) ++n_windows;

    perplexity_result r;
    double nll = 0;
    for (int w = 0; w < n_windows; ++w) {
        const int64_t begin = int64_t(w) * stride;
        const int len = static_cast<int>(std::min<int64_t>(n_ctx, n - begin));
        const int first_scored = w == 0 ? 0 : n_ctx - stride - 1; // predictions of the second half
        s.truncate(0);
        for (int i = 0; i < len; i += n_batch) {
            const int nb = std::min(n_batch, len - i);
            s.eval(tokens.data() + begin + i, nb);
            for (int t = 0; t < nb; ++t) {
                const int pos = i + t; // logits at pos predict token pos + 1
                if (pos < first_scored || pos + 1 >= len) continue;
                const float* l = s.logits() + int64_t(t) * n_vocab;
                const float mx = *std::max_element(l, l + n_vocab);
                double sum = 0;
                for (int v = 0; v < n_vocab; ++v) sum += std::exp(double(l[v]) - mx);
                nll += (std::log(sum) + mx) - l[tokens[size_t(begin + pos + 1)]];
                ++r.n_scored;
            }
        }
        if (progress) progress(w + 1, n_windows);
    }
    r.n_windows = n_windows;
    r.mean_nll = nll / double(std::max<int64_t>(r.n_scored, 1));
    r.perplexity = std::exp(r.mean_nll);
    return r;
}

} // namespace colibri
