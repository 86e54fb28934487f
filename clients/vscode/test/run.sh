#!/bin/sh
# Runs test files of the VS Code extension with Node's test runner (Node >= 18). Exits 77
# (skipped) when node is not installed. Usage: run.sh test/NAME.test.js...
# Environment: COLIBRID, COLIBRI_WORKER, COLIBRI_MODEL (defaults: the cpu preset's build).
cd "$(dirname "$0")/.." || exit 1
if ! command -v node >/dev/null 2>&1; then
  echo "skipped: node not found (Debian: apt-get install nodejs)"
  exit 77
fi
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
  echo "skipped: node $(node --version) is older than 18"
  exit 77
fi
exec node --test "$@"
