#!/usr/bin/env python3
"""Train Colibri's default code-completion model: a small Mixtral-style MoE.

    nice -n 15 python models/train_default.py --out /work/default-model-ckpt --minutes 55

Corpus: the Python standard library sources of the build machine
(/usr/lib/python3.11/**/*.py without test directories), read at training time.
Steps:
  1. list and deterministically shuffle the files; hold out ~2% for validation;
  2. train a sentencepiece BPE tokenizer (vocab 4096, byte fallback, identity
     normalisation, no dummy prefix, FIM user-defined symbols);
  3. train MixtralForCausalLM with next-token prediction where ~50% of the
     sequences are fill-in-the-middle, by default in the suffix-first (SPM) order
     <fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle </s>
     (the middle then continues the prefix directly, which a small model learns
     far sooner than the PSM order <fim_prefix> prefix <fim_suffix> suffix
     <fim_middle> middle </s>), split points chosen at character level inside a
     document window;
  4. write a Hugging Face checkpoint in the per-expert Mixtral layout
     (config.json, model.safetensors, tokenizer.model, tokenizer_config.json with
     the FIM order the model was trained with) that colibri-convert reads, every
     few minutes and at the end.

Training is capped by wall-clock time (--minutes) and runs on two CPU threads.
All randomness is seeded; the number of optimisation steps depends on the
speed of the machine (the learning-rate schedule follows elapsed time).
Resume after a crash with --resume (the time budget counts across runs).
See models/README.md for the result.
"""

import os

for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_k] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import transformers
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<fim_prefix>", "<fim_suffix>", "<fim_middle>"
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


# --------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------

def list_corpus(root: Path):
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        text = text.replace("\r\n", "\n").replace("\t", "    ")
        if len(text.strip()) < 64:
            continue
        files.append((str(rel), text))
    return files


def split_corpus(files, seed: int, val_fraction: float):
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(files) * val_fraction))
    val = [files[i] for i in order[:n_val]]
    train = [files[i] for i in order[n_val:]]
    return train, val


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------

def train_tokenizer(train_files, out_dir: Path, vocab_size: int, seed: int):
    # sentencepiece trains on lines; newlines are encoded through byte fallback
    # (<0x0A>), runs of spaces (indentation) become whitespace-only pieces.
    def lines():
        for _, text in train_files:
            for line in text.split("\n"):
                if line.strip():
                    yield line

    prefix = out_dir / "tokenizer"
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=0.9995,
        byte_fallback=True,
        split_digits=True,
        split_by_whitespace=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        normalization_rule_name="identity",
        user_defined_symbols=[FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        max_sentence_length=16384,
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        seed_sentencepiece_size=1_000_000,
        num_threads=1,
        minloglevel=2,
    )
    (out_dir / "tokenizer.vocab").unlink(missing_ok=True)
    return out_dir / "tokenizer.model"


# --------------------------------------------------------------------------
# Data: plain next-token sequences and FIM sequences
# --------------------------------------------------------------------------

