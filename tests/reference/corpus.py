"""Embedded training corpus for the fixture tokenizer.

Hand-written text (English prose, Python and C code).  It is deliberately
ASCII-only so that every non-ASCII character in the tokenizer test cases goes
through sentencepiece's byte fallback.  Tabs are also absent on purpose.
Do not edit: the tokenizer (and therefore every fixture) depends on it.
"""

PROSE = """\
The engine reads a model from disk, maps its weights into memory and answers
requests one token at a time. Each request carries a prompt, a limit on the
number of new tokens and a few sampling settings. The scheduler groups the
requests that are ready into a batch, runs one step of the network and hands
every new token back to the client that asked for it.
A mixture of experts replaces the dense feed forward block with several
smaller blocks, called experts, and a router. For every token the router
scores all experts and keeps only the best few; their outputs are mixed with
the weights that the router gave them. Most of the parameters are therefore
idle for any given token, which is what makes such models cheap to run.
The attention block looks back over the tokens that came before. Keys and
values are kept in a cache so that each step only has to process the newest
token. With grouped query attention several query heads share one key head,
which makes the cache smaller without hurting quality very much.
Rotary position embeddings turn each pair of channels by an angle that grows
with the position of the token. The angle for channel pair i is the position
times theta to the power of minus two i over the head size.
It was a quiet morning in the harbour. The boats rocked slowly on the water,
the gulls were arguing over a fish, and the old man at the end of the pier
had been waiting since six for something to bite. He did not mind the wait.
"Patience," he said to nobody in particular, "is the only bait that never
runs out." Then he poured another cup of tea from his flask and smiled.
Numbers appear everywhere: 3 apples, 12 eggs, 2024 pages, 1000000 stars,
version 1.2.3, a ratio of 16:9, the year 1969 and the value 3.14159.
Questions? Answers! Lists; colons: dashes - and (parentheses) [brackets]
{braces} <angles> 'quotes' "double quotes" `ticks` @at #hash $dollar %pct
^caret &amp *star _under +plus =equals |pipe ~tilde /slash \\backslash.
"""

PYTHON = '''\
import math
import sys
from collections import defaultdict


def softmax(values):
    """Return the softmax of a list of floats."""
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


class Router:
    def __init__(self, n_experts, top_k=2):
        self.n_experts = n_experts
        self.top_k = top_k
        self.counts = defaultdict(int)

    def route(self, scores):
        probs = softmax(scores)
        order = sorted(range(self.n_experts), key=lambda i: -probs[i])
        chosen = order[: self.top_k]
        for i in chosen:
            self.counts[i] += 1
        total = sum(probs[i] for i in chosen)
        return [(i, probs[i] / total) for i in chosen]


def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    router = Router(8)
    print(router.route([0.1, 0.5, -1.0, 2.0, 0.0, 0.3, 1.5, -0.2]))
    print(fibonacci(30), file=sys.stderr)
    data = {"name": "colibri", "layers": 2, "ok": True, "ratio": 0.25}
    for key, value in sorted(data.items()):
        print(f"{key} = {value!r}")
'''

C_CODE = """\
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <math.h>

typedef struct {
    int n_rows;
    int n_cols;
    float *data;
} matrix_t;

static float dot(const float *a, const float *b, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        sum += a[i] * b[i];
    }
    return sum;
}

void matvec(const matrix_t *m, const float *x, float *y) {
    for (int r = 0; r < m->n_rows; r++) {
        y[r] = dot(m->data + (size_t)r * m->n_cols, x, m->n_cols);
    }
}

void rms_norm(float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * scale * w[i];
}

int main(int argc, char **argv) {
    uint32_t seed = 42u;
    if (argc > 1 && strcmp(argv[1], "--seed") == 0) {
        seed = (uint32_t)atoi(argv[2]);
    }
    printf("seed=%u\\n", seed);
    return 0;
}
"""

CORPUS = PROSE + "\n" + PYTHON + "\n" + C_CODE


def sentences():
    """The corpus as the list of training 'sentences' (one per non-empty line)."""
    return [line for line in CORPUS.split("\n") if line.strip()]
