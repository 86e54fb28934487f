"""Writes a random-weight MoE model of one of colibri-bench's --shape shapes as a GGUF file
that llama.cpp loads and colibri-convert converts (blocks copied byte for byte), or one of
Qwen3-Coder-30B-A3B's shape (qwen3-coder-30b: 48 layers, dim 2048, 32/4 heads of 128, 128
experts top-8 of width 768, vocabulary 151,936; about 18 GB at q4_k_m).

    make_moe_gguf.py mixtral-like|fine-grained|qwen3-coder-30b q8_0|q4_0|q4_k_m|f16 OUT.gguf [--layers N]
                     [--vocab VOCAB.gguf]

The bench shapes are laid out as llama.cpp's converter writes Mixtral: architecture "llama",
experts stacked in blk.N.ffn_{gate,up,down}_exps, router blk.N.ffn_gate_inp in F32 (random
q/k rows need no reordering for llama.cpp's RoPE); qwen3-coder-30b as llama.cpp writes
Qwen3-MoE (architecture "qwen3moe", q/k norms). Like colibri-bench's random model: values
about uniform in +-1/sqrt(columns), norms ones in F32. Quantised blocks are drawn directly:
a scale per block (that of 32 uniform values) and uniform integer levels, as ggml's
quantiser gives for them; K-quant super-blocks of random bits with scales of that size.
q4_k_m gives each matrix the type llama-quantize's Q4_K_M gives it: Q6_K for output, and for
attn_v and ffn_down on the layers it favours, Q4_K for the rest. Vocabulary: --vocab copies a
real sentencepiece vocabulary of the shape's size (the bench shapes': 32,000 tokens, as
Mixtral's) from a vocabulary-only GGUF, such as llama.cpp's models/ggml-vocab-llama-spm.gguf,
so that text (the speculative workloads' prompts) takes as many tokens as a real model's
would; without it, synthetic tokens (<unk>, <s>, </s>, 256 byte tokens, the rest "▁w<i>")
that spell any text byte by byte. f16 (float matrices) is for checking that both engines compute
the same function without int8 rounding in the way."""
import argparse

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

BENCH = dict(arch="llama", n_embd=1024, n_head=16, n_head_kv=8, head_dim=64, n_vocab=32000)
SHAPES = {  # as engine/tools/bench_main.cpp
    "mixtral-like": dict(BENCH, n_layer=16, n_expert=8, n_expert_used=2, n_ff_exp=2816),
    "fine-grained": dict(BENCH, n_layer=24, n_expert=32, n_expert_used=8, n_ff_exp=512),
    "qwen3-coder-30b": dict(arch="qwen3moe", n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_vocab=151936, n_layer=48,
                            n_expert=128, n_expert_used=8, n_ff_exp=768),
}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("shape", choices=SHAPES)
ap.add_argument("quant", choices=["q8_0", "q4_0", "q4_k_m", "f16"])
ap.add_argument("out")
ap.add_argument("--layers", type=int, help="fewer layers than the shape's (for quick checks)")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--vocab", help="a vocabulary-only sentencepiece GGUF whose tokens, scores and types to copy")
args = ap.parse_args()
s = SHAPES[args.shape]
n_layer = args.layers or s["n_layer"]
qtype = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_k_m": Q.Q4_K, "f16": Q.F16}[args.quant]
E, F, X = s["n_embd"], s["n_ff_exp"], s["n_expert"]
N_HEAD, N_HEAD_KV, HEAD_DIM, N_VOCAB = s["n_head"], s["n_head_kv"], s["head_dim"], s["n_vocab"]
qwen3 = s["arch"] == "qwen3moe"


def more_bits(il):  # llama-quantize's use_more_bits: the layers Q4_K_M gives Q6_K attn_v and ffn_down
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def q(il=None):  # a matrix's type; Q4_K_M favours output, and attn_v / ffn_down of some layers (il)
    return Q.Q6_K if qtype == Q.Q4_K and (il == -1 or (il is not None and more_bits(il))) else qtype


# (name, shape outermost first, kind): kind a quantised type, "f" f32 uniform, "1" f32 ones
tensors = [("token_embd.weight", (N_VOCAB, E), q())]
for il in range(n_layer):
    b = f"blk.{il}."
    tensors += [(b + "attn_norm.weight", (E,), "1"), (b + "attn_q.weight", (N_HEAD * HEAD_DIM, E), q()),
                (b + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, E), q()), (b + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, E), q(il)),
                (b + "attn_output.weight", (E, N_HEAD * HEAD_DIM), q())]
    if qwen3:
        tensors += [(b + "attn_q_norm.weight", (HEAD_DIM,), "1"), (b + "attn_k_norm.weight", (HEAD_DIM,), "1")]
    tensors += [(b + "ffn_norm.weight", (E,), "1"), (b + "ffn_gate_inp.weight", (X, E), "f"), (b + "ffn_gate_exps.weight", (X, F, E), q()),
                (b + "ffn_up_exps.weight", (X, F, E), q()), (b + "ffn_down_exps.weight", (X, E, F), q(il))]
