"""Perplexity by llama.cpp's method (llama-perplexity) for llama.cpp and Colibri on the same
GGUF file, the same text and the same token ids: the text tokenised by llama.cpp with BOS,
cut into chunks of n_ctx tokens whose first token is replaced by BOS, every chunk evaluated
from an empty cache, and the predictions of its second half scored. Colibri's logits come
from `colibri --tokens ... --dump-logits`, llama.cpp's from llama-cpp-python.

    perplexity.py MODEL.gguf MODEL.colibri TEXT [--ctx 512] [--chunks N] [--colibri build-cpu/bin/colibri]

Prints both perplexities, their ratio, and the chunks and tokens scored."""
import argparse, math, os, subprocess, tempfile

import numpy as np
from llama_cpp import Llama

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("model")
ap.add_argument("text")
ap.add_argument("--ctx", type=int, default=512)
ap.add_argument("--chunks", type=int, default=8)
ap.add_argument("--colibri", default="build-cpu/bin/colibri")
args = ap.parse_args()

llm = Llama(model_path=args.gguf, n_threads=2, n_threads_batch=2, n_ctx=args.ctx, n_batch=args.ctx,
            n_ubatch=args.ctx, logits_all=True, verbose=False)
with open(args.text, encoding="utf-8") as f:
    tokens = llm.tokenize(f.read().encode("utf-8"), add_bos=True, special=False)
n_chunks = min(args.chunks, len(tokens) // args.ctx)
assert n_chunks > 0, "the text is shorter than one chunk"
bos, first = llm.token_bos(), args.ctx // 2


def nll(logits, chunk):
    """Summed negative log-likelihood of chunk[j + 1] given row j, for j in [first, ctx - 1)."""
    rows = logits[first:args.ctx - 1].astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    logz = np.log(np.exp(rows).sum(axis=1))
    targets = np.array(chunk[first + 1:], dtype=np.int64)
    return float((logz - rows[np.arange(len(targets)), targets]).sum()), len(targets)


totals = {"llama.cpp": [0.0, 0], "colibri": [0.0, 0]}
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "logits.f32")
    for c in range(n_chunks):
        chunk = list(tokens[c * args.ctx:(c + 1) * args.ctx])
        chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        ref = np.array(llm.scores[:args.ctx], dtype=np.float32)
        subprocess.run([args.colibri, "--model", args.model, "--threads", "2", "--tokens", ",".join(map(str, chunk)),
                        "--dump-logits", out], check=True, stderr=subprocess.DEVNULL)
        ours = np.fromfile(out, dtype="<f4").reshape(args.ctx, -1)[:, :ref.shape[1]]
        for name, logits in (("llama.cpp", ref), ("colibri", ours)):
            s, n = nll(logits, chunk)
            totals[name][0] += s
            totals[name][1] += n
        print(f"chunk {c + 1}/{n_chunks}: llama.cpp {math.exp(totals['llama.cpp'][0] / totals['llama.cpp'][1]):.4f}"
              f"  colibri {math.exp(totals['colibri'][0] / totals['colibri'][1]):.4f}", flush=True)
ppl = {k: math.exp(s / n) for k, (s, n) in totals.items()}
print(f"perplexity  llama.cpp {ppl['llama.cpp']:.4f}  colibri {ppl['colibri']:.4f}  "
      f"ratio {ppl['colibri'] / ppl['llama.cpp']:.5f}  ({n_chunks} chunks of {args.ctx}, "
      f"{totals['colibri'][1]} tokens scored)")
