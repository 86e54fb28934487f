#!/usr/bin/env python3
"""Check existing fixtures against whatever transformers/torch are installed.

    python tests/reference/verify.py --fixtures tests/fixtures

Unlike generate.py this writes nothing.  It reloads every family checkpoint
with the installed transformers (it need not be the version that made the
fixtures; e.g. transformers 5.x, which fuses the per-expert tensors into
gate_up_proj on load), recomputes the prompt logits and the greedy
continuation in float64, and compares them with logits.bin / greedy_ids /
greedy_logits.bin.  It also runs the independent numpy forward pass from
generate.py and re-encodes the tokenizer cases.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402  (sets thread/env settings first)

import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

REL_TOL = 1e-5  # |diff| / max|logit|


def check_tokenizer(fx):
    sp = spm.SentencePieceProcessor(model_file=str(fx / "tokenizer" / "tokenizer.model"))
    cases = json.loads((fx / "tokenizer" / "cases.json").read_text(encoding="utf-8"))
    bad = 0
    for c in cases:
        ids = sp.encode(c["text"], out_type=int)
        ok = (
            ids == c["ids"]
            and sp.encode(c["text"], out_type=int, add_bos=True) == c["ids_with_bos"]
            and sp.decode(c["ids"]) == c["decoded"]
        )
        bad += not ok
        if not ok:
            print(f"  tokenizer MISMATCH for {c['text']!r}")
    print(f"tokenizer: {len(cases) - bad}/{len(cases)} cases agree")
    return bad == 0


def check_family(d):
    exp = json.loads((d / "expected.json").read_text())
    n, V = len(exp["prompt_ids"]), exp["n_vocab"]
    ref_logits = np.fromfile(d / exp["logits_file"], dtype="<f4").reshape(n, V).astype(np.float64)
    ref_steps = np.fromfile(d / exp["greedy_logits_file"], dtype="<f4").reshape(-1, V).astype(np.float64)
    model = g.load_reference(d)
    res = g.run_reference(model, exp["prompt_ids"], 0)
    scale = exp["max_abs_logit"]
    d_prompt = float(np.max(np.abs(res["prompt_logits"] - ref_logits))) / scale
    d_steps = float(np.max(np.abs(res["step_logits"] - ref_steps))) / scale
    greedy_ok = res["greedy"] == exp["greedy_ids"] and res["generate_agrees"]
    full = exp["prompt_ids"] + exp["greedy_ids"][:-1]
    np_logits = g.numpy_forward(d, exp["family"], full)
    d_np = float(np.max(np.abs(np_logits[:n] - ref_logits))) / scale
    ok = greedy_ok and max(d_prompt, d_steps, d_np) < REL_TOL
    print(
        f"{exp['family']:12s} {'OK ' if ok else 'BAD'} greedy {'=' if greedy_ok else '!='}, "
        f"rel diff prompt {d_prompt:.1e}, steps {d_steps:.1e}, numpy {d_np:.1e}"
    )
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", type=Path, default=Path(__file__).resolve().parents[1] / "fixtures")
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    ok = check_tokenizer(args.fixtures)
    for d in sorted(p for p in args.fixtures.iterdir() if (p / "expected.json").exists()):
        if "prompt_ids" not in json.loads((d / "expected.json").read_text()):
            # *_bpe (generate_bpe_models.py): re-check by regenerating and diffing
            print(f"{d.name:12s} skipped (generate_bpe_models.py fixture)")
            continue
        ok &= check_family(d)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
