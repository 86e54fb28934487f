#!/usr/bin/env python3
"""Encode throughput of the Hugging Face `tokenizers` library, single-threaded, on the
benchmark text, for comparison with colibri-bpe-bench on the same file.

The text is the conformance corpus of generate_bpe.py (valid UTF-8 cases only),
concatenated and repeated up to about 1 MB; it is written to --text so that
colibri-bpe-bench reads exactly the same bytes:

    python tests/reference/bench_bpe.py --text /tmp/bpe-bench.txt
    build/bin/colibri-bpe-bench tests/fixtures/tokenizers/qwen3/tokenizer.json /tmp/bpe-bench.txt

Two modes, as colibri-bpe-bench: "whole", one encode() call of the whole text; "chunks",
the text cut at line ends into chunks of at least 4096 bytes, one encode() call each
(prompt-sized inputs). add_special_tokens=False, best of --repeats; the library's thread
pool is limited to one thread (RAYON_NUM_THREADS=1).
"""

import argparse
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_bpe import NAMES, ROOT, TEXTS  # noqa: E402


def bench_text(size=1 << 20):
    unit = "\n".join(t for _, t in TEXTS) + "\n"
    return (unit * (size // len(unit.encode()) + 1))[: size]


def chunks(data, at_least=4096):
    """The text cut after a newline once a chunk has at least `at_least` bytes."""
    out, begin = [], 0
    for i, b in enumerate(data):
        if (b == 0x0A and i + 1 - begin >= at_least) or i + 1 == len(data):
            out.append(data[begin:i + 1].decode())
            begin = i + 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default="/tmp/bpe-bench.txt")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    text = bench_text()
    data = text.encode()
    with open(args.text, "wb") as f:
        f.write(data)
    print(f"text {args.text}: {len(data)} bytes")
    for name in NAMES:
        tok = Tokenizer.from_file(os.path.join(ROOT, name, "tokenizer.json"))
        for mode, inputs in (("whole", [text]), ("chunks", chunks(data))):
            best = 1e30
            for _ in range(args.repeats):
                ids = []
                t0 = time.perf_counter()
                for t in inputs:
                    ids += tok.encode(t, add_special_tokens=False).ids
                best = min(best, time.perf_counter() - t0)
            checksum = sum(i * (k + 1) for k, i in enumerate(ids)) % (1 << 64)
            print(f"{name:12s} {mode:6s} {len(ids)} tokens, checksum {checksum}, {best * 1e3:.1f} ms, "
                  f"{len(data) / best / 1e6:.2f} MB/s (HF tokenizers, 1 thread)")


if __name__ == "__main__":
    main()
