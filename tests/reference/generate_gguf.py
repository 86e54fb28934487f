#!/usr/bin/env python3
"""Write the GGUF conformance fixtures (tests/fixtures/gguf/) from the committed
Hugging Face fixture checkpoints, with the `gguf` package from PyPI.

    python tests/reference/generate_gguf.py --fixtures tests/fixtures [--families deepseek2]

Makes, in <fixtures>/gguf/:
  <family>.gguf      each fixture family as llama.cpp's converter lays it out: GGUF
                     tensor names, dimensions innermost first, experts stacked into 3-D
                     tensors, q/k rows of the llama-family architectures (llama, Mixtral
                     as "llama", granitemoe) permuted for interleaved RoPE, deepseek2's
                     kv_b_proj split into attn_k_b / attn_v_b, the
                     sentencepiece vocabulary as tokenizer.ggml.* ("llama" model). The
                     matrices keep the fixture's own dtype (F32, F16 or BF16), so the
                     converted model must reproduce the fixture's logits exactly.
  llama-<type>.gguf  the llama fixture with its matrices quantised by gguf.quants
                     (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
  quants.gguf        for every element type the converter reads, a [3, 512] tensor of
                     random blocks (scales set to finite values) and "expect.<type>", its
                     dequantisation by gguf.quants in F32: the block layouts, bit for bit.

No network, fixed seeds: reruns give identical bytes.
"""

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import sentencepiece as spm
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

GGUF_ARCH = {"llama": "llama", "mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
             "olmoe": "olmoe", "granite_moe": "granitemoe", "qwen2": "qwen2", "qwen3": "qwen3", "granite": "granite",
             "llama3": "llama", "starcoder2": "starcoder2", "gemma3": "gemma3", "gemma2": "gemma2",
             "deepseek2": "deepseek2"}
PERMUTED = {"llama", "granitemoe", "granite"}  # llama.cpp's converter reorders q/k rows for these
DTYPES = {"float32": Q.F32, "float16": Q.F16, "bfloat16": Q.BF16}
QUANTS = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
READABLE = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS, Q.Q2_K, Q.Q3_K]


def load_tensors(d):
    t = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        t.update({k: v.astype(np.float32) if v.dtype != np.uint16 else v for k, v in load_file(str(f)).items()})
    return t


def load_f32(d):
    """All tensors of a fixture as float32 (bf16 is read through torch)."""
    import torch
    from safetensors.torch import load_file as load_torch
    out = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        for k, v in load_torch(str(f)).items():
            out[k] = v.to(torch.float32).numpy()
    return out


