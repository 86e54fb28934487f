#!/usr/bin/env python3
"""Conformance fixtures with real byte-level BPE vocabularies (tests/fixtures/*_bpe/).

    python tests/reference/generate_bpe_models.py --fixtures tests/fixtures

For each model below: a tiny random-weight MoE checkpoint whose vocabulary is that of a
real tokenizer.json already committed under tests/fixtures/tokenizers/ (not copied
again), the reference ids of a few texts from transformers' tokenizer for that
checkpoint, and the transformers logits and greedy continuation for those ids.

Makes tests/fixtures/<name>/
    config.json generation_config.json model.safetensors
    expected.json   texts, reference ids, greedy ids and their decoded text, row layout
    logits_top.bin  float32 LE [n_rows][16 + n_sample]: per row, the 16 largest logits
                    (descending), then the logits at the shared `sample_columns`
    logits_top_ids.bin  int32 LE [n_rows][16]: the ids of those 16 largest logits
    logits_full.bin float32 LE [n_vocab]: the whole last prompt row of the first text

Row layout: text after text, each text's prompt positions, then its greedy steps
1..n_greedy-1 (step 0 is chosen from the last prompt row). Full rows of 150K logits
would take 600 KB each, so only one is stored whole.

Same determinism and reference computation as generate.py (whose helpers this uses);
needs the same environment (requirements.txt).
"""

import generate as g  # sets the thread / reproducibility environment first

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers

N_GREEDY = 16
N_TOP = 16  # largest logits stored per row
N_SAMPLE = 256  # shared columns stored per row
MIN_DISTINCT_GREEDY = 6  # of N_GREEDY: reject degenerate (repeating) continuations
MARGIN_MIN = 1e-4  # (top1 - top2) / max|logit| required at every greedy step
ROUTER_GAP_MIN = 1e-4  # (kth - (k+1)th router logit) / max|router logit|, every position

# Code in several languages, CJK, emoji, whitespace runs. Short: each prompt position
# costs a row of the stored logits.
TEXTS = [
    ("python", "def mean(xs):\n    return sum(xs) / len(xs)  # float\n"),
    ("rust", "fn main() {\n    let v: Vec<u32> = (1..=3).collect();\n}"),
    ("javascript", "const f = async (x) => { await x?.y ?? 0; };"),
    ("shell", "for f in *.txt; do\n\tgrep -n 'TODO' \"$f\"\ndone"),
    ("cjk", "日本語のテキスト、中文句子，한국어 문장。"),
    ("emoji", "Family 👨\u200d👩\u200d👧, thumbs 👍🏽 and 🇯🇵!"),
    ("whitespace", "a    b\t\tc\n\n\n    x  \r\n   end   "),
]

COMMON = dict(
    hidden_size=16,
    num_hidden_layers=2,
    max_position_embeddings=256,
    tie_word_embeddings=True,  # one [n_vocab, 16] matrix: the checkpoint stays ~5 MB
    hidden_act="silu",
)

# With a tied 16-wide embedding the token's own embedding dominates the residual stream
# and greedy decoding repeats a few tokens; smaller embeddings and larger output
# projections give the layers more say (as granite_moe in generate.py).
STD_OVERRIDES = {"embed_tokens": 0.05, "o_proj": 1.0, "down_proj": 2.0}

MODELS = {
    "qwen3_moe_bpe": dict(
        family="qwen3_moe",
        tokenizer="tokenizers/qwen3",
        config="Qwen3MoeConfig",
        model="Qwen3MoeForCausalLM",
        dtype="bfloat16",
        base_seed=7000,
        std=0.2,
        std_overrides=STD_OVERRIDES,
        cfg=dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,  # q width 64 != hidden 16
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            intermediate_size=32,  # unused (no dense layers)
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            bos_token_id=151643,  # as Qwen3's config.json
            eos_token_id=151645,
            pad_token_id=151643,
        ),
    ),
    "olmoe_bpe": dict(
        family="olmoe",
        tokenizer="tokenizers/deepseek-v3",
        config="OlmoeConfig",
        model="OlmoeForCausalLM",
        dtype="float16",
        base_seed=8000,
        std=0.2,
        std_overrides=STD_OVERRIDES,
        cfg=dict(
            num_attention_heads=2,
            num_key_value_heads=1,  # head_dim 8
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            intermediate_size=16,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            clip_qkv=None,
            attention_bias=False,
            bos_token_id=0,  # as DeepSeek-V3's config.json
            eos_token_id=1,
            pad_token_id=1,
        ),
    ),
}


