#!/bin/sh
# Drives llama.cpp's own editor client, llama.vim (unchanged, from llama.cpp's source as
# scripts/fetch-llama-vocab fetches it), in headless Neovim against colibrid's /infill.
# Exits 77 (skipped) when nvim, curl or llama.vim is missing.
# Environment: COLIBRID, COLIBRI_WORKER, COLIBRI_TEST_WORKER, COLIBRI_CLIENT, COLIBRI_MODEL,
# LLAMA_VIM (default: the fetched copy).
here=$(cd "$(dirname "$0")" && pwd)
cache="${COLIBRI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/colibri}/llama-vocab"
LLAMA_VIM="${LLAMA_VIM:-$cache/llama.vim}"
export LLAMA_VIM
for tool in nvim curl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "skipped: $tool not found (Debian: apt-get install neovim curl)"
    exit 77
  fi
done
if [ ! -s "$LLAMA_VIM" ]; then
  echo "skipped: $LLAMA_VIM not found (scripts/fetch-llama-vocab fetches it)"
  exit 77
fi
exec timeout 120 nvim --headless -u NONE -i NONE -n -c "luafile $here/test_llama_vim.lua"
