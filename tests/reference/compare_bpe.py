#!/usr/bin/env python3
"""Differential check of colibri's BPE tokenizer against the Hugging Face `tokenizers`
library on any files (source trees, documentation): for each file, the token count and an
id checksum from both, and the files where they differ.

    python tests/reference/compare_bpe.py build/bin/colibri-bpe-bench \\
        tests/fixtures/tokenizers/qwen3/tokenizer.json FILE_OR_DIR...

Files are read as bytes; the reference gets bytes.decode("utf-8", errors="replace"), as in
generate_bpe.py. Directories are walked for files up to --max-bytes each.
"""

import argparse
import os
import subprocess
import sys

from tokenizers import Tokenizer


def files_under(paths, max_bytes):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, _, names in os.walk(p):
            for n in sorted(names):
                f = os.path.join(root, n)
                if os.path.isfile(f) and not os.path.islink(f) and 0 < os.path.getsize(f) <= max_bytes:
                    yield f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("tokenizer_json")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--max-bytes", type=int, default=256 * 1024)
    ap.add_argument("--max-files", type=int, default=2000)
    args = ap.parse_args()
    files = list(files_under(args.paths, args.max_bytes))[: args.max_files]
    ours = {}
    for k in range(0, len(files), 200):
        out = subprocess.run([args.bench, args.tokenizer_json, "--ids", *files[k:k + 200]],
                             check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            n, checksum, f = line.split(" ", 2)
            ours[f] = (int(n), int(checksum))
    tok = Tokenizer.from_file(args.tokenizer_json)
    bad, total = [], 0
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        total += len(data)
        ids = tok.encode(data.decode("utf-8", errors="replace"), add_special_tokens=False).ids
        ref = (len(ids), sum(i * (k + 1) for k, i in enumerate(ids)) % (1 << 64))
        if ours.get(f) != ref:
            bad.append(f)
            print(f"DIFFERS: {f}: colibri {ours.get(f)}, reference {ref}")
    print(f"{len(files) - len(bad)}/{len(files)} files identical ({total} bytes)", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