class Sampler:
    def __init__(self, files, sp, seq_len: int, fim_rate: float, spm_rate: float, seed: int):
        self.texts = [t for _, t in files]
        self.sp = sp
        self.seq_len = seq_len
        self.fim_rate = fim_rate
        self.spm_rate = spm_rate
        self.rng = random.Random(seed)
        self.eos = sp.eos_id()
        self.fp, self.fs, self.fm = (sp.piece_to_id(x) for x in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))
        self.ids = [np.asarray(sp.encode(t), dtype=np.int64) for t in self.texts]
        self.n_tokens = sum(len(x) for x in self.ids)
        self.n_chars = sum(len(t) for t in self.texts)
        self.chars_per_token = self.n_chars / max(1, self.n_tokens)
        w = np.asarray([len(x) for x in self.ids], dtype=np.float64)
        self.cum = np.cumsum(w / w.sum())

    def pick_doc(self):
        i = int(np.searchsorted(self.cum, self.rng.random(), side="right"))
        return min(i, len(self.texts) - 1)

    def plain(self):
        # seq_len + 1 consecutive tokens of the stream "doc </s> doc </s> ..."
        need = self.seq_len + 1
        out = []
        d = self.pick_doc()
        ids = self.ids[d]
        start = self.rng.randrange(0, max(1, len(ids) - 8))
        while True:
            out.extend(ids[start:].tolist())
            out.append(self.eos)
            if len(out) >= need:
                return out[:need]
            ids = self.ids[self.pick_doc()]
            start = 0

    def fim_segment(self, budget: int):
        # A window of whole lines (so it starts at a line start) of a document,
        # cut at two random character positions into prefix / middle / suffix.
        text = self.texts[self.pick_doc()]
        max_chars = int(budget * self.chars_per_token * self.rng.uniform(0.3, 1.0))
        max_chars = max(32, max_chars)
        line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        start = line_starts[self.rng.randrange(len(line_starts))]
        if start >= len(text) - 8:
            start = 0
        window = text[start:start + max_chars]
        for _ in range(6):
            if self.rng.random() < 0.5:
                # as in the FIM paper: two uniform character positions
                a, b = sorted(self.rng.randrange(0, len(window) + 1) for _ in range(2))
            else:
                # editor-like: the middle runs from a random character to the end of
                # its line or of one of the next two lines (newline left in the suffix)
                a = self.rng.randrange(0, len(window) + 1)
                b = a
                for _ in range(self.rng.randrange(1, 4)):
                    nl = window.find("\n", b + 1 if b > a else b)
                    b = len(window) if nl < 0 else nl
            pre, mid, suf = window[:a], window[a:b], window[b:]
            if self.rng.random() < self.spm_rate:
                seg = ([self.fp, self.fs] + self.sp.encode(suf) + [self.fm] + self.sp.encode(pre) +
                       self.sp.encode(mid) + [self.eos])
            else:
                seg = ([self.fp] + self.sp.encode(pre) + [self.fs] + self.sp.encode(suf) +
                       [self.fm] + self.sp.encode(mid) + [self.eos])
            if len(seg) <= budget or len(window) < 64:
                return seg
            window = window[: int(len(window) * 0.75)]
        return seg

    def fim(self):
        need = self.seq_len + 1
        out = []
        while len(out) < need:
            out.extend(self.fim_segment(max(48, need - len(out))))
        return out[:need]

    def sample(self):
        return self.fim() if self.rng.random() < self.fim_rate else self.plain()

    def batch(self, n: int):
        return torch.tensor([self.sample() for _ in range(n)], dtype=torch.long)


# --------------------------------------------------------------------------
# Model and checkpoint
# --------------------------------------------------------------------------

def make_config(args, sp):
    return MixtralConfig(
        vocab_size=sp.get_piece_size(),
        hidden_size=args.hidden,
        intermediate_size=args.expert_ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        sliding_window=None,
        tie_word_embeddings=False,
        router_aux_loss_coef=args.aux_loss,
        output_router_logits=True,
        bos_token_id=sp.bos_id(),
        eos_token_id=sp.eos_id(),
        pad_token_id=None,
        initializer_range=0.02,
        attention_dropout=0.0,
    )


EXPERT_KEY = re.compile(r"^model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.w[123]\.weight$")


def export_hf(model, config, tokenizer_path: Path, out: Path, fim_order: str, extra_meta: dict):
    """config.json + model.safetensors (per-expert layout) + tokenizer files."""
    sd = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    if not any(EXPERT_KEY.match(k) for k in sd):
        raise SystemExit("this transformers version stores Mixtral experts fused; colibri-convert reads the "
                         "per-expert layout model.layers.N.block_sparse_moe.experts.E.w1/w2/w3.weight "
                         "(use transformers 4.x, see models/requirements.txt)")
    tmp = out / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    tmp.replace(out / "model.safetensors")
    cfg = config.to_dict()
    cfg["architectures"] = ["MixtralForCausalLM"]
    cfg["output_router_logits"] = False
    cfg["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok_cfg = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": False,   # trained without BOS: prompts start directly with text / <fim_prefix>
        "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
        "additional_special_tokens": [FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE],
        "fim_order": fim_order,   # read by colibri-convert: the order FIM prompts must use
        "legacy": False, "add_prefix_space": False,
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    if tokenizer_path.resolve() != (out / "tokenizer.model").resolve():
        (out / "tokenizer.model").write_bytes(tokenizer_path.read_bytes())
    (out / "training_meta.json").write_text(json.dumps(extra_meta, indent=2) + "\n")


@torch.no_grad()
def evaluate(model, batches):
    model.eval()
    total, n = 0.0, 0
    for x in batches:
        out = model(input_ids=x[:, :-1], output_router_logits=False)
        logits = out.logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                                 reduction="sum")
        total += loss.item()
        n += x[:, 1:].numel()
    model.train()
    return total / n


