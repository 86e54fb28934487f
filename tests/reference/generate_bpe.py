#!/usr/bin/env python3
"""Reference ids for the byte-level BPE tokenizer conformance test.

For each real tokenizer in tests/fixtures/tokenizers/<name>/ (tokenizer.json copied from
the package named in its SOURCE file), encodes a fixed corpus with the Hugging Face
`tokenizers` library and writes tests/fixtures/tokenizers/<name>/cases.json:

    [{"name", "text" | "bytes_hex", "ids", "decoded", "lossless"}, ...]

- ids: Tokenizer.encode(text, add_special_tokens=False).ids (no BOS/EOS: the engine's
  encode() does not add them either);
- decoded: Tokenizer.decode(ids, skip_special_tokens=True) (special tokens decode to
  nothing in the engine, as control tokens do);
- lossless: decoded == text;
- ids_as_text: the ids with special tokens encoded as text (Tokenizer.encode_special_tokens),
  added tokens that look special (`<|...|>`, `<｜...｜>`, `<pad>`, `<mask>`, `<unused...>`, as
  llama.cpp's converter reads them, and `<fim_...>`, `<fim-...>`) marked special first: the engine's default for user text.

Invalid UTF-8: the library takes Python str, so it cannot be given ill-formed bytes. A
case with "bytes_hex" holds raw bytes; the reference encodes
bytes.decode("utf-8", errors="replace") (each maximal ill-formed subsequence becomes one
U+FFFD), and the engine must produce the same ids from the raw bytes.

Usage: /work/refenv/bin/python tests/reference/generate_bpe.py   (requirements-bpe.txt)
Also writes nothing else; the benchmark text is made by bench_bpe.py.
"""

import json
import os
import sys

from tokenizers import Tokenizer
import tokenizers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tokenizers")
NAMES = ["qwen3", "deepseek-v3", "llama2"]

PYTHON = '''import math
from collections import defaultdict


def softmax(values: list[float]) -> list[float]:
    """Return the softmax of a list of floats."""
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


class Counter(defaultdict):
    def __init__(self):
        super().__init__(int)

    def most_common(self, n=3):
        return sorted(self.items(), key=lambda kv: -kv[1])[:n]
'''

CPP = '''#include <vector>
#include <cstdint>

template <typename T>
struct span_view {
    const T* data_ = nullptr;
    std::size_t size_ = 0;
};

int main(int argc, char** argv) {
    std::vector<int32_t> ids{1, 2, 3};
    for (auto& x : ids) { x <<= 2; x |= 0x0F; }
    return ids.size() > 2 ? 0 : -1; // done
}
'''

RUST = '''use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct Merge { rank: u32, id: u32 }

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut m: HashMap<(u32, u32), Merge> = HashMap::new();
    m.insert((1, 2), Merge { rank: 0, id: 3 });
    println!("{:?}", m.get(&(1, 2)));
    Ok(())
}
'''

JS = '''export async function fetchAll(urls) {
  const results = await Promise.all(urls.map(u => fetch(u).then(r => r.json())));
  return results.filter(Boolean).reduce((acc, x) => ({ ...acc, [x.id]: x }), {});
}
// arrow => functions, template `${literals}` and regex /\\d+/g
'''

GO = '''package main

import (
\t"fmt"
\t"strings"
)

func main() {
\tnames := []string{"alpha", "beta"}
\tfor i, n := range names {
\t\tfmt.Printf("%d: %s\\n", i, strings.ToUpper(n))
\t}
}
'''

