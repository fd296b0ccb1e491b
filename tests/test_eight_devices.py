"""Every 8-device case, in ONE pytest subprocess with 8 simulated CPU devices.

JAX fixes its device count when it is imported, and this process's jax has one CPU device, so the
cases live in modules without the test_ prefix (the main run does not collect them) and run here,
all in one child pytest process with XLA_FLAGS=--xla_force_host_platform_device_count=8:
  tests/sharding_cases.py       rules and shard shapes, logits / gradients, g_ref and cosines, train
                                steps, greedy sampling, HF loading, cross-mesh restore, memory reports,
                                the FSDP programs' collectives (rows stay on their devices)
  tests/selfplay_mesh_cases.py  a full coding step on two meshes, and the main command on (2, 2, 2)
  tests/sampling_mesh_cases.py  the continuous engine on three meshes, dense and paged
One process imports jax, builds the tiny models and starts the sandbox once, and its programs share
one persistent compile cache (JAX_COMPILATION_CACHE_DIR, tests/conftest.py's .jax_cache unless set):
later cases and the next run load what earlier ones compiled. Each case is reported by name (the
child's JUnit XML), so a failure says which case on which mesh. By hand:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q tests/sharding_cases.py ...
"""
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests import xla_env


# The multi-process tests use every core: kept on one xdist worker, one after another, never side
# by side (pytest.ini: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("multiprocess")

REPO = pathlib.Path(__file__).resolve().parents[1]
# Each case module and the number of cases it must pass: a case lost to a renamed parameter or a
# module-level skip (fewer than 8 devices) fails here instead of passing unseen.
CASES = {"tests/sharding_cases.py": 47, "tests/selfplay_mesh_cases.py": 3, "tests/sampling_mesh_cases.py": 7}
# A hang ends with the child's output (CI's --timeout=1800 bounds the whole test; the cases take ~4-5 min on
# 2 quiet cores, but much longer on a loaded machine).
TIMEOUT_S = 1500


def case_results(junit_xml: pathlib.Path) -> dict[str, tuple[str, str]]:
  """{"tests/x_cases.py::test_name[id]": (outcome, first line of the message)} from pytest's JUnit XML;
  outcome is passed, failed, error or skipped."""
  results = {}
  for case in ET.parse(junit_xml).getroot().iter("testcase"):
    classname = case.get("classname")  # "tests.sharding_cases"; empty for a module that failed to import
    name = f"{classname.replace('.', '/')}.py::{case.get('name')}" if classname else case.get("name")
    outcome, message = "passed", ""
    for tag in ("failure", "error", "skipped"):
      found = case.find(tag)
      if found is not None:
        outcome = {"failure": "failed"}.get(tag, tag)
        text = (found.get("message") or found.text or "").strip()
        message = text.splitlines()[0][:300] if text else ""
        break
    results[name] = (outcome, message)
  return results


@pytest.mark.slow
def test_all_eight_device_cases_in_one_process(tmp_path):
  junit = tmp_path / "cases.xml"
  env = xla_env.cpu_env(8, PYTHONPATH=str(REPO),
                        # The SPMD partitioner still runs; this only skips the slow LLVM optimisation passes.
                        JAX_DISABLE_MOST_OPTIMIZATIONS="1",
                        # Every program to the cache, however fast it compiled: later cases that build the
                        # same program (another Engine, the same mesh and shapes) load it. Alone, 2 quiet
                        # cores: 228 -> 218 s wall, 270 -> 257 CPU-s (docs/testing.md).
                        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".jax_cache"))
  cmd = [sys.executable, "-m", "pytest", *CASES, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
         f"--junitxml={junit}", "--durations=15"]
  try:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired as e:
    out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    pytest.fail(f"the 8-device cases did not finish in {TIMEOUT_S} s:\n{out[-6000:]}")
  tail = proc.stdout[-6000:] + proc.stderr[-3000:]
  print(proc.stdout[-4000:])  # the slowest cases (--durations), shown by pytest -rP
  assert junit.exists(), f"the child pytest wrote no report (exit {proc.returncode}):\n{tail}"
  results = case_results(junit)
  bad = [f"{outcome.upper()} {name}: {message}" for name, (outcome, message) in results.items()
         if outcome != "passed"]
  assert not bad, "8-device cases that did not pass:\n" + "\n".join(bad) + "\n\n" + tail
  passed = {module: sum(name.startswith(module + "::") for name in results) for module in CASES}
  assert passed == CASES, (passed, tail)
  assert proc.returncode == 0, tail