def sample_columns(n_vocab, seed):
    """Ids 0 and n_vocab-1, and N_SAMPLE-2 others spread evenly over the vocabulary
    (one random id per stratum), sorted."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(1, n_vocab - 1, N_SAMPLE - 1).astype(np.int64)
    inner = [int(rng.integers(a, b)) for a, b in zip(edges[:-1], edges[1:])]
    cols = sorted(set([0, n_vocab - 1] + inner))
    assert len(cols) == N_SAMPLE
    return cols


def load_hf_tokenizer(tok_dir, tmp):
    """transformers' tokenizer for the checkpoint, as AutoTokenizer loads it from a
    checkpoint folder with tokenizer.json and tokenizer_config.json."""
    d = Path(tmp) / "tok"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, d / f)
    return transformers.AutoTokenizer.from_pretrained(str(d))


def build(name, spec, fixtures, log):
    tok_dir = fixtures / spec["tokenizer"]
    with tempfile.TemporaryDirectory() as tmp:
        tok = load_hf_tokenizer(tok_dir, tmp)
    n_vocab = len(tok)
    raw = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    cases = []
    for cname, text in TEXTS:
        ids = tok(text)["input_ids"]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        assert plain == raw.encode(text, add_special_tokens=False).ids, (name, cname)
        cases.append(dict(name=cname, text=text, ids=ids, encode_ids=plain))
    bos = spec["cfg"]["bos_token_id"]
    add_bos = cases[0]["ids"][0] == bos and cases[0]["ids"][1:] == cases[0]["encode_ids"]
    for c in cases:
        assert c["ids"] == ([bos] if add_bos else []) + c["encode_ids"], (name, c["name"])

    top_k = spec["cfg"]["num_experts_per_tok"]
    out_dir = fixtures / name
    for attempt in range(g.MAX_SEED_TRIES):
        seed = spec["base_seed"] + attempt
        torch.manual_seed(seed)
        cfg = getattr(transformers, spec["config"])(**{**COMMON, **spec["cfg"], "vocab_size": n_vocab})
        model = getattr(transformers, spec["model"])(cfg).eval()
        g.init_weights(model, seed, spec["std"], spec["std_overrides"])
        model = model.to(g.TORCH_DTYPES[spec["dtype"]])
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            ref = g.load_reference(tmp)
            stored = g.load_tensors(tmp)
            assert "lm_head.weight" not in stored
            for k, v in ref.state_dict().items():
                if k in stored:
                    assert np.array_equal(stored[k], v.numpy()), (name, k)
            problems, results = [], []
            for c in cases:
                res = g.run_reference(ref, c["ids"], top_k, n_greedy=N_GREEDY)
                margins = [g.top2_margin(r) for r in res["step_logits"]]
                if min(margins) < MARGIN_MIN:
                    problems.append(f"{c['name']}: greedy margin {min(margins):.2e}")
                rgap = g.router_min_gap(res["full_router"], top_k)
                if rgap < ROUTER_GAP_MIN:
                    problems.append(f"{c['name']}: router gap {rgap:.2e}")
                if cfg.eos_token_id in res["greedy"]:
                    problems.append(f"{c['name']}: greedy emits eos")
                if len(set(res["greedy"])) < MIN_DISTINCT_GREEDY:
                    problems.append(f"{c['name']}: greedy has only {len(set(res['greedy']))} distinct tokens")
                if not res["generate_agrees"]:
                    problems.append(f"{c['name']}: generate() with KV cache disagrees with full recompute")
                if problems:
                    break
                res["min_margin"] = min(margins)
                res["router_gap"] = rgap
                results.append(res)
            if problems:
                log(f"  {name}: seed {seed} rejected ({'; '.join(problems)})")
                continue
            # independent numpy float64 forward pass over every text and its continuation
            np_diff, maxabs = 0.0, 0.0
            for c, res in zip(cases, results):
                full = c["ids"] + res["greedy"][:-1]
                npl = g.numpy_forward(tmp, spec["family"], full)
                hf = np.concatenate([res["prompt_logits"], res["step_logits"][1:]], axis=0)
                np_diff = max(np_diff, float(np.max(np.abs(npl - hf))))
                maxabs = max(maxabs, float(np.max(np.abs(hf))))
            assert np_diff < 1e-4 * maxabs, (name, np_diff, maxabs)
            if out_dir.exists():
                shutil.rmtree(out_dir)
            shutil.copytree(tmp, out_dir)
        break
    else:
        raise RuntimeError(f"{name}: no seed in {g.MAX_SEED_TRIES} tries passed the checks")
    for p in [out_dir, *out_dir.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)

    cols = sample_columns(n_vocab, spec["base_seed"])
    top_vals, top_ids, sampled = [], [], []
    row = 0
    out_cases = []
    for c, res in zip(cases, results):
        rows = np.concatenate([res["prompt_logits"], res["step_logits"][1:]], axis=0)
        order = np.argsort(-rows, axis=1, kind="stable")[:, :N_TOP]
        top_ids.append(order.astype("<i4"))
        top_vals.append(np.take_along_axis(rows, order, axis=1))
        sampled.append(rows[:, cols])
        greedy = res["greedy"]
        out_cases.append(
            {
                "name": c["name"],
                "text": c["text"],
                "ids": c["ids"],
                "encode_ids": c["encode_ids"],
                "decoded": tok.decode(c["ids"], skip_special_tokens=True),
                "greedy_ids": greedy,
                "greedy_text": tok.decode(greedy, skip_special_tokens=True),
                "first_row": row,
                "n_rows": len(rows),
                "min_top2_margin_greedy": res["min_margin"],
                "min_router_gap": res["router_gap"],
            }
        )
        row += len(rows)
    top_vals = np.concatenate(top_vals)
    g.write_f32(out_dir / "logits_top.bin", np.concatenate([top_vals, np.concatenate(sampled)], axis=1))
    (out_dir / "logits_top_ids.bin").write_bytes(np.ascontiguousarray(np.concatenate(top_ids), dtype="<i4").tobytes())
    g.write_f32(out_dir / "logits_full.bin", results[0]["prompt_logits"][-1])
    max_abs = float(max(max(np.max(np.abs(r["prompt_logits"])), np.max(np.abs(r["step_logits"]))) for r in results))
    expected = {
        "name": name,
        "family": spec["family"],
        "architecture": spec["model"],
        "dtype": spec["dtype"],
        "tokenizer_dir": spec["tokenizer"],
        "n_vocab": n_vocab,
        "add_bos": add_bos,
        "bos_id": bos,
        "n_greedy": N_GREEDY,
        "n_rows": row,
        "n_top": N_TOP,
        "sample_columns": cols,
        "logits_file": "logits_top.bin",
        "logits_shape": [row, N_TOP + N_SAMPLE],
        "top_ids_file": "logits_top_ids.bin",
        "top_ids_shape": [row, N_TOP],
        "full_row_file": "logits_full.bin",
        "full_row": out_cases[0]["first_row"] + len(cases[0]["ids"]) - 1,
        "max_abs_logit": max_abs,
        "numpy_max_abs_diff": np_diff,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "cases": out_cases,
    }
    g.dump_json(out_dir / "expected.json", expected)
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    log(
        f"  {name}: vocab {n_vocab}, seed {seed}, {row} rows, max|logit| {max_abs:.3f}, "
        f"greedy margin {min(c['min_top2_margin_greedy'] for c in out_cases):.2e}, "
        f"router gap {min(c['min_router_gap'] for c in out_cases):.2e}, numpy diff {np_diff:.2e}, "
        f"{size / 1e6:.2f} MB"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", required=True, type=Path, help="tests/fixtures (holds tokenizers/)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma separated subset")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    log = (lambda *_: None) if args.quiet else (lambda m: print(m, flush=True))
    transformers.logging.set_verbosity_error()
    for mod, want in {**g.PINNED, tokenizers: "0.22.2"}.items():
        if mod.__version__.split("+")[0] != want:
            print(f"WARNING: {mod.__name__} {mod.__version__} is not the pinned {want}", file=sys.stderr)
    for name in args.models.split(","):
        build(name, MODELS[name], args.fixtures, log)


if __name__ == "__main__":
    main()
