"""The full loop under jax.distributed: two processes x 4 simulated CPU devices run two steps of the
tiny coding config through `python -m compassplay_jax.main` (one step, then a resume for the second)
and end with the same parameters as one process with 8 devices. Each process feeds its own rows of
every batch (global arrays from process-local data); only process 0 writes metrics."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

REPO = pathlib.Path(__file__).resolve().parents[1]
ARGS = ["--config=configs/coding.py:tiny", "--config.sandbox.num_workers=1", "--config.compile_cache_dir="]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_DISABLE_MOST_OPTIMIZATIONS="1", PYTHONPATH=str(REPO))
  env.update(extra)
  return env


def _two_processes(workdir, steps: int):
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, "-m", "compassplay_jax.main", *ARGS, f"--config.steps={steps}",
                             f"--workdir={workdir}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True,
                            env=_env(4, COMPASSPLAY_COORDINATOR_ADDRESS=f"localhost:{port}",
                                     COMPASSPLAY_NUM_PROCESSES="2", COMPASSPLAY_PROCESS_ID=str(i)))
           for i in range(2)]
  outs = [p.communicate(timeout=2400)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-5000:]
  return outs


def _params(workdir, step):
  from compassplay_jax.model_setup import build_model, restore_params
  from tests.test_selfplay import _config
  model, _ = build_model(_config("coding:tiny"))
  return restore_params(pathlib.Path(workdir) / "checkpoints", step, nnx.split(model)[1])


@pytest.mark.slow
def test_two_processes_with_a_resume_match_one_process_with_8_devices(tmp_path):
  multi, single = tmp_path / "multi", tmp_path / "single"
  outs = _two_processes(multi, steps=1)
  assert "mesh data=1, fsdp=8, tensor=1" in outs[0]
  outs = _two_processes(multi, steps=2)
  assert "resumed from step 1" in outs[0] and "resumed from step 1" in outs[1]
  one = subprocess.run([sys.executable, "-m", "compassplay_jax.main", *ARGS, "--config.steps=2",
                        f"--workdir={single}"], cwd=REPO, env=_env(8), capture_output=True, text=True, timeout=2400)
  assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]

  records = [json.loads(line) for line in (multi / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [1, 2]  # process 0 wrote each step once
  want = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
  for got_r, want_r in zip(records, want):
    for name in ("reward/proposer", "reward/solver", "train/loss", "rows"):
      assert got_r[name] == pytest.approx(want_r[name], rel=1e-5, abs=1e-6), name
  got_p, want_p = _params(multi, 2), _params(single, 2)
  moved = _params(single, 1)
  for a, b, c in zip(jax.tree.leaves(got_p), jax.tree.leaves(want_p), jax.tree.leaves(moved)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  assert any(np.abs(np.asarray(b) - np.asarray(c)).max() > 0 for b, c in zip(jax.tree.leaves(want_p),
                                                                               jax.tree.leaves(moved)))