tensors += [("output_norm.weight", (E,), "1"), ("output.weight", (N_VOCAB, E), q(-1))]


def k_blocks(rng, nb, t, a):
    """nb K-quant super-blocks of random bits whose f16 scales give values of about +-a."""
    size = gguf.GGML_QUANT_SIZES[t][1]
    blocks = rng.integers(0, 256, (nb, size), np.uint8)
    if t == Q.Q4_K:  # d, dmin first: x = d sc q - dmin m, sc and m 6-bit, q 4-bit
        blocks[:, 0:4] = np.float16([a / (32 * 8), a / (32 * 16)]).view(np.uint8)
    else:  # Q6_K: d last, x = d sc (q - 32), sc int8 kept within +-32
        blocks[:, 192:208] = (blocks[:, 192:208] & 0x3F) - 32 & 0xFF
        blocks[:, 208:210] = np.float16([a / (16 * 32)]).view(np.uint8)
    return blocks


def data(rng, shape, kind):
    """The tensor's bytes: f32 values, or quantised blocks as uint8 [..., row bytes]."""
    a = 1.0 / np.sqrt(shape[-1])
    if kind == "1":
        return np.ones(shape, np.float32)
    if kind == "f" or kind == Q.F16:
        return rng.uniform(-a, a, shape).astype(np.float32 if kind == "f" else np.float16)
    if kind in (Q.Q4_K, Q.Q6_K):
        return k_blocks(rng, int(np.prod(shape)) // 256, kind, a).reshape(*shape[:-1], -1)
    nb = int(np.prod(shape)) // 32
    amax = a * rng.random(nb, np.float32) ** (1 / 32)  # the largest |x| of 32 uniform values
    if kind == Q.Q8_0:  # f16 d = amax/127; int8 q in [-127, 127]
        d, q = amax / 127, rng.integers(-127, 128, (nb, 32), np.int8).view(np.uint8)
    else:  # f16 d = -+amax/8 (ggml's sign: that of the largest value); nibbles 0..15, value d*(q-8)
        d, q = amax / 8 * rng.choice(np.float32([-1, 1]), nb), rng.integers(0, 256, (nb, 16), np.uint8)
    blocks = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(nb, 2), q], axis=1)
    return blocks.reshape(*shape[:-1], -1)


w = gguf.GGUFWriter(args.out, s["arch"])
w.add_name(f"random {args.shape} {args.quant}")
w.add_file_type({Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0, Q.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M,
                 Q.F16: gguf.LlamaFileType.MOSTLY_F16}[qtype])
w.add_block_count(n_layer)
w.add_context_length(4096)
w.add_embedding_length(E)
if qwen3:
    w.add_feed_forward_length(6144)
    w.add_expert_feed_forward_length(F)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
else:
    w.add_feed_forward_length(F)  # llama.cpp's "llama" reads the expert width from it
w.add_head_count(N_HEAD)
w.add_head_count_kv(N_HEAD_KV)
w.add_rope_dimension_count(HEAD_DIM)
w.add_rope_freq_base(1000000.0 if qwen3 else 10000.0)
w.add_layer_norm_rms_eps(1e-6 if qwen3 else 1e-5)
w.add_expert_count(X)
w.add_expert_used_count(s["n_expert_used"])
w.add_vocab_size(N_VOCAB)
if args.vocab:
    fields = gguf.GGUFReader(args.vocab).fields
    if bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() != "llama":
        raise SystemExit(f"{args.vocab}: not a sentencepiece (llama) vocabulary")

    def values(key):
        f = fields[key]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(t).decode() for t in values("tokenizer.ggml.tokens")]
    scores = [float(v[0]) for v in values("tokenizer.ggml.scores")]
    types = [int(v[0]) for v in values("tokenizer.ggml.token_type")]
    if len(tokens) != N_VOCAB:
        raise SystemExit(f"{args.vocab}: {len(tokens)} tokens, the shape has {N_VOCAB}")
else:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581w{i}" for i in range(N_VOCAB - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (N_VOCAB - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)]
w.add_tokenizer_model("llama")
w.add_tokenizer_pre("default")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_unk_token_id(0)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_add_bos_token(True)

# tensor infos first, then the data one tensor at a time (never the whole file in memory)
for name, shape, kind in tensors:
    t = Q.F32 if kind in ("1", "f") else kind
    block, size = gguf.GGML_QUANT_SIZES[t]  # shape is in elements (the dtype is not uint8)
    w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) // block * size, raw_dtype=t)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
seeds = np.random.SeedSequence(args.seed).spawn(len(tensors))
for (name, shape, kind), seed in zip(tensors, seeds):
    w.write_tensor_data(data(np.random.default_rng(seed), shape, kind))
w.close()