def lm_loss(logits, targets):
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


@torch.no_grad()
def greedy(model, sp, prompt_ids, max_new: int, stop_ids):
    model.eval()
    ids = list(prompt_ids)
    out = []
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([ids]), output_router_logits=False).logits[0, -1]
        t = int(torch.argmax(logits))
        if t in stop_ids:
            break
        ids.append(t)
        out.append(t)
    model.train()
    return out


SAMPLE_PROMPTS = [
    ("prefix", "def fibonacci(n):", None),
    ("prefix", "import os\n\n\ndef list_python_files(path):\n    \"\"\"Return the .py files under path.\"\"\"\n", None),
    ("prefix", "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n", None),
    ("fim", "def read_lines(path):\n    with open(path) as f:\n        ", "\n    return lines\n"),
    ("fim", "def is_even(n):\n    return ", "\n\n\nprint(is_even(4))\n"),
    ("fim", "for i in range(10):\n    if i % 2 == 0:\n        ", "\n    else:\n        print('odd', i)\n"),
]


def prompt_text(kind, prefix, suffix, fim_order="spm"):
    if kind == "fim" and fim_order == "spm":
        return f"{FIM_PREFIX}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}{prefix}"
    if kind == "fim":
        return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"
    return prefix


def fim_order_of(spm_rate: float) -> str:
    """The order inference should use: the one most of the FIM training was in."""
    return "spm" if spm_rate >= 0.5 else "psm"


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/work/default-model-ckpt")
    ap.add_argument("--corpus", default="/usr/lib/python3.11")
    ap.add_argument("--minutes", type=float, default=55.0, help="wall-clock cap for the training loop")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--fim-rate", type=float, default=0.5)
    ap.add_argument("--spm-rate", type=float, default=1.0, help="fraction of FIM segments in suffix-first order")
    ap.add_argument("--val-fraction", type=float, default=0.02)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-ffn", type=int, default=256)
    ap.add_argument("--aux-loss", type=float, default=0.01)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every-min", type=float, default=5.0)
    ap.add_argument("--save-every-min", type=float, default=5.0)
    ap.add_argument("--val-batches", type=int, default=6)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--bench", type=int, default=0, help="time this many steps and exit")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_f = open(out / "train_log.txt", "a")

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_f.write(line + "\n")
        log_f.flush()

    log(f"args {vars(args)}")
    log(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__} "
        f"sentencepiece {spm.__version__} numpy {np.__version__}")

    files = list_corpus(Path(args.corpus))
    train_files, val_files = split_corpus(files, args.seed, args.val_fraction)
    log(f"corpus {len(files)} files, {sum(len(t) for _, t in files)} chars; "
        f"train {len(train_files)} files, validation {len(val_files)} files")
    (out / "validation_files.txt").write_text("".join(n + "\n" for n, _ in val_files))

    tok_path = out / "tokenizer.model"
    if not (args.resume and tok_path.exists()):
        t0 = time.time()
        tok_path = train_tokenizer(train_files, out, args.vocab, args.seed)
        log(f"tokenizer trained in {time.time() - t0:.1f}s")
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    log(f"tokenizer: {sp.get_piece_size()} pieces; fim ids "
        f"{[sp.piece_to_id(x) for x in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)]}; "
        f"'    return x\\n' -> {sp.encode('    return x' + chr(10), out_type=str)}")

    t0 = time.time()
    train_s = Sampler(train_files, sp, args.seq_len, args.fim_rate, args.spm_rate, args.seed + 1)
    val_s = Sampler(val_files, sp, args.seq_len, args.fim_rate, args.spm_rate, args.seed + 2)
    fim_order = fim_order_of(args.spm_rate)
    log(f"tokenized in {time.time() - t0:.1f}s: train {train_s.n_tokens} tokens "
        f"({train_s.chars_per_token:.2f} chars/token), validation {val_s.n_tokens} tokens")
    val_batches = [val_s.batch(args.batch) for _ in range(args.val_batches)]
    val_plain = torch.tensor([val_s.plain() for _ in range(args.batch * 2)], dtype=torch.long)
    val_fim = torch.tensor([val_s.fim() for _ in range(args.batch * 2)], dtype=torch.long)

    config = make_config(args, sp)
    model = MixtralForCausalLM(config)
    model.train()
    n_total = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_active = n_total - n_expert + n_expert * args.top_k // args.experts
    log(f"model: {n_total} parameters, {n_active} active per token "
        f"({n_expert} in experts, {args.experts} experts top-{args.top_k})")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    step, elapsed_before, tokens_seen = 0, 0.0, 0
    state_path = out / "train_state.pt"
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed_before, tokens_seen = st["step"], st["elapsed"], st["tokens"]
        train_s.rng.setstate(st["sampler_rng"])
        torch.set_rng_state(st["torch_rng"])
        log(f"resumed at step {step}, {elapsed_before / 60:.1f} min already trained")

    budget = args.minutes * 60.0
    history = []

    def save(final=False):
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed, "tokens": tokens_seen, "sampler_rng": train_s.rng.getstate(),
                    "torch_rng": torch.get_rng_state()}, str(state_path) + ".tmp")
        os.replace(str(state_path) + ".tmp", state_path)
        meta = {"step": step, "tokens_seen": tokens_seen, "train_minutes": elapsed / 60,
                "parameters_total": n_total, "parameters_active": n_active, "history": history,
                "final": final, "args": vars(args)}
        export_hf(model, config, tok_path, out, fim_order, meta)

    t_start = time.time()
    last_eval = last_save = t_start
    elapsed = elapsed_before
    ema = None
    while True:
        elapsed = elapsed_before + (time.time() - t_start)
        if elapsed >= budget or (args.bench and step >= args.bench):
            break
        progress = min(1.0, elapsed / budget)
        if step < args.warmup_steps:
            lr = args.lr * (step + 1) / args.warmup_steps
        else:
            lr = args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr

        x = train_s.batch(args.batch)
        out_m = model(input_ids=x[:, :-1], output_router_logits=True)
        loss = lm_loss(out_m.logits, x[:, 1:])
        aux = out_m.aux_loss if out_m.aux_loss is not None else torch.zeros(())
        total = loss + args.aux_loss * aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x[:, 1:].numel()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 10 == 0 or args.bench:
            log(f"step {step} loss {loss.item():.4f} ema {ema:.4f} aux {aux.item():.3f} lr {lr:.2e} "
                f"tokens {tokens_seen} elapsed {elapsed / 60:.2f} min "
                f"({tokens_seen / max(1e-9, elapsed):.0f} tok/s)")
        now = time.time()
        if now - last_eval >= args.eval_every_min * 60:
            v = evaluate(model, val_batches)
            history.append({"step": step, "minutes": elapsed / 60, "train_ema": ema, "val": v})
            log(f"eval step {step}: train(ema) {ema:.4f} validation {v:.4f}")
            last_eval = time.time()
        if now - last_save >= args.save_every_min * 60:
            save()
            log(f"checkpoint saved at step {step}")
            last_save = time.time()

    if args.bench:
        log(f"bench: {step} steps in {elapsed:.1f}s, {tokens_seen / elapsed:.0f} tok/s")
        return

    v = evaluate(model, val_batches)
    vp = evaluate(model, [val_plain])
    vf = evaluate(model, [val_fim])
    # train loss on a fixed sample of training sequences (not the noisy running mean)
    train_s.rng = random.Random(args.seed + 3)
    tr = evaluate(model, [train_s.batch(args.batch) for _ in range(args.val_batches)])
    history.append({"step": step, "minutes": elapsed / 60, "train_ema": ema, "train": tr, "val": v,
                    "val_plain": vp, "val_fim": vf})
    log(f"final step {step}, {tokens_seen} tokens, {elapsed / 60:.1f} min: train {tr:.4f} (ema {ema:.4f}) "
        f"validation {v:.4f} (plain {vp:.4f}, fim {vf:.4f})")
    save(final=True)
    log(f"saved {out}")

    # torch greedy samples, to compare with the Colibri engine on the converted file
    stop = {sp.eos_id()}
    samples = []
    for kind, pre, suf in SAMPLE_PROMPTS:
        text = prompt_text(kind, pre, suf, fim_order)
        ids = sp.encode(text)
        gen = greedy(model, sp, ids, 64, stop)
        samples.append({"kind": kind, "prompt": text, "prompt_ids": ids, "ids": gen,
                        "completion": sp.decode(gen)})
        log(f"sample [{kind}] {text!r} -> {sp.decode(gen)!r}")
    (out / "samples_torch.json").write_text(json.dumps(samples, indent=2) + "\n")


if __name__ == "__main__":
    main()
