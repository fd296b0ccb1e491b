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
      "install.sh: unknown argument 'gpu' (use: bash scripts/install.sh [cpu|cuda12|tpu] [test] [vllm])"]


def test_vllm_goes_into_a_venv_of_its_own_with_the_targets_requirements(tmp_path):
  """`vllm`: the main install as without it, then vLLM's pinned set (vllm-cpu on cpu, vllm on cuda12)
  in its own venv, the torch companions that break its import removed; none for tpu."""
  python = _fake_python(tmp_path, f"cpu {JAX} {JAX}")
  plain = _dry_run("test", python=python).stdout.splitlines()
  for target, requirements in (("cpu", "requirements-vllm-cpu.txt"), ("cuda12", "requirements-vllm-cuda.txt")):
    out = _dry_run(target, "test", "vllm", python=python)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-4] == "pip install --no-deps -e ." and lines[-3].startswith("venv ")
    assert lines[-2:] == [f"vllm pip install -r {requirements}", "vllm pip uninstall -y torchvision torchaudio torchcodec"]
    if target == "cpu":
      assert lines[2:-3] == plain[2:]  # the main environment gets what it gets without vllm
  env_venv = _dry_run("vllm", python=python)
  assert "vllm pip install -r requirements-vllm-cpu.txt" in env_venv.stdout
  out = _dry_run("tpu", "vllm", python=python)
  assert out.returncode == 2 and "no vllm for tpu" in out.stderr
  # The pinned sets exist, pin vLLM and torch exactly, and are not part of the default install.
  for name, package in (("requirements-vllm-cpu.txt", "vllm-cpu"), ("requirements-vllm-cuda.txt", "vllm")):
    pins = dict(l.split("==") for l in (REPO / name).read_text().splitlines() if "==" in l and not l.startswith("#"))
    assert package in pins and "torch" in pins and "transformers" in pins, name
  assert "vllm" not in (REPO / "requirements.txt").read_text() + (REPO / "requirements-test.txt").read_text()
