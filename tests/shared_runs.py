"""Runs that several tests assert on, made once per test session (also across pytest-xdist workers).

`coding_tiny_runs` (the conftest fixture of the same name) makes, in one directory:
  straight/  coding:tiny with the KL term (compassplay_cos, seed 0, 2 steps, train.kl_coef=KL_COEF)
             stepped one at a time through a Session, with its reference loss before and after; then a
             new Session resumes it for a third step.
  sweep/     `python -m compassplay_jax.cli.sweep` over compassplay_cos,difficulty x seeds 0,1 of the same
             config (--set train.kl_coef=KL_COEF), killed (-9, the sweep and its running cell) once
             compassplay_cos/seed_0 has committed step 1, run again to the end, and once more
             (everything skipped). That cell had a killed run's stale metrics lines and no checkpoint
             before the sweep started.
So compassplay_cos/seed_0 is the straight run's config, killed and resumed by the real command line:
test_selfplay.py compares the two bit for bit and checks the KL term on every cell; test_sweep.py,
test_session.py, test_run_restart_metrics.py and test_demo_summary.py assert on the rest.

Every program compiled while they are made goes into the persistent compilation cache (conftest's
JAX_COMPILATION_CACHE_DIR), however fast it compiled: the six processes compile the same programs,
and the later ones load them.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import traceback

import filelock
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = f"{REPO}/configs/coding.py:tiny"
SWEEP_REWARDS, SWEEP_SEEDS = ("compassplay_cos", "difficulty"), (0, 1)
# The shared runs' KL coefficient: the main job with --config.train.kl_coef (test_selfplay.py's KL checks).
KL_COEF = 0.01
# What a run killed during step 2, before any checkpoint was written, leaves behind.
STALE_LINES = [{"step": 1, "stale": True}, {"step": 2, "stale": True}]


def once(tmp_path_factory, name: str, make) -> tuple[pathlib.Path, dict]:
  """(directory, result) of make(directory), called once per test session. Under xdist the workers
  share the session's base directory: the first to ask makes it under a file lock, the others wait
  and read the result (JSON) back; a failure is recorded and fails every test that asks."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # pytest-<n>/: shared by this session's workers only
  directory, done, failed = base / name, base / f"{name}.json", base / f"{name}.failed"
  with filelock.FileLock(str(base / f"{name}.lock")):
    if failed.exists():
      pytest.fail(f"{name}: making it failed in an earlier test:\n{failed.read_text()[-3000:]}")
    if not done.exists():
      shutil.rmtree(directory, ignore_errors=True)
      directory.mkdir()
      try:
        result = make(directory)
      except BaseException:
        failed.write_text(traceback.format_exc())
        raise
      done.write_text(json.dumps(result))
  return directory, json.loads(done.read_text())


def tiny_config(reward: str = "compassplay_cos", steps: int = 2, kl_coef: float = 0.0, profile_steps: str = ""):
  from compassplay_jax.cli.sweep import load_config
  config = load_config(TINY)
  config.reward.name = reward
  config.steps = steps
  config.train.kl_coef = kl_coef
  config.profile.steps = profile_steps
  return config


def shared_config():
  """The config of the shared straight run and of the sweep's compassplay_cos/seed_0."""
  return tiny_config(kl_coef=KL_COEF)


EVAL_FIXTURES = REPO / "tests" / "fixtures" / "eval"


def with_evaluation(config, every_steps: int):
  """config evaluating every `every_steps` steps (not at step 0) on two tiny fixture benchmarks, a code
  and a math one with different budgets, through the rollout engine (config.eval.engine's default)."""
  config.eval.update(every_steps=every_steps, at_start=False, benchmarks="cruxeval_o,math500",
                     data_dir=str(EVAL_FIXTURES), limit=2, max_new_tokens=12, budgets="math=6", progress=False)
  return config