def permute(w, n_head):
    """Hugging Face rotate-half row order -> interleaved pairs, per head (as llama.cpp)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg, rs):
    """Per-pair frequency divisors of llama3 RoPE, as llama.cpp's converter computes them."""
    import math
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi, orig = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < orig / hi:
            out.append(1.0)
        elif wl > orig / lo:
            out.append(factor)
        else:
            smooth = (orig / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gemma_to_gguf(cfg, W):
    """Gemma 2 and 3 as llama.cpp's converter writes them: every norm weight stored as 1 + w."""
    out = [("token_embd.weight", W["model.embed_tokens.weight"], True)]
    norms = [("input_layernorm", "attn_norm"), ("post_attention_layernorm", "post_attention_norm"),
             ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm", "post_ffw_norm"),
             ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_norm", "attn_k_norm")]
    for il in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        for hf, g in norms:
            if p + hf + ".weight" in W:  # Gemma 2 has no q/k norms
                out.append((b + g + ".weight", 1.0 + W[p + hf + ".weight"], False))
        for hf, g in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
            out.append((b + g + ".weight", W[p + f"self_attn.{hf}.weight"], True))
        for g in ("gate", "up", "down"):
            out.append((b + f"ffn_{g}.weight", W[p + f"mlp.{g}_proj.weight"], True))
    out.append(("output_norm.weight", 1.0 + W["model.norm.weight"], False))
    return out


def deepseek2_to_gguf(cfg, W):
    """DeepSeek-V2 as llama.cpp's converter writes it: kv_b_proj split per head into attn_k_b (transposed,
    [n_head, kv_lora_rank, qk_nope]) and attn_v_b ([n_head, v_head_dim, kv_lora_rank]); no q/k permutation."""
    H, nope, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    out = [("token_embd.weight", W["model.embed_tokens.weight"], True)]
    for il in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        a = p + "self_attn."
        out.append((b + "attn_norm.weight", W[p + "input_layernorm.weight"], False))
        out.append((b + "attn_q_a.weight", W[a + "q_a_proj.weight"], True))
        out.append((b + "attn_q_a_norm.weight", W[a + "q_a_layernorm.weight"], False))
        out.append((b + "attn_q_b.weight", W[a + "q_b_proj.weight"], True))
        out.append((b + "attn_kv_a_mqa.weight", W[a + "kv_a_proj_with_mqa.weight"], True))
        out.append((b + "attn_kv_a_norm.weight", W[a + "kv_a_layernorm.weight"], False))
        kv_b = W[a + "kv_b_proj.weight"].reshape(H, nope + dv, -1)
        out.append((b + "attn_k_b.weight", kv_b[:, :nope].transpose(0, 2, 1), True))
        out.append((b + "attn_v_b.weight", kv_b[:, nope:], True))
        out.append((b + "attn_output.weight", W[a + "o_proj.weight"], True))
        out.append((b + "ffn_norm.weight", W[p + "post_attention_layernorm.weight"], False))
        m = p + "mlp."
        if il < cfg["first_k_dense_replace"]:
            for g in ("gate", "up", "down"):
                out.append((b + f"ffn_{g}.weight", W[m + f"{g}_proj.weight"], True))
            continue
        out.append((b + "ffn_gate_inp.weight", W[m + "gate.weight"], True))
        for g in ("gate", "up", "down"):
            out.append((b + f"ffn_{g}_exps.weight",
                        np.stack([W[m + f"experts.{e}.{g}_proj.weight"] for e in range(cfg["n_routed_experts"])]), True))
        for g in ("gate", "up", "down"):
            out.append((b + f"ffn_{g}_shexp.weight", W[m + f"shared_experts.{g}_proj.weight"], True))
    out.append(("output_norm.weight", W["model.norm.weight"], False))
    out.append(("output.weight", W["lm_head.weight"], True))
    return out


def hf_to_gguf(family, cfg, W):
    """(gguf name, f32 array outermost first, is_matrix) in llama.cpp's naming."""
    if family in ("gemma2", "gemma3"):
        return gemma_to_gguf(cfg, W)
    if family == "deepseek2":
        return deepseek2_to_gguf(cfg, W)
    arch = GGUF_ARCH[family]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("token_embd.weight", W["model.embed_tokens.weight"], True)]
    for il in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        out.append((b + "attn_norm.weight", W[p + "input_layernorm.weight"], False))
        if p + "input_layernorm.bias" in W:
            out.append((b + "attn_norm.bias", W[p + "input_layernorm.bias"], False))
        for hf, g in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
            w = W[p + f"self_attn.{hf}.weight"]
            if arch in PERMUTED and hf in ("q_proj", "k_proj"):
                w = permute(w, H if hf == "q_proj" else KV)
            out.append((b + g + ".weight", w, True))
            if p + f"self_attn.{hf}.bias" in W:
                out.append((b + g + ".bias", W[p + f"self_attn.{hf}.bias"], False))
        for n in ("q_norm", "k_norm"):
            if p + f"self_attn.{n}.weight" in W:
                out.append((b + f"attn_{n}.weight", W[p + f"self_attn.{n}.weight"], False))
        out.append((b + "ffn_norm.weight", W[p + "post_attention_layernorm.weight"], False))
        if p + "post_attention_layernorm.bias" in W:
            out.append((b + "ffn_norm.bias", W[p + "post_attention_layernorm.bias"], False))
        if family == "mixtral":
            m = p + "block_sparse_moe."
            E = cfg["num_local_experts"]
            out.append((b + "ffn_gate_inp.weight", W[m + "gate.weight"], True))
            for hf, g in [("w1", "gate"), ("w3", "up"), ("w2", "down")]:
                out.append((b + f"ffn_{g}_exps.weight", np.stack([W[m + f"experts.{e}.{hf}.weight"] for e in range(E)]), True))
        elif family == "granite_moe":
            m = p + "block_sparse_moe."
            I = cfg["intermediate_size"]
            out.append((b + "ffn_gate_inp.weight", W[m + "router.layer.weight"], True))
            win = W[m + "input_linear.weight"]  # [E, 2I, H]: gate rows, then up rows
            out.append((b + "ffn_gate_exps.weight", win[:, :I, :], True))
            out.append((b + "ffn_up_exps.weight", win[:, I:, :], True))
            out.append((b + "ffn_down_exps.weight", W[m + "output_linear.weight"], True))
        elif p + "mlp.gate.weight" in W:
            m = p + "mlp."
            E = cfg["num_experts"]
            out.append((b + "ffn_gate_inp.weight", W[m + "gate.weight"], True))
            for g in ("gate", "up", "down"):
                out.append((b + f"ffn_{g}_exps.weight", np.stack([W[m + f"experts.{e}.{g}_proj.weight"] for e in range(E)]), True))
            if m + "shared_expert.gate_proj.weight" in W:
                for g in ("gate", "up", "down"):
                    out.append((b + f"ffn_{g}_shexp.weight", W[m + f"shared_expert.{g}_proj.weight"], True))
                out.append((b + "ffn_gate_inp_shexp.weight", W[m + "shared_expert_gate.weight"], True))
        elif p + "mlp.c_fc.weight" in W:  # StarCoder2's GELU MLP, with biases
            for hf, g in [("c_fc", "up"), ("c_proj", "down")]:
                out.append((b + f"ffn_{g}.weight", W[p + f"mlp.{hf}.weight"], True))
                out.append((b + f"ffn_{g}.bias", W[p + f"mlp.{hf}.bias"], False))
        else:  # dense MLP
            for g in ("gate", "up", "down"):
                out.append((b + f"ffn_{g}.weight", W[p + f"mlp.{g}_proj.weight"], True))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type") == "llama3":  # llama.cpp's converter writes the divisors as rope_freqs
        out.append(("rope_freqs.weight", llama3_rope_factors(cfg, rs), False))
    out.append(("output_norm.weight", W["model.norm.weight"], False))
    if "model.norm.bias" in W:
        out.append(("output_norm.bias", W["model.norm.bias"], False))
    if "lm_head.weight" in W:
        out.append(("output.weight", W["lm_head.weight"], True))
    return out


def add_vocab(w, sp, bos, eos):
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)


