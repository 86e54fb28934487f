#!/usr/bin/env bash
# colibri and colibri-convert as a user runs them: exit codes, what goes to stdout vs stderr.
set -u
bin="$1"; model="$2"; fixtures="$3"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; passed=0
check() { # description, then a command that must succeed
  local what="$1"; shift
  if "$@"; then passed=$((passed + 1)); else echo "FAILED: $what" >&2; fail=$((fail + 1)); fi
}

"$bin/colibri" --help >"$tmp/out" 2>&1; check "--help exits 0" test $? -eq 0
check "--help lists --max_tokens" grep -q -- "--max_tokens" "$tmp/out"

"$bin/colibri" --model "$tmp/missing.colibri" --prompt x >"$tmp/out" 2>"$tmp/err"; rc=$?
check "missing model exits 1" test $rc -eq 1
check "missing model is named" grep -q "missing.colibri" "$tmp/err"
check "nothing on stdout after an error" test ! -s "$tmp/out"

"$bin/colibri" --model "$model" --prompt x --device cuda:0 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "cuda:0 refused with status 1" test $rc -eq 1
check "cuda:0 refusal explains itself" grep -qiE "cuda|gpu" "$tmp/err"

"$bin/colibri" --model "$model" --prompt x --device tpu >/dev/null 2>"$tmp/err"; rc=$?
check "unknown device refused" test $rc -eq 1

"$bin/colibri" --model "$model" --prompt "def add(a, b):" --max_tokens 8 --temperature 0 >"$tmp/a" 2>"$tmp/err"; rc=$?
check "greedy run exits 0" test $rc -eq 0
check "completion on stdout" test -s "$tmp/a"
check "timings on stderr" grep -q "generated:" "$tmp/err"
check "prompt not echoed on stdout" bash -c "! grep -q 'def add' '$tmp/a'"
"$bin/colibri" --model "$model" --prompt "def add(a, b):" --max-tokens 8 --temperature 0 --stream >"$tmp/b" 2>/dev/null
check "dashed spelling and --stream give the same greedy text" cmp -s "$tmp/a" "$tmp/b"

# COLIBRI_CPU_KERNELS picks a kernel table the CPU supports, and refuses one it does not
COLIBRI_CPU_KERNELS=scalar "$bin/colibri" --model "$model" --prompt "def add(a, b):" --max_tokens 8 --temperature 0 >/dev/null 2>"$tmp/err"; rc=$?
check "COLIBRI_CPU_KERNELS=scalar runs" test $rc -eq 0
check "the scalar table is named on stderr" grep -q "cpu/scalar" "$tmp/err"
COLIBRI_CPU_KERNELS=avx9000 "$bin/colibri" --model "$model" --prompt x >"$tmp/out" 2>"$tmp/err"; rc=$?
check "an unknown kernel table is refused with status 1" test $rc -eq 1
check "the refusal names the variable and what the CPU supports" grep -q "COLIBRI_CPU_KERNELS='avx9000'.*supports: .*scalar" "$tmp/err"

"$bin/colibri" --model "$model" --tokens 1,5,9,200 --dump-logits "$tmp/logits.bin" >/dev/null 2>&1; rc=$?
check "dump-logits exits 0" test $rc -eq 0
vocab=$(grep -o '"n_vocab": *[0-9]*' "$fixtures/llama/expected.json" | grep -o '[0-9]*$')
check "dump-logits writes [4][n_vocab] f32" test "$(stat -c %s "$tmp/logits.bin")" -eq $((4 * vocab * 4))
"$bin/colibri" --model "$model" --tokens 1,x --dump-logits "$tmp/l2" >/dev/null 2>"$tmp/err"; rc=$?
check "bad --tokens refused" test $rc -eq 1

"$bin/colibri-convert" >/dev/null 2>&1; rc=$?
check "convert without arguments is a usage error" test $rc -eq 2
mkdir -p "$tmp/foo"
cp "$fixtures/llama/"*.safetensors* "$fixtures/llama/tokenizer.model" "$tmp/foo/"
sed 's/LlamaForCausalLM/FooForCausalLM/' "$fixtures/llama/config.json" >"$tmp/foo/config.json"
"$bin/colibri-convert" --input "$tmp/foo" --output "$tmp/foo.colibri" >/dev/null 2>"$tmp/err"; rc=$?
check "unsupported architecture exits 1" test $rc -eq 1
check "unsupported architecture is named" grep -q "FooForCausalLM" "$tmp/err"
check "no output file after a failed conversion" test ! -e "$tmp/foo.colibri" -a ! -e "$tmp/foo.colibri.partial"

