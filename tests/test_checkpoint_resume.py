"""Resume after SIGKILL: 4 steps straight == 2 steps, kill -9, resume to 4 (bitwise on CPU).

Runs tests/resume_driver.py: a straight run, a run killed while it sleeps after step 2's committed
checkpoint, and a run that SIGKILLs itself while step 3's (async) save is in flight, which must leave
step 2 usable. The two that die are subprocesses; the straight run and both resumes run in this
process (no interpreter start and imports each).
"""
import os
import pathlib
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from compassplay_jax.infra.checkpoint import CheckpointManager
from tests import resume_driver

DRIVER = pathlib.Path(__file__).with_name("resume_driver.py")
REPO = DRIVER.parents[1]
STEPS = 4
TIMEOUT = 300


@pytest.fixture(scope="module")
def env():
  return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}


def _start(env, directory, *extra):
  return subprocess.Popen([sys.executable, str(DRIVER), "--dir", str(directory), "--steps", str(STEPS), *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _run_here(capsys, directory, *extra) -> str:
  """The driver's main in this process; returns what it printed."""
  capsys.readouterr()
  assert resume_driver.main(["--dir", str(directory), "--steps", str(STEPS), *extra]) == 0
  out = capsys.readouterr().out
  assert f"DONE {STEPS}" in out
  return out


def _final(directory):
  _, params, opt_state, _, _ = resume_driver.initial_state()
  with CheckpointManager(directory, read_only=True) as manager:
    return manager.restore(params=params, opt_state=opt_state)


def _assert_identical(a, b):
  step_a, *trees_a, extra_a = a
  step_b, *trees_b, extra_b = b
  assert step_a == step_b == STEPS
  assert extra_a == extra_b  # task buffers and metrics so far
  for ta, tb in zip(trees_a, trees_b):  # params, opt_state, PRNG key
    ta = jax.tree.map(lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, ta)
    tb = jax.tree.map(lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, tb)
    assert jax.tree.structure(ta) == jax.tree.structure(tb)
    for x, y in zip(jax.tree.leaves(ta), jax.tree.leaves(tb)):
      assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_kill_and_resume_matches_straight_run(tmp_path, env, capsys):
  straight_dir, killed_dir, crashed_dir = tmp_path / "straight", tmp_path / "killed", tmp_path / "crashed"
  # kill -9 after step 2's checkpoint is committed, then resume.
  killed = _start(env, killed_dir, "--pause-after", "2")
  crashed = _start(env, crashed_dir, "--async-save", "--crash-in-save", "3")  # dies mid-save of step 3
  _run_here(capsys, straight_dir, "--async-save")  # async saves must not disturb the run either

  for line in killed.stdout:
    if line.startswith("CHECKPOINTED 2"):
      break
  else:
    pytest.fail(f"driver exited before step 2's checkpoint: {killed.stderr.read()[-3000:]}")
  killed.send_signal(signal.SIGKILL)
  killed.wait(timeout=TIMEOUT)
  assert killed.returncode == -signal.SIGKILL
  assert "RESUMED 2" in _run_here(capsys, killed_dir)

  crashed.wait(timeout=TIMEOUT)
  assert crashed.returncode == -signal.SIGKILL
  with CheckpointManager(crashed_dir, read_only=True) as manager:  # the resumed run below cleans up
    survivor = manager.latest_step()
  assert survivor in (2, 3)  # 3 only if the write happened to commit before the kill
  assert f"RESUMED {survivor}" in _run_here(capsys, crashed_dir)

  want = _final(straight_dir)
  _assert_identical(_final(killed_dir), want)
  _assert_identical(_final(crashed_dir), want)