def write_family(fixtures, family, out_path, matrix_type=None):
    d = fixtures / family
    cfg = json.loads((d / "config.json").read_text())
    W = load_f32(d)
    arch = GGUF_ARCH[family]
    H = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
    n_kv, k_len, v_len, n_rot = cfg["num_key_value_heads"], head_dim, head_dim, head_dim
    if family == "deepseek2":  # MLA written as MQA over the compressed kv (one kv head), as llama.cpp's converter
        kvr, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        n_kv, k_len, v_len, n_rot = 1, kvr + rope, kvr, rope
    w = gguf.GGUFWriter(str(out_path), arch)
    w.add_name(f"colibri fixture {family}")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_head_count(H)
    w.add_head_count_kv(n_kv)
    w.add_key_length(k_len)
    w.add_value_length(v_len)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    if family in ("gemma2", "gemma3"):  # as llama.cpp's converter, and the query scale it lacks as attention.scale
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_attention_scale(cfg["query_pre_attn_scalar"] ** -0.5)
        if family == "gemma2":
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        else:
            w.add_uint32("gemma3.attention.sliding_window_pattern", 2)
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
    elif family == "starcoder2":  # LayerNorm; the window as our files record it (llama.cpp writes none)
        w.add_layer_norm_eps(cfg["norm_epsilon"])
        w.add_sliding_window(cfg["sliding_window"])
    else:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    n_expert = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if family in ("qwen2_moe", "qwen3_moe"):
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if family == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if family == "deepseek2":  # norm_topk_prob false: no expert_weights_norm; no gating func: softmax
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(cfg["kv_lora_rank"])
        w.add_key_length_mla(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
        w.add_value_length_mla(cfg["v_head_dim"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    if family in ("granite_moe", "granite"):
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    add_vocab(w, sp, cfg["bos_token_id"], cfg["eos_token_id"])
    native = DTYPES[json.loads((d / "expected.json").read_text())["dtype"]]
    for name, arr, is_matrix in hf_to_gguf(family, cfg, W):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        qt = (matrix_type or native) if is_matrix else Q.F32
        if qt == Q.F32:
            w.add_tensor(name, arr)
        elif qt == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_quants(out_path):
    rng = np.random.default_rng(20250107)
    w = gguf.GGUFWriter(str(out_path), "llama")
    w.add_name("colibri ggml block layouts")
    rows, cols = 3, 512
    for qt in READABLE:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        if qt in (Q.F16, Q.BF16):
            x = rng.standard_normal((rows, cols)).astype(np.float32)
            raw = gguf.quants.quantize(x, qt) if qt == Q.BF16 else x.astype(np.float16).view(np.uint8)
        else:
            raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
            # finite f16 scales: d (and dmin / m) at their offsets in each block
            def put(off, lo, hi, signed):
                v = rng.uniform(lo, hi, size=raw.shape[0]) * (rng.choice([-1, 1], size=raw.shape[0]) if signed else 1)
                raw[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(-1, 2)
            if qt == Q.Q6_K:
                put(208, 0.001, 0.05, True)
            elif qt == Q.Q2_K:
                put(80, 0.001, 0.05, True)
                put(82, 0.001, 0.05, True)
            elif qt == Q.Q3_K:
                put(108, 0.001, 0.05, True)
            else:
                put(0, 0.001, 0.05, True)
                if qt in (Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K):
                    put(2, 0.001, 0.05, True)
            raw = raw.reshape(rows, -1)
        expect = gguf.quants.dequantize(raw, qt).astype(np.float32)
        assert expect.shape == (rows, cols) and np.all(np.isfinite(expect))
        w.add_tensor(qt.name, raw, raw_dtype=qt)
        w.add_tensor("expect." + qt.name, expect)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", required=True, type=Path)
    ap.add_argument("--families", help="comma separated subset: only these <family>.gguf (no llama-<type>, quants)")
    args = ap.parse_args()
    out = args.fixtures / "gguf"
    out.mkdir(exist_ok=True)
    families = args.families.split(",") if args.families else list(GGUF_ARCH)
    for family in families:
        write_family(args.fixtures, family, out / f"{family}.gguf")
    if not args.families:
        for qt in QUANTS:
            write_family(args.fixtures, "llama", out / f"llama-{qt.name.lower()}.gguf", qt)
        write_quants(out / "quants.gguf")
    for p in sorted(out.glob("*.gguf")):
        if not args.families or p.stem in families:
            print(f"{p.name}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
