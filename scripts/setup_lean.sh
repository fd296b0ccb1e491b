#!/usr/bin/env bash
# Sets up Lean proof checking for the Lean setting (docs/lean.md §1): elan, the Lean REPL
# (leanprover-community/repl) and Mathlib at one pinned version, Mathlib's prebuilt cache, then a
# smoke check that proves one Mathlib theorem (and rejects a sorry) through the project's own pool.
#   bash scripts/setup_lean.sh [--dir DIR] [--version TAG] [--dry-run]
#     --dir DIR      where repl/ and mathlib4/ go (default: ./lean-checker)
#     --version TAG  Lean, REPL and Mathlib tag (default v4.15.0, the version SGS pins)
#     --dry-run      print every step, run none
# Needs git, curl and network access once (GitHub, the Mathlib cache). Re-running skips what is there.
# On a cluster, a kimina-lean-server can check proofs instead (docs/lean.md §2b).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
usage="bash scripts/setup_lean.sh [--dir DIR] [--version TAG] [--dry-run]"

LEAN_VERSION="v4.15.0"  # keep equal to docs/lean.md §1 (tests/test_setup_lean_script.py checks)
dir="lean-checker"
dry_run=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) [[ $# -ge 2 ]] || { echo "setup_lean.sh: --dir needs a value (use: $usage)" >&2; exit 2; }; dir="$2"; shift 2 ;;
    --version) [[ $# -ge 2 ]] || { echo "setup_lean.sh: --version needs a value (use: $usage)" >&2; exit 2; }; LEAN_VERSION="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    *) echo "setup_lean.sh: unknown argument '$1' (use: $usage)" >&2; exit 2 ;;
  esac
done
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
[[ -n "$dry_run" ]] || mkdir -p "$dir"
PYTHON="${PYTHON:-python}"
export PATH="$HOME/.elan/bin:$PATH"

# The command as one line, arguments with spaces in single quotes.
show() {
  local out="" arg
  for arg in "$@"; do
    if [[ "$arg" =~ [[:space:]] ]]; then out+=" '${arg//\'/\'\\\'\'}'"; else out+=" $arg"; fi
  done
  printf '%s\n' "${out# }"
}

# Runs a command in a directory; prints it first (only prints it under --dry-run).
step() {
  local where="$1"; shift
  if [[ -n "$dry_run" ]]; then
    echo "+ (cd $where && $(show "$@"))"
  else
    echo "+ (cd $where && $(show "$@"))" >&2
    (cd "$where" && "$@")
  fi
}

clone() {  # clone <url> <path>: the tag LEAN_VERSION, unless a checkout of it is there already
  local url="$1" path="$2"
  if [[ -z "$dry_run" && -d "$path/.git" ]]; then
    local have
    have="$(git -C "$path" describe --tags --exact-match 2>/dev/null || echo unknown)"
    if [[ "$have" != "$LEAN_VERSION" ]]; then
      echo "setup_lean.sh: $path is at '$have', not $LEAN_VERSION (move it away or pass --dir)" >&2
      exit 1
    fi
    echo "setup_lean.sh: $path is already at $LEAN_VERSION"
    return
  fi
  step "$dir" git clone --depth 1 --branch "$LEAN_VERSION" "$url" "$(basename "$path")"
}

# 1. elan, the Lean toolchain manager (lake picks each project's toolchain from its lean-toolchain).
if [[ -n "$dry_run" ]] || ! command -v elan > /dev/null; then
  if [[ -n "$dry_run" ]]; then
    echo "+ curl -sSfL https://elan.lean-lang.org/elan-init.sh | sh -s -- -y --default-toolchain none"
  else
    echo "+ curl -sSfL https://elan.lean-lang.org/elan-init.sh | sh -s -- -y --default-toolchain none" >&2
    curl -sSfL https://elan.lean-lang.org/elan-init.sh | sh -s -- -y --default-toolchain none
  fi
fi

# 2. The REPL at the pinned tag.
clone https://github.com/leanprover-community/repl "$dir/repl"
step "$dir/repl" lake build

# 3. Mathlib at the same tag, its prebuilt .olean files, and a build that finds nothing left to do.
clone https://github.com/leanprover-community/mathlib4 "$dir/mathlib4"
if [[ -n "$dry_run" ]]; then
  echo "+ check that repl/lean-toolchain and mathlib4/lean-toolchain name the same Lean"
elif ! cmp -s "$dir/repl/lean-toolchain" "$dir/mathlib4/lean-toolchain"; then
  echo "setup_lean.sh: repl and mathlib4 pin different Lean versions ($(cat "$dir/repl/lean-toolchain") vs" \
       "$(cat "$dir/mathlib4/lean-toolchain")); use one --version for both" >&2
  exit 1
fi
step "$dir/mathlib4" lake exe cache get
step "$dir/mathlib4" lake build

# 4. Smoke check through the project's pool: Nat.add_comm is accepted, sorry is not.
export COMPASSPLAY_LEAN_REPL="lake env $dir/repl/.lake/build/bin/repl"
export COMPASSPLAY_LEAN_PROJECT="$dir/mathlib4"
smoke='
from compassplay_jax.domains.lean.targets import DEFAULT_HEADER
from compassplay_jax.verifiers.lean_acceptance import check_proofs
from compassplay_jax.verifiers.lean_pool import LeanReplPool
statement = "theorem setup_smoke (a b : ℕ) : a + b = b + a := by"
with LeanReplPool.from_env(num_workers=1, timeout_s=300, memory_limit_mb=16384, header_timeout_s=900) as pool:
  pool.warm_up(DEFAULT_HEADER)
  good, bad = check_proofs(pool, DEFAULT_HEADER, statement, ["\n  exact Nat.add_comm a b", "\n  sorry"])
assert good.ok and not bad.ok, (good, bad)
print("setup_lean.sh: smoke check passed (Nat.add_comm accepted, sorry rejected)")
'
step "$repo" env COMPASSPLAY_LEAN_REPL="$COMPASSPLAY_LEAN_REPL" COMPASSPLAY_LEAN_PROJECT="$COMPASSPLAY_LEAN_PROJECT" \
  "$PYTHON" -c "$smoke"

if [[ -n "$dry_run" ]]; then
  echo "setup_lean.sh: dry run, nothing was changed. After a real run:"
else
  echo "setup_lean.sh: done. For runs and tests:"
fi
cat <<EOF
  export COMPASSPLAY_LEAN_REPL="lake env $dir/repl/.lake/build/bin/repl"
  export COMPASSPLAY_LEAN_PROJECT="$dir/mathlib4"
  python -m compassplay_jax.main --config=configs/lean.py \\
    --config.lean.command="lake env $dir/repl/.lake/build/bin/repl" --config.lean.cwd="$dir/mathlib4"
EOF
