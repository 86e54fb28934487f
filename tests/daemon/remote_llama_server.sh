#!/bin/sh
# colibrid --backend openai against real llama-server processes (llama.cpp's, built by
# scripts/compare/llamacpp-tool from the PyPI source package) on SmolLM2-135M
# (scripts/fetch-smollm2): streaming, a deadline that closes the upstream request, one of
# two upstreams killed, both killed (unavailable), and recovery when one returns.
# Usage: remote_llama_server.sh SOURCE_DIR BUILD_DIR     (label slow: builds llama-server)
set -eu
src=$1 build=$2
cache="${COLIBRI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/colibri}/smollm2"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -s "$gguf" ] || "$src/scripts/fetch-smollm2" "$build" >&2
server=$(cd "$src" && COLIBRI_LLAMACPP_BUILD="${COLIBRI_LLAMACPP_BUILD:-$build/llamacpp}" scripts/compare/llamacpp-tool llama-server)
case "$server" in /*) ;; *) server="$src/$server" ;; esac
tmp=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$tmp/colibrid.log" ] && tail -20 "$tmp/colibrid.log" >&2; exit 1; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
              echo $((20000 + $$ % 20000 + $1)); }
start_server() { # PORT -> pid in $started
  "$server" -m "$gguf" --host 127.0.0.1 --port "$1" -t 1 -c 2048 --parallel 1 >"$tmp/server-$1.log" 2>&1 &
  started=$!
  pids="$pids $started"
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "llama-server on port $1 did not come up"
}
client() { "$build/bin/colibri-client" --socket "$tmp/colibri.sock" "$@"; }

a=$(free_port 1); b=$(free_port 2)
start_server "$a"; pid_a=$started
start_server "$b"; pid_b=$started
"$build/bin/colibrid" --backend openai --upstream "http://127.0.0.1:$a" --upstream "http://127.0.0.1:$b" \
  --socket "$tmp/colibri.sock" --log-level debug 2>"$tmp/colibrid.log" &
pids="$pids $!"
for _ in $(seq 100); do client health >/dev/null 2>&1 && break; sleep 0.1; done

# 1. Streaming: the pieces are llama-server's greedy completion.
out=$(client --max_tokens 24 --temperature 0 'def fibonacci(n):') || fail "no completion"
[ -n "$out" ] || fail "an empty completion"
want=$(curl -sf "http://127.0.0.1:$a/v1/completions" -d '{"prompt":"def fibonacci(n):","max_tokens":24,"temperature":0}' |
       python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")')
[ "$out" = "$want" ] || fail "the completion differs from llama-server's own: '$out' vs '$want'"
echo "ok: streamed $(printf %s "$out" | wc -c) bytes, as llama-server answers"

# 2. A deadline ends a long completion and closes its upstream request: the next is served at once.
start=$(date +%s%N)
client --max_tokens 1500 --temperature 1 --timeout 300 'Once upon a time' >/dev/null 2>&1 && fail "the deadline did not end it"
client --max_tokens 4 --temperature 0 'x = ' >/dev/null || fail "no completion after a deadline"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt 4000 ] || fail "the upstream went on generating after the deadline ($ms ms)"
echo "ok: deadline, then served again within $ms ms"

# 3. One of two upstreams killed: every request is still served.
kill "$pid_a"; wait "$pid_a" 2>/dev/null || true
for i in 1 2 3 4; do client --max_tokens 4 --temperature 0 "v$i = " >/dev/null || fail "request $i with one upstream killed"; done
echo "ok: served with one upstream killed"

# 4. Both killed: unavailable, with the reason; then one returns and serves.
kill "$pid_b"; wait "$pid_b" 2>/dev/null || true
err=$(client --json --max_tokens 4 'y = ' 2>&1) && fail "served with no upstream"
echo "$err" | grep -q '"code":"unavailable"' || fail "not unavailable: $err"
start_server "$a"
sleep 1
for _ in $(seq 40); do client --max_tokens 4 --temperature 0 'z = ' >/dev/null 2>&1 && break; sleep 0.5; done
client --max_tokens 4 --temperature 0 'w = ' >/dev/null || fail "no recovery when an upstream returned"
echo "ok: unavailable without upstreams, recovered when one returned"