# GGUF input and colibri tokenize: the same ids from the GGUF, the converted file and the
# fixture prompt (prompt_ids of tests/fixtures/llama/expected.json, with BOS)
"$bin/colibri-convert" --input "$fixtures/gguf/llama.gguf" --output "$tmp/g.colibri" --quiet 2>"$tmp/err"; rc=$?
check "GGUF converts" test $rc -eq 0
check "GGUF summary names the copied blocks" grep -q "F32   -> f32" "$tmp/err"
prompt=$'def route(x):\n    return softmax(x)[:2]'
want=$(tr -d ' \n' <"$fixtures/llama/expected.json" | sed 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/')
got_gguf=$("$bin/colibri" tokenize --model "$fixtures/gguf/llama.gguf" --bos --text "$prompt" 2>/dev/null)
got_file=$("$bin/colibri" tokenize --model "$tmp/g.colibri" --bos --text "$prompt" 2>/dev/null)
check "tokenize from a GGUF gives the reference ids" test "$got_gguf" = "$want"
check "tokenize from the converted file gives the same ids" test "$got_file" = "$want"
check "tokenize --decode gives the text back" test "$("$bin/colibri" tokenize --model "$tmp/g.colibri" --decode "$want")" = "$prompt"
"$bin/colibri" tokenize --model "$tmp/g.colibri" --decode 1,x >/dev/null 2>&1; rc=$?
check "tokenize refuses a bad id" test $rc -eq 1

# Text that spells a control token stays text unless --parse-special asks otherwise: the
# Qwen3 vocabulary's <|endoftext|> is 151643, and its <|fim_prefix|> 151659.
qwen3="$fixtures/tokenizers/qwen3/tokenizer.json"
special_text='x = "<|endoftext|><|fim_prefix|>"'
as_text=$("$bin/colibri" tokenize --model "$qwen3" --text "$special_text" 2>/dev/null)
parsed=$("$bin/colibri" tokenize --model "$qwen3" --parse-special --text "$special_text" 2>/dev/null)
check "tokenize keeps <|endoftext|> as text" bash -c "! grep -qE '(^|,)(151643|151659)(,|$)' <<<'$as_text'"
check "tokenize --decode gives the special-looking text back" test "$("$bin/colibri" tokenize --model "$qwen3" --decode "$as_text")" = "$special_text"
check "tokenize --parse-special makes them control tokens" grep -qE '^[0-9,]*,151643,151659,[0-9,]*$' <<<"$parsed"
# colibri: the same prompt is longer in tokens as text than parsed
default_model="$fixtures/../../models/default.colibri"
fim_prompt='x = "<fim_middle><fim_suffix>"'
"$bin/colibri" --model "$default_model" --prompt "$fim_prompt" --max_tokens 1 >/dev/null 2>"$tmp/err_text"
"$bin/colibri" --model "$default_model" --prompt "$fim_prompt" --max_tokens 1 --parse-special >/dev/null 2>"$tmp/err_parsed"
n_text=$(sed -n 's/.*prompt: \([0-9]*\) tokens.*/\1/p' "$tmp/err_text")
n_parsed=$(sed -n 's/.*prompt: \([0-9]*\) tokens.*/\1/p' "$tmp/err_parsed")
check "colibri encodes the prompt's FIM spellings as text ($n_text tokens), --parse-special as tokens ($n_parsed)" \
  test "${n_text:-0}" -gt $(( ${n_parsed:-99} + 10 ))

# colibri-bench --cpu: the CPU named on one line, nothing run
"$bin/colibri-bench" --cpu >"$tmp/cpu" 2>&1; rc=$?
check "colibri-bench --cpu exits 0" test $rc -eq 0
check "colibri-bench --cpu prints one cpu line" test "$(grep -c '^cpu .' "$tmp/cpu")" -eq 1 -a "$(wc -l <"$tmp/cpu")" -eq 1

# colibri-bench: a short run on the test model, its JSON (one decode stretch per 16 tokens
# for each thread count, each with its probe and fraction), and its refusals
"$bin/colibri-bench" --model "$model" --threads 1,2 --reps 1 --prompt-tokens 8 --batch 4 --gen-tokens 32 \
  --bandwidth-mib 16 --json >"$tmp/bench" 2>"$tmp/err"; rc=$?
check "colibri-bench exits 0" test $rc -eq 0
check "colibri-bench reports both thread counts" test "$(grep -o '"threads":[0-9]*' "$tmp/bench" | tr '\n' ' ')" = '"threads":1 "threads":2 '
stretch='\[[0-9]+\.[0-9]+,[0-9]+\.[0-9]+\]'
check "two decode stretches per thread count, each a probe and a fraction" \
  test "$(grep -oE "\"decode_stretches\":\[$stretch,$stretch\]" "$tmp/bench" | wc -l)" -eq 2
check "no stretch read at zero" bash -c "! grep -qE '\[[0-9.]+,0\.0\]|\[0\.0,' '$tmp/bench'"
pick='[0-9]+\.[0-9]+'
check "colibri-bench times the token pick three ways" \
  grep -qE "\"pick_us\":\{\"greedy\":$pick,\"defaults\":$pick,\"top_k_0\":$pick\}" "$tmp/bench"
check "no pick timed at zero" bash -c "! grep -qE '\"(greedy|defaults|top_k_0)\":0\.0[,}]' '$tmp/bench'"
# --ops: the last repetition's decode by operation, in the JSON and as a table
"$bin/colibri-bench" --model "$model" --threads 1 --reps 2 --prompt-tokens 8 --gen-tokens 16 --bandwidth-mib 16 \
  --ops --json >"$tmp/ops" 2>"$tmp/err"; rc=$?
