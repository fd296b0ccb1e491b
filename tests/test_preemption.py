"""Preemption: SIGTERM during a run saves the step it is in, says so in one line and exits 143; the
rerun of the same command continues bit for bit (compassplay_jax/infra/preemption.py, docs/training.md).

The run is the real command line (`python -m compassplay_jax.main`, in this process: tests/main_in_process.py)
on the shared runs' config (tests/shared_runs.py) with 3 steps and checkpoints every 100 steps, so
nothing but the preemption saves before the end. The SIGTERM is sent from inside the process as step 2
begins; the straight run to compare with is the shared one (2 steps, resumed for a third).
"""
import json
import os
import signal

import numpy as np
import pytest

from compassplay_jax.infra.checkpoint import CheckpointManager
from tests.main_in_process import run_main_output
from tests.test_selfplay import _MACHINE_METRICS, _state_at

STEPS = 3
EXIT_CODE = 143  # a preempted run's exit status (docs/training.md, "Preemption")


class _KilledBySigterm(BaseException):
  """What SIGTERM does to a process that does not handle it, in a form the test can survive."""


def _die(signum, frame):
  raise _KilledBySigterm


@pytest.mark.slow
@pytest.mark.xdist_group("coding_tiny_runs")
def test_sigterm_saves_the_step_and_the_rerun_matches_a_straight_run(coding_tiny_runs, tmp_path, monkeypatch,
                                                                      capsys):
  from compassplay_jax.selfplay import step as step_lib
  from tests import shared_runs
  workdir = tmp_path / "run"
  args = ["--config=configs/coding.py:tiny", f"--config.steps={STEPS}", "--config.checkpoint.every_steps=100",
          f"--config.train.kl_coef={shared_runs.KL_COEF}", f"--workdir={workdir}"]
  run_step, sent = step_lib.run_step, []

  def sigterm_at_step_2(setting, engine, params, opt_state, step, *rest, **kwargs):
    if step == 2 and not sent:
      sent.append(step)
      os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would: the step goes on
    return run_step(setting, engine, params, opt_state, step, *rest, **kwargs)

  monkeypatch.setattr(step_lib, "run_step", sigterm_at_step_2)
  monkeypatch.chdir(shared_runs.REPO)
  previous = signal.signal(signal.SIGTERM, _die)  # the default action (death), survivable
  try:
    try:
      code, out, err = run_main_output(args, capsys)
    except _KilledBySigterm:
      code, out, err = "killed by SIGTERM", capsys.readouterr().out, ""
    assert signal.getsignal(signal.SIGTERM) is _die, "the run left its SIGTERM handler installed"
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert sent == [2]
  with CheckpointManager(workdir / "checkpoints", read_only=True) as manager:
    saved = manager.all_steps()
  assert (code, saved) == (EXIT_CODE, [2]), f"{code}, checkpoints {saved}:\n{out[-2000:]}{err[-2000:]}"
  lines = [l for l in out.splitlines() if "preempted (" in l]
  assert lines == [f"[compassplay] preempted (SIGTERM): saved step 2 to {workdir / 'checkpoints'}; "
                   "rerun the same command to resume"], out[-2000:]
  logged = [json.loads(l)["step"] for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert logged == [1, 2]  # the preempted step's metrics line was written

  code, out, err = run_main_output(args, capsys)  # the rerun
  assert code == 0, err[-3000:]
  assert "resumed from step 2" in out
  assert json.loads((workdir / "summary.json").read_text())["resumed_from"] == 2

  config = shared_runs.shared_config()
  config.steps = STEPS
  arrays_a, extra_a = _state_at(coding_tiny_runs.straight, config, STEPS)
  arrays_b, extra_b = _state_at(workdir, config, STEPS)
  for a, b in zip(arrays_a, arrays_b, strict=True):  # params, optimizer state, PRNG key
    np.testing.assert_array_equal(a, b)
  assert extra_a == extra_b  # the task buffers, the step
  lines = [[{k: v for k, v in json.loads(l).items() if not k.startswith(_MACHINE_METRICS)}
            for l in (d / "metrics.jsonl").read_text().splitlines()] for d in (coding_tiny_runs.straight, workdir)]
  assert [l["step"] for l in lines[1]] == [1, 2, 3]
  assert lines[0] == lines[1]


def test_the_handler_only_records_the_signal_and_is_put_back():
  """One process: a SIGTERM sets the flag (should_stop), a second goes to the previous handler, close
  restores it; nothing is asked of the multi-process sync point."""
  from compassplay_jax.infra import preemption
  calls = []
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
  try:
    asked = []
    with preemption.Watcher(lambda step: asked.append(step) or True) as watch:
      assert signal.getsignal(signal.SIGTERM) == watch._handle
      assert not watch.should_stop(1)
      signal.raise_signal(signal.SIGTERM)
      assert watch.should_stop(2) and watch.reason == "SIGTERM" and calls == []
      signal.raise_signal(signal.SIGTERM)  # the second: the previous handler's, which is back
      assert calls == [signal.SIGTERM]
    assert asked == []
    signal.raise_signal(signal.SIGTERM)
    assert calls == [signal.SIGTERM] * 2
    with preemption.Watcher() as watch:
      pass
    assert signal.getsignal(signal.SIGTERM) is not watch._handle
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert preemption.EXIT_CODE == EXIT_CODE
  assert preemption.Preempted(2).code == EXIT_CODE


def test_two_processes_stop_at_the_same_step(tmp_path):
  """Multi-process: SIGTERM to one process (as step 3 begins) reaches the other through jax.distributed's
  preemption service, and the watcher (Orbax's sync point) stops both after the same later step."""
  import socket
  import subprocess
  import sys
  from tests import shared_runs
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  worker = shared_runs.REPO / "tests" / "preemption_worker.py"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(shared_runs.REPO)}
  procs = [subprocess.Popen([sys.executable, str(worker), str(port), str(i), str(tmp_path / "checkpoints")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  stops = [[l for l in out.splitlines() if l.startswith(("STOP", "NOSTOP"))] for out in outs]
  assert stops[0] == stops[1] and len(stops[0]) == 1 and stops[0][0].startswith("STOP"), outs[0][-2000:]
  assert int(stops[0][0].split()[1]) > 3