TEXTS = [
    ("empty", ""),
    ("prose", "The quick brown fox jumps over the lazy dog. It's what they'd done, isn't it? WE'LL SEE."),
    ("python", PYTHON),
    ("cpp", CPP),
    ("rust", RUST),
    ("javascript", JS),
    ("go_tabs", GO),
    ("json", '{"model": "qwen3", "max_tokens": 128, "stop": ["\\n\\n"], "temperature": 0.2}'),
    ("shell", "for f in *.json; do\n  jq '.ids | length' \"$f\" 2>/dev/null || echo \"bad: $f\" >&2\ndone\n"),
    ("spaces_runs", "a  b   c    d          e\n    indented\n\n\n  \n trailing   "),
    ("tabs", "\tone\n\t\ttwo\n\t \t mixed\t\t"),
    ("newlines", "\n\n\r\nwindows\r\nline\rold mac\n"),
    ("leading_space", " leading space"),
    ("only_spaces", "     "),
    ("digits_long", "3141592653589793238462643383279502884197169399375105820974944592307816406286"),
    ("numbers_mixed", "v1.2.3 0x7fffffff 1e-9 -42 3,000,000 12:30 2024-06-01 ①②③ ٣٤٥ १२३"),
    ("cjk_chinese", "机器学习是人工智能的一个分支。我们今天写代码吧！"),
    ("cjk_japanese", "これは日本語のテキストです。カタカナとひらがな、そして漢字。"),
    ("cjk_korean", "안녕하세요, 세계! 한국어 텍스트입니다."),
    ("emoji", "ship it 🚀🔥 done ✅ 😀😃😄"),
    ("emoji_zwj", "family 👨‍👩‍👧‍👦 flag 🏳️‍🌈 skin 👍🏽 keycap 1️⃣"),
    ("combining", "e\u0301 a\u0308 n\u0303 Z\u0335\u0327a\u0336l\u0334g\u0337o café naïve"),
    ("nfc_nfd", "Ame\u0301lie vs Amélie; \u212b vs \u00c5; \ufb01 ligature"),
    ("arabic", "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣."),
    ("hindi", "नमस्ते दुनिया, यह हिंदी पाठ है।"),
    ("greek_cyrillic", "Αλφάβητο και кириллица: Привет, мир!"),
    # stacked diacritics, precomposed and decomposed
    ("vietnamese", "Cửa Việt, Đà Nẵng và Thừa Thiên Huế; tiếng Việt có dấu: ắ ặ ẳ ẵ ấ ầ ẩ ẫ ậ"),
    ("vietnamese_nfd", "Vie\u0323\u0302t Nam, Đa\u0300 Na\u0306\u0303ng"),
    ("thai_hebrew_turkish", "ภาษาไทย שלום עולם İstanbul'da ığdır şehir"),
    ("punctuation", "!!! ??? ... --- ___ ((())) [[]] {{}} <<>> ;;; ::: ''' \"\"\" ``` ~~~"),
    ("mixed_case_contractions", "I'M HE'S they've You'll we'D it'S"),
    ("url_path", "https://example.com/a/b?c=d&e=f#frag /usr/local/lib/libcolibri.so.1"),
    ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u200bg"),
    ("control_chars", "bell\x07 esc\x1b[0m nul-free del\x7f"),
    ("fim_qwen", "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>"),
    ("special_qwen", "<|im_start|>user\nhi<|im_end|><|endoftext|><think>\n</think>"),
    ("fim_deepseek", "<｜fim▁begin｜>int x = <｜fim▁hole｜>;\n<｜fim▁end｜>"),
    ("special_deepseek", "<｜begin▁of▁sentence｜>User: hi<｜end▁of▁sentence｜>"),
    ("special_llama", "<s>[INST] hello [/INST]</s> <unk>"),
    ("special_adjacent", "x<s>y</s>z<|endoftext|>w"),
    ("long_word", "supercalifragilisticexpialidocious_" * 8),
    ("long_line", "abcdefghijklmnopqrstuvwxyz0123456789" * 40),
    ("sentencepiece_marker", "▁already▁marked ▁ text"),
    # Words of more than 64 symbols take the heap merge loop rather than the scan.
    ("very_long_words", "a" * 300 + " " + "xyz" * 100 + " " * 200 + "end"),
]

INVALID = [
    ("invalid_lone_continuation", b"abc\x80def"),
    ("invalid_truncated", b"caf\xc3 \xe2\x82 end\xf0\x9f\x98"),
    ("invalid_overlong_surrogate", b"\xc0\xaf \xed\xa0\x80 \xf5\x80 \xff ok"),
]


def looks_special(s):
    wrapped = lambda a, b: len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b)
    return s in ("<pad>", "<mask>") or wrapped("<|", "|>") or wrapped("<\uff5c", "\uff5c>") or wrapped("<unused", ">") \
        or wrapped("<fim_", ">") or wrapped("<fim-", ">")


def as_text_tokenizer(path):
    """The tokenizer with look-special added tokens marked special, encoding specials as text."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    for a in j["added_tokens"]:
        a["special"] = a["special"] or looks_special(a["content"])
    tok = Tokenizer.from_str(json.dumps(j))
    tok.encode_special_tokens = True
    return tok


def main():
    for name in NAMES:
        path = os.path.join(ROOT, name, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        as_text = as_text_tokenizer(path)
        cases = []
        for case_name, text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=True)
            cases.append({"name": case_name, "text": text, "ids": ids, "decoded": decoded,
                          "lossless": decoded == text,
                          "ids_as_text": as_text.encode(text, add_special_tokens=False).ids})
        for case_name, raw in INVALID:
            text = raw.decode("utf-8", errors="replace")
            ids = tok.encode(text, add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=True)
            cases.append({"name": case_name, "bytes_hex": raw.hex(), "ids": ids, "decoded": decoded,
                          "lossless": False,
                          "ids_as_text": as_text.encode(text, add_special_tokens=False).ids})
        out = os.path.join(ROOT, name, "cases.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"generator": "tests/reference/generate_bpe.py",
                       "tokenizers_version": tokenizers.__version__,
                       "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_lossless = sum(c["lossless"] for c in cases)
        print(f"{name}: {len(cases)} cases ({n_lossless} lossless) -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