check "colibri-bench --ops exits 0" test $rc -eq 0
us='[0-9]+\.[0-9]+'
for o in 'q/k/v' attention 'attention output' 'feed-forwards' 'LM head' RMSNorms; do
  check "--ops times $o" grep -qE "\{\"op\":\"$o\",\"us_per_token\":$us,\"bytes_per_token\":[1-9][0-9]*,\"calls_per_token\":$us\}" "$tmp/ops"
done
check "--ops reports the time between operations" grep -qE "\"between_us\":-?$us\}" "$tmp/ops"
# the prompt's operations too, and apart: a decode step makes one attention call a layer, the
# prompt (one batch) as many
ms='[0-9]+\.[0-9]+'
for o in 'q/k/v' attention 'feed-forwards' 'LM head'; do
  check "--ops times the prompt's $o" grep -qE "\"prefill_ops\":\{\"ms\":[0-9.]+,\"ops\":\[.*\{\"op\":\"$o\",\"ms\":$ms,\"calls\":[1-9][0-9]*\}.*\],\"between_ms\":-?$ms\}" "$tmp/ops"
done
layers=$(grep -oE '"op":"attention","ms":[0-9.]+,"calls":[0-9]+' "$tmp/ops" | grep -oE '[0-9]+$')
check "the prompt's attention calls counted" test "${layers:-0}" -ge 1
check "decode's attention: one call a layer a token, none of the prompt's" \
  grep -qE "\{\"op\":\"attention\",\"us_per_token\":$us,\"bytes_per_token\":[0-9]+,\"calls_per_token\":$layers\.0\}" "$tmp/ops"
"$bin/colibri-bench" --model "$model" --threads 1 --reps 1 --prompt-tokens 8 --gen-tokens 16 --bandwidth-mib 16 \
  --ops >"$tmp/ops" 2>"$tmp/err"
check "--ops prints its table" grep -qE "^    LM head +[0-9.]+ +[0-9.]+%" "$tmp/ops"
check "--ops prints the prompt's table" grep -qE "^  prefill of 8 tokens by operation" "$tmp/ops"
"$bin/colibri-bench" --model "$model" --ops --device cuda:0 >/dev/null 2>"$tmp/err"; rc=$?
check "colibri-bench: --ops on a GPU refused" test $rc -eq 2
check "colibri-bench: the refusal points to the device profile" grep -q COLIBRI_CUDA_PROFILE "$tmp/err"
"$bin/colibri-bench" --model "$tmp/missing.colibri" --reps 1 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "colibri-bench: a missing model exits 1" test $rc -eq 1
check "colibri-bench: the missing model is named" grep -q "missing.colibri" "$tmp/err"
check "colibri-bench: nothing on stdout after an error" test ! -s "$tmp/out"
"$bin/colibri-bench" --model "$model" --batch 0 >/dev/null 2>"$tmp/err"; rc=$?
check "colibri-bench: --batch 0 refused" test $rc -ne 0
check "colibri-bench: the refusal names --batch" grep -q -- "--batch" "$tmp/err"
# colibri-bench --speculative: the same text with and without drafts, and a text too short
# to time steps of up to nine tokens reported as such (it used to read before the text)
printf 'def f(x):\n    return x\n\ndef g(x):\n    return x\n\ndef h(' >"$tmp/copy.txt"
"$bin/colibri-bench" --model "$model" --speculative "$tmp/copy.txt" --gen-tokens 16 --reps 2 --threads 2 \
  --json-file "$tmp/spec.jsonl" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "colibri-bench --speculative exits 0" test $rc -eq 0
check "colibri-bench --speculative: the same text" grep -q "text         identical" "$tmp/out"
check "colibri-bench --speculative --json-file: one line with the same text" \
  test "$(grep -c '"same_text":true' "$tmp/spec.jsonl")" -eq 1 -a "$(wc -l <"$tmp/spec.jsonl")" -eq 1
"$bin/colibri-bench" --model "$model" --speculative "$tmp/copy.txt" --device cuda:0 >/dev/null 2>"$tmp/err"; rc=$?
check "colibri-bench: --speculative on a GPU refused" test $rc -eq 2
check "colibri-bench: the refusal says it runs on the CPU" grep -q "runs on the CPU" "$tmp/err"
check "colibri-bench --speculative: steps of 2..9 tokens timed" grep -qE "^  a pass of n tokens, against one: 2: [0-9.]+x .* 9: [0-9.]+x" "$tmp/out"
printf 'x' >"$tmp/tiny.txt"
"$bin/colibri-bench" --model "$model" --speculative "$tmp/tiny.txt" --gen-tokens 1 --reps 1 --threads 1 --json \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "colibri-bench --speculative on a one-token text exits 0" test $rc -eq 0
check "colibri-bench --speculative on a one-token text times no steps" grep -q '"pass_ms":\[\]' "$tmp/out"

echo "$passed passed, $fail failed"
[ $fail -eq 0 ]
