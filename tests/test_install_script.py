"""scripts/install.sh targets (dry run: the pip commands it would run)."""
import os
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]
JAX = next(l.split("==")[1] for l in (REPO / "requirements.txt").read_text().splitlines() if l.startswith("jax=="))


def _dry_run(*args, python=None):
  env = dict(os.environ, COMPASSPLAY_INSTALL_DRY_RUN="1")
  if python:
    env["PYTHON"] = str(python)
  return subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), *args], env=env, capture_output=True,
                        text=True, timeout=120)


def _fake_python(tmp_path, report):
  """A stand-in interpreter whose jax reports `report` ("<backend> <jax> <jaxlib>")."""
  path = tmp_path / "python"
  path.write_text(f"#!/bin/sh\necho '{report}'\n")
  path.chmod(0o755)
  return path


def test_targets_install_jax_through_its_own_extras(tmp_path):
  cpu_python = _fake_python(tmp_path, f"cpu {JAX} {JAX}")
  expected = {(): f"pip install jax=={JAX} jaxlib=={JAX}", ("cpu",): f"pip install jax=={JAX} jaxlib=={JAX}",
              ("cuda12",): f"pip install jax[cuda12]=={JAX}", ("tpu", "test"): f"pip install jax[tpu]=={JAX}"}
  for args, jax_line in expected.items():
    out = _dry_run(*args, python=cpu_python)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == jax_line, (args, lines)
    requirements = pathlib.Path(lines[1].split("-r ")[1].split()[0])
    assert lines[-1] == "pip install --no-deps -e ."
    assert not requirements.exists()  # the filtered file is temporary


def test_an_accelerator_jax_is_kept(tmp_path):
  out = _dry_run("cpu", "test", python=_fake_python(tmp_path, "gpu 0.9.1 0.9.1"))
  assert out.returncode == 0, out.stderr
  assert "keeping the installed jax 0.9.1 (backend gpu)" in out.stdout
  pip_lines = [l for l in out.stdout.splitlines() if l.startswith("pip install")]
  assert not any("jax==" in l or "jaxlib==" in l or "jax[" in l for l in pip_lines)
  assert " -c " in pip_lines[0]  # the others are installed with jax/jaxlib pinned to what is there


def test_unknown_target_is_one_line():
  out = _dry_run("gpu")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "install.sh: unknown argument 'gpu' (use: bash scripts/install.sh [cpu|cuda12|tpu] [test])"]
