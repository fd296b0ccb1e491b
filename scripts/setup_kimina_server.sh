#!/usr/bin/env bash
# Prepares the real kimina-lean-server to run offline on 127.0.0.1, for the marked test
# tests/test_kimina_real_server.py (docs/testing.md, "The real kimina server"):
#   bash scripts/setup_kimina_server.sh [--dir DIR] [--upstream GIT_DIR]
#     --dir DIR           where the server goes (default: /tmp/compassplay-kimina-server)
#     --upstream GIT_DIR  also upstream's code from a clone of github.com/project-numina/kimina-lean-server
#                         (its HEAD; it is not on PyPI), run with `python -m server`
# then: COMPASSPLAY_KIMINA_SERVER_DIR=DIR python -m pytest -m kimina_server tests/test_kimina_real_server.py
#
# What it takes (docs/lean.md §2b): a Python 3.12 venv (the server's client package fails pydantic on 3.11)
# with kimina-ast-server 2.1.3 (the server users install from PyPI) and fastapi 0.116.1 (newer fastapi
# rejects the server's `FastAPI(logger=...)`); its database client module (Prisma, which downloads an
# engine at import) replaced by a stub, as the database is unused without LEAN_SERVER_DATABASE_URL.
# The test makes the rest: the workspace folders the server expects and a `lake` shim that runs
# `lake env CMD` as CMD with the project's stand-in REPL as CMD. Needs PyPI access once (about 30 s).
set -euo pipefail
usage="bash scripts/setup_kimina_server.sh [--dir DIR] [--upstream GIT_DIR]"
dir="${TMPDIR:-/tmp}/compassplay-kimina-server"
upstream=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) [[ $# -ge 2 ]] || { echo "setup_kimina_server.sh: --dir needs a value (use: $usage)" >&2; exit 2; }; dir="$2"; shift 2 ;;
    --upstream) [[ $# -ge 2 ]] || { echo "setup_kimina_server.sh: --upstream needs a value (use: $usage)" >&2; exit 2; }; upstream="$2"; shift 2 ;;
    *) echo "setup_kimina_server.sh: unknown argument '$1' (use: $usage)" >&2; exit 2 ;;
  esac
done
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
mkdir -p "$dir"

python312="${PYTHON312:-}"
if [[ -z "$python312" ]]; then
  for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python /root/.pyenv/versions/3.12*/bin/python; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      python312="$candidate"; break
    fi
  done
fi
[[ -n "$python312" ]] || { echo "setup_kimina_server.sh: no Python 3.12 found (set PYTHON312=/path/to/python3.12)" >&2; exit 1; }

stub='"""Stub put here by scripts/setup_kimina_server.sh: the real module imports Prisma, which downloads its
query engine at import. The database is only used when LEAN_SERVER_DATABASE_URL is set (it is not)."""
from typing import Any

prisma: Any = None
'

if [[ ! -x "$dir/venv/bin/python" ]]; then
  "$python312" -m venv "$dir/venv"
fi
"$dir/venv/bin/pip" install --quiet --disable-pip-version-check "kimina-ast-server==2.1.3" "fastapi==0.116.1"
site="$("$dir/venv/bin/python" -c 'import os, server; print(os.path.dirname(server.__file__))')"
printf '%s' "$stub" > "$site/prisma_client.py"

if [[ -n "$upstream" ]]; then
  rm -rf "$dir/upstream"
  mkdir -p "$dir/upstream"
  git --git-dir="$upstream" archive HEAD server client 2>/dev/null | tar -x -C "$dir/upstream" \
    || git -C "$upstream" archive HEAD server client | tar -x -C "$dir/upstream"
  printf '%s' "$stub" > "$dir/upstream/server/prisma_client.py"
  git --git-dir="$upstream" rev-parse HEAD > "$dir/upstream/COMMIT" 2>/dev/null \
    || git -C "$upstream" rev-parse HEAD > "$dir/upstream/COMMIT"
fi

"$dir/venv/bin/python" -c 'import server.__version__ as v; print("kimina-ast-server", v.__version__)'
echo "ready: COMPASSPLAY_KIMINA_SERVER_DIR=$dir python -m pytest -m kimina_server tests/test_kimina_real_server.py"
