#!/bin/sh
# Runs the Neovim client's end-to-end test in headless Neovim. Exits 77 (skipped) when
# nvim is not installed. Environment: COLIBRID, COLIBRI_WORKER, COLIBRI_MODEL.
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v nvim >/dev/null 2>&1; then
  echo "skipped: nvim not found (Debian: apt-get install neovim)"
  exit 77
fi
exec timeout 90 nvim --headless -u NONE -i NONE -n --cmd "set rtp^=$here/.." -c "luafile $here/test_plugin.lua"
