#!/usr/bin/env python3
"""Write the K-quant GGUF fixtures (tests/fixtures/gguf/kquant-*.gguf) with llama.cpp itself:
a random-weight Llama of K-quant-sized rows (dim 256, FFN 512, 2 layers, the fixtures'
sentencepiece vocabulary), written in F32 with the `gguf` package, then quantised by
llama.cpp's own quantiser (llama_model_quantize) to Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, IQ4_NL,
Q4_1, Q5_0, Q5_1, Q2_K and Q3_K_M, the files users download. llama.cpp's logits for the llama fixture's prompt are stored beside each
file (and for the F32 original), as kquant-<type>.logits.bin (float32 LE [n_prompt][512]),
and for the Q4_K_M and Q5_K_M llama.cpp makes from the Q6_K file, as
kquant-q6_k-to-<type>.logits.bin.

For the quantiser, kquant-rows.f32.bin holds rows of 1024 values (float32 LE [48][1024]:
Gaussian, heavy-tailed, and sub-blocks of mixed scale and offset) and kquant-rows.<type>.bin
those rows as llama.cpp's ggml_quantize_chunk quantises them (q4_k, q5_k, q6_k).

    build-cpu/llamacpp-venv/bin/pip install gguf==0.19.0 sentencepiece safetensors
    build-cpu/llamacpp-venv/bin/python tests/reference/generate_gguf_kquants.py --fixtures tests/fixtures

(scripts/compare/llamacpp-venv makes that environment: PyPI's llama-cpp-python built from
source.) Fixed seeds: reruns give identical weights; the quantised files are llama.cpp's.
"""

import argparse
import ctypes
import json
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import sentencepiece as spm

from generate_gguf import add_vocab

DIM, FF, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
HEAD_DIM = DIM // HEADS
FTYPES = {"q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
          "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K, "iq4_xs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
          "iq4_nl": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL, "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
          "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0, "q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
          "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K, "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M}


def write_f32(fixtures, path):
    rng = np.random.default_rng(20261203)
    sp = spm.SentencePieceProcessor(model_file=str(fixtures / "llama" / "tokenizer.model"))
    vocab = sp.vocab_size()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("colibri K-quant fixture")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_feed_forward_length(FF)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_vocab(w, sp, 1, 2)

    def mat(name, rows, cols, std):  # [rows, cols] as PyTorch orders it
        w.add_tensor(name, (rng.standard_normal((rows, cols)) * std).astype(np.float32))

    def norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))

    mat("token_embd.weight", vocab, DIM, 1.0)
    for il in range(LAYERS):
        norm(f"blk.{il}.attn_norm.weight")
        mat(f"blk.{il}.attn_q.weight", DIM, DIM, 1.5 / DIM ** 0.5)
        mat(f"blk.{il}.attn_k.weight", KV_HEADS * HEAD_DIM, DIM, 1.5 / DIM ** 0.5)
        mat(f"blk.{il}.attn_v.weight", KV_HEADS * HEAD_DIM, DIM, 1.0 / DIM ** 0.5)
        mat(f"blk.{il}.attn_output.weight", DIM, DIM, 1.0 / DIM ** 0.5)
        norm(f"blk.{il}.ffn_norm.weight")
        mat(f"blk.{il}.ffn_gate.weight", FF, DIM, 1.0 / DIM ** 0.5)
        mat(f"blk.{il}.ffn_up.weight", FF, DIM, 1.0 / DIM ** 0.5)
        mat(f"blk.{il}.ffn_down.weight", DIM, FF, 1.0 / FF ** 0.5)
    norm("output_norm.weight")
    mat("output.weight", vocab, DIM, 3.0 / DIM ** 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


ROWS, COLS = 48, 1024
GGML_TYPES = {"q4_k": (12, 144), "q5_k": (13, 176), "q6_k": (14, 210)}  # ggml type id, bytes per 256


def quantiser_rows():
    rng = np.random.default_rng(20261204)
    gauss = rng.standard_normal((16, COLS))
    heavy = rng.standard_t(3, (16, COLS))
    blocks = rng.standard_normal((16, COLS // 32, 32)) * rng.uniform(0.01, 4.0, (16, COLS // 32, 1))
    blocks += rng.uniform(-2.0, 2.0, (16, COLS // 32, 1)) * (rng.uniform(size=(16, COLS // 32, 1)) < 0.3)
    return np.concatenate([gauss, heavy, blocks.reshape(16, COLS)]).astype(np.float32)


def write_quantiser_rows(out):
    rows = quantiser_rows()
    rows.tofile(out / "kquant-rows.f32.bin")
    ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    for name, (ggml_type, block_bytes) in GGML_TYPES.items():
        dst = np.zeros(ROWS * COLS // 256 * block_bytes, dtype=np.uint8)
        n = ggml.ggml_quantize_chunk(ggml_type, rows.ctypes.data, dst.ctypes.data, 0, ROWS, COLS, None)
        assert n == dst.size, (name, n)
        dst.tofile(out / f"kquant-rows.{name}.bin")


def llamacpp_logits(path, ids):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=1, logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", required=True, type=Path)
    args = ap.parse_args()
    out = args.fixtures / "gguf"
    write_quantiser_rows(out)
    ids = json.loads((args.fixtures / "llama" / "expected.json").read_text())["prompt_ids"]
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "kquant-f32.gguf"
        write_f32(args.fixtures, f32)
        llamacpp_logits(f32, ids).tofile(out / "kquant-f32.logits.bin")
        for name, ftype in FTYPES.items():
            dst = out / f"kquant-{name}.gguf"
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            params.nthread = 1
            rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(dst).encode(), params)
            assert rc == 0, (name, rc)
            llamacpp_logits(dst, ids).tofile(out / f"kquant-{name}.logits.bin")
            types = sorted({t.tensor_type.name for t in gguf.GGUFReader(dst).tensors})
            print(f"{dst.name}: {dst.stat().st_size} bytes, types {', '.join(types)}")
        # the mixes once more from the Q6_K file, as a converter given only that file makes them
        for name in ("q4_k_m", "q5_k_m"):
            dst = Path(tmp) / f"requant-{name}.gguf"
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = FTYPES[name]
            params.nthread = 1
            params.allow_requantize = True
            rc = llama_cpp.llama_model_quantize(str(out / "kquant-q6_k.gguf").encode(), str(dst).encode(), params)
            assert rc == 0, (name, rc)
            llamacpp_logits(dst, ids).tofile(out / f"kquant-q6_k-to-{name}.logits.bin")


if __name__ == "__main__":
    main()
