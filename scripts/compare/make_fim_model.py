"""Writes a random-weight Qwen2 checkpoint of SmolLM2-135M's shape (30 layers, dim 576, 9/3
heads, FFN 1536, tied embeddings; 194M parameters with Qwen's 151,669-token vocabulary) with
a real Qwen tokenizer, whose fill-in-the-middle and repository tokens llama-server's /infill
needs. For timing /infill in colibrid and llama-server on the same weights; what it writes
is noise.

    make_fim_model.py TOKENIZER_JSON OUT_DIR

Needs torch and transformers (tests/reference/requirements.txt)."""
import sys

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

tokenizer_json, out = sys.argv[1], sys.argv[2]
tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
cfg = Qwen2Config(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=4096,
                  tie_word_embeddings=True, rope_theta=10000.0)
torch.manual_seed(0)
Qwen2ForCausalLM(cfg).to(torch.float16).save_pretrained(out)
tok.save_pretrained(out)
