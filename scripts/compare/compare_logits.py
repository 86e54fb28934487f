"""Logits of llama.cpp (llama-cpp-python) and Colibri for the same token ids on the same
weights: a GGUF file and the .colibri file converted from it.

    compare_logits.py MODEL.gguf MODEL.colibri [--tokens N] [--colibri build-cpu/bin/colibri]

Prints, over N random token ids (default 64): how often the two argmaxes agree, the largest
and RMS logit difference relative to the RMS logit, and the mean KL divergence."""
import argparse, os, random, subprocess, tempfile

import numpy as np
from llama_cpp import Llama

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("model")
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--colibri", default="build-cpu/bin/colibri")
args = ap.parse_args()

llm = Llama(model_path=args.gguf, n_threads=2, n_threads_batch=2, n_ctx=max(args.tokens, 64), n_batch=args.tokens,
            n_ubatch=args.tokens, logits_all=True, verbose=False)
rng = random.Random(1)
ids = [rng.randrange(3, llm.n_vocab()) for _ in range(args.tokens)]
llm.eval(ids)
ref = np.array(llm.scores[: len(ids)], dtype=np.float64)

with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "logits.f32")
    subprocess.run([args.colibri, "--model", args.model, "--threads", "2", "--tokens", ",".join(map(str, ids)),
                    "--dump-logits", out], check=True, stderr=subprocess.DEVNULL)
    got = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)


def log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


rms = np.sqrt(np.mean(ref**2))
diff = got - ref
lp, lq = log_softmax(ref), log_softmax(got)
kl = np.sum(np.exp(lp) * (lp - lq), axis=1)
agree = np.mean(ref.argmax(axis=1) == got.argmax(axis=1))
print(f"{len(ids)} positions: argmax agrees {agree:.3f}, max |diff| {np.abs(diff).max() / rms:.4f} and "
      f"RMS diff {np.sqrt(np.mean(diff**2)) / rms:.4f} of the RMS logit ({rms:.3f}), mean KL {kl.mean():.2e}")
