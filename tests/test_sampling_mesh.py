"""The continuous engine on 8 simulated devices equals one device's (tests/sampling_mesh_cases.py, in
its own process: the device count is fixed before jax is imported)."""
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_sharded_continuous_engine_matches_one_device():
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PYTHONPATH=str(REPO))
  cmd = [sys.executable, "-m", "pytest", "tests/sampling_mesh_cases.py", "-q", "-x", "-p", "no:cacheprovider",
         "-p", "no:xdist"]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
  assert "5 passed" in proc.stdout, proc.stdout[-2000:]