def step_then_resume(reward: str, workdir: pathlib.Path, steps: int = 2, kl_coef: float = 0.0,
                     profile_steps: str = "", eval_every: int = 0) -> dict:
  """coding:tiny stepped `steps` times through a Session (one straight run), then a new Session on the
  same workdir resumes it for one more step (profile_steps: config.profile.steps of the straight run).
  eval_every > 0: the run evaluates (with_evaluation), and after its last step the same params are
  evaluated again through the static sampler (record["eval_static"], workdir/static_eval).
  Returns what test_session.py asserts on."""
  from compassplay_jax.selfplay.session import Session
  config = tiny_config(reward, steps, kl_coef, profile_steps)
  if eval_every:
    with_evaluation(config, eval_every)
  with Session.create(config, workdir) as session:
    record = {"reference_on_setting": session.setting.reference is not None,
              "loss_before": session.reference_loss(), "start": session.start}
    record["metrics"] = [session.step() for _ in range(steps)]
    record["metrics_keys"] = [sorted(m) for m in record["metrics"]]
    record["step_count"] = session.step_count
    record["loss_after"] = session.reference_loss()
    if eval_every:
      from compassplay_jax.selfplay import in_loop_eval as evaluation
      static = with_evaluation(tiny_config(reward, steps, kl_coef), eval_every)
      static.eval.engine = "static"
      record["eval_static"] = evaluation.evaluate(static, session.engine, session.params, session.tokenizer,
                                                  steps, workdir / "static_eval", session.eval_items)
  record["logged_steps"] = _logged_steps(workdir)
  with Session.create(tiny_config(reward, steps + 1, kl_coef), workdir) as session:
    record["resumed"] = (session.start, session.step_count)
    record["resumed_time_step"] = session.step()["time/step"]
    record["resumed_step_count"] = session.step_count
  record["logged_steps_after_resume"] = _logged_steps(workdir)
  return record


def _logged_steps(workdir: pathlib.Path) -> list[int]:
  return [json.loads(l)["step"] for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def sweep_command(root: pathlib.Path) -> list[str]:
  return [sys.executable, "-m", "compassplay_jax.cli.sweep", f"--config={TINY}",
          f"--rewards={','.join(SWEEP_REWARDS)}", f"--seeds={','.join(map(str, SWEEP_SEEDS))}", f"--root={root}",
          "--set", f"train.kl_coef={KL_COEF}"]


def _sweep_here(root: pathlib.Path) -> tuple[int, str, str]:
  """(exit status, stdout, stderr) of the sweep command run in this process: sweep.main, which the
  command calls (its cells are still `python -m compassplay_jax.main` subprocesses). Saves the
  interpreter start and the imports of a sweep process."""
  from compassplay_jax.cli import sweep
  out, err = io.StringIO(), io.StringIO()
  cwd = os.getcwd()
  os.chdir(REPO)  # where the command is run from
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      code = sweep.main(sweep_command(root)[3:])
  finally:
    os.chdir(cwd)
  return code, out.getvalue(), err.getvalue()


def killed_and_resumed_sweep(root: pathlib.Path) -> dict:
  """The sweep killed while its first cell runs step 2, then run again twice (see the module doc). The
  killed sweep is a process of its own (killed with its cell); the two reruns call sweep.main here."""
  from compassplay_jax.cli import sweep
  first = root / SWEEP_REWARDS[0] / f"seed_{SWEEP_SEEDS[0]}"
  first.mkdir(parents=True)
  (first / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in STALE_LINES))
  proc = subprocess.Popen(sweep_command(root), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
  deadline = time.time() + 900
  while sweep.last_checkpoint(first) is None and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  assert proc.poll() is None, "the sweep ended before it could be killed"
  os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its running cell, mid-run
  proc.wait()
  record = {"killed_at": sweep.last_checkpoint(first)}
  code, out, err = _sweep_here(root)
  record.update(resumed_returncode=code, resumed_stdout=out, resumed_stderr=err[-3000:])
  code, out, _ = _sweep_here(root)
  record.update(again_returncode=code, again_stdout=out)
  return record


@contextlib.contextmanager
def cache_every_compile():
  """Programs compiled meanwhile, here and in the processes started here, are written to the persistent
  compilation cache however fast they compiled (conftest caches only those taking 1 s or more)."""
  import jax
  option, variable = "jax_persistent_cache_min_compile_time_secs", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
  saved_option, saved_variable = getattr(jax.config, option), os.environ.get(variable)
  jax.config.update(option, 0.0)
  os.environ[variable] = "0"
  try:
    yield
  finally:
    jax.config.update(option, saved_option)
    if saved_variable is None:
      os.environ.pop(variable, None)
    else:
      os.environ[variable] = saved_variable


def coding_tiny_runs(tmp_path_factory):
  """(directory, {"session": step_then_resume's record, "sweep": killed_and_resumed_sweep's})."""
  def make(directory):
    with cache_every_compile():
      return {"session": step_then_resume("compassplay_cos", directory / "straight", kl_coef=KL_COEF),
              "sweep": killed_and_resumed_sweep(directory / "sweep")}
  return once(tmp_path_factory, "coding_tiny_runs", make)
