"""The self-play loops end to end on the tiny configs: real sandbox, stand-in Lean REPL, real updates."""
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.infra.checkpoint import CheckpointManager
from compassplay_jax.selfplay.run import build_model, run
from tests.main_in_process import run_main

REPO = pathlib.Path(__file__).resolve().parents[1]
FAKE_REPL = REPO / "tests" / "fake_lean_repl.py"
LEAN_TARGETS = REPO / "tests" / "fixtures" / "lean" / "tiny_targets.json"


def _config(arg, **overrides):
  sys.path.insert(0, str(REPO / "configs"))
  try:
    module = __import__(arg.split(":")[0])
  finally:
    sys.path.pop(0)
  config = module.get_config(arg.split(":")[1] if ":" in arg else "")
  for dotted, value in overrides.items():
    node = config
    *parents, leaf = dotted.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def tiny_model(arg: str = "coding:tiny", **overrides):
  """(config, tokenizer, graphdef, params) of a config's model (module fixtures of several test files)."""
  config = _config(arg, **overrides)
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  return config, tokenizer, graphdef, params


def _lean_overrides():
  return {"lean.targets_path": str(LEAN_TARGETS),
          "lean.command": f"{sys.executable} {FAKE_REPL} --accept-percent 50"}


def _restore(workdir, config):
  from compassplay_jax.rl.train_step import init_train_state
  from compassplay_jax.selfplay.run import train_config
  model, _ = build_model(config)
  _, params = nnx.split(model)
  params0 = jax.tree.map(np.array, params)
  params, opt_state = init_train_state(params, train_config(config))
  with CheckpointManager(workdir / "checkpoints", read_only=True) as manager:
    step, params, opt_state, key, extra = manager.restore(params=params, opt_state=opt_state)
  return params0, step, params, opt_state, extra


def _changed(a, b):
  return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _check_run(workdir, config, steps):
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == list(range(1, steps + 1))
  assert all("time/step" in l for l in lines)
  assert any(workdir.joinpath("tensorboard").iterdir())
  params0, step, params, _, extra = _restore(workdir, config)
  assert step == steps
  assert _changed(params0, params), "the update left every parameter unchanged"
  return lines, extra


def _check_kl_lines(lines, config):
  assert {"valid_rate", "reward/proposer", "reward/solver", "train/loss", "solve_rate_histogram"} <= set(lines[-1])
  assert lines[0]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is the reference
  assert lines[1]["train/kl"] > 1e-7  # step 2: one update away from it
  for line in lines:
    want = (line["train/pg_loss"] - config.train.entropy_coef * line["train/entropy"]
            + config.train.kl_coef * line["train/kl"])
    assert line["train/loss"] == pytest.approx(want, rel=1e-4, abs=1e-7)


@pytest.mark.slow
@pytest.mark.xdist_group("coding_tiny_runs")
def test_coding_tiny_two_steps_with_the_kl_term(coding_tiny_runs):
  """The main job's loop on coding:tiny with --config.train.kl_coef=0.01 (it crashed in Session.create
  with a NameError once): two steps, and the loss is pg - entropy_coef * entropy + kl_coef * KL.
  The runs are the shared ones (tests/shared_runs.py): the sweep's cells are that command line
  (compassplay_cos/seed_1 straight through; seed_0 killed and resumed, so its step 2 KL is measured
  against the reference policy rebuilt on resume), and the straight Session run has the same config."""
  from tests import shared_runs
  config = shared_runs.shared_config()
  assert config.train.kl_coef == shared_runs.KL_COEF == 0.01
  for reward in shared_runs.SWEEP_REWARDS:
    for seed in shared_runs.SWEEP_SEEDS:
      cell = coding_tiny_runs.sweep / reward / f"seed_{seed}"
      assert json.loads((cell / "config.json").read_text())["train"]["kl_coef"] == 0.01, cell
      _check_kl_lines([json.loads(l) for l in (cell / "metrics.jsonl").read_text().splitlines()], config)
  straight = [json.loads(l) for l in (coding_tiny_runs.straight / "metrics.jsonl").read_text().splitlines()]
  _check_kl_lines(straight[:2], config)
  workdir = coding_tiny_runs.sweep / "compassplay_cos" / "seed_1"
  config.seed = 1
  lines, extra = _check_run(workdir, config, 2)
  _check_kl_lines(lines, config)
  buffers = extra["selfplay"]  # the task buffers are checkpointed, the built-in seed programs first
  assert set(buffers) == {"deduction", "abduction", "induction"}
  seeds = (REPO / "compassplay_jax" / "data" / "demo_seed" / "demo_seed_io.jsonl").read_text().splitlines()
  assert [b[0]["program"] for b in buffers["deduction"][:len(seeds)]] == [json.loads(l)["snippet"] for l in seeds]
  assert json.loads((workdir / "summary.json").read_text())["steps"] == 2


LEAN_STEPS = 2  # lean:tiny's own length


@pytest.fixture(scope="module")
def lean_tiny_runs(tmp_path_factory):
  """lean:tiny with the stand-in REPL, made once per test session (tests/shared_runs.py): straight/ runs
  its LEAN_STEPS iterations; interrupted/ is the same run killed -9 during the last iteration, once the
  one before is checkpointed, and resumed in this process."""
  from tests import shared_runs

  def make(directory):
    config = _config("lean:tiny", **_lean_overrides())
    assert config.steps == LEAN_STEPS
    run(config, directory / "straight")
    overrides = [f"--config.{k}={v}" for k, v in _lean_overrides().items()]
    _kill_after_step_and_resume(config, ["--config=configs/lean.py:tiny", *overrides], directory / "interrupted",
                                LEAN_STEPS - 1)
    return {}
  directory, _ = shared_runs.once(tmp_path_factory, "lean_tiny_runs", make)
  return directory / "straight", directory / "interrupted"


@pytest.mark.slow
@pytest.mark.xdist_group("lean_tiny_runs")  # one worker makes the runs; no other waits on the lock
def test_lean_tiny_two_iterations_with_stand_in_repl(lean_tiny_runs):
  straight, _ = lean_tiny_runs
  config = _config("lean:tiny", **_lean_overrides())
  lines, extra = _check_run(straight, config, LEAN_STEPS)
  assert "coverage" in lines[-1] and "train/loss" in lines[0]
  coverage = json.loads(extra["selfplay"]["coverage"])
  assert coverage  # the coverage history is checkpointed
  assert 0 < lines[-1]["coverage"] <= 1
  # One epoch per iteration at lean.train_batch_size rows per optimizer step (SGS: batch 32).
  for line in lines:
    if "rows" in line:
      assert line["train/optimizer_steps"] == -(-line["rows"] // config.lean.train_batch_size)


@pytest.mark.parametrize("args,message", [
    (["--config=configs/coding.py:tiny", "--config.train.nope=1"], "unknown config key in --config.train.nope"),
    (["--config=configs/coding.py:tiny", "--config.model.path=/nonexistent/model"],
     "/nonexistent/model: no such checkpoint directory or GGUF file"),
    (["--config=configs/lean.py:tiny", f"--config.lean.targets_path={REPO}/tests/fixtures/lean/no_statements.json"],
     "no_statements.json[0]: missing key 'formal_statement' (or 'theorem')"),
    (["--config=configs/lean.py", f"--config.lean.targets_path={REPO}/tests/fixtures/lean/tiny_targets.json"],
     "Lean REPL command 'lake' not found"),
    (["--config=configs/lean.py:tiny", f"--config.lean.targets_path={REPO}/tests/fixtures/lean/tiny_targets.json",
      "--config.lean.command=python -c 'import sys; sys.exit(\"no lean here\")'"],
     "Lean REPL failed on the header (crash): REPL process exited with code 1: no lean here"),
])
def test_bad_input_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys, args, message):
  """main's entry() in this process (tests/main_in_process.py); test_user_errors.py runs the command itself."""
  monkeypatch.chdir(REPO)
  code, stderr = run_main([*args, f"--workdir={tmp_path}"], capsys)
  assert code == 2, stderr[-2000:]
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and message in last, stderr[-2000:]
  assert not (tmp_path / "checkpoints").exists()


def test_reference_file_without_gold_solutions(tmp_path, monkeypatch, capsys):
  bad = tmp_path / "ref.jsonl"
  bad.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
  monkeypatch.chdir(REPO)
  code, stderr = run_main(["--config=configs/coding.py:tiny", f"--config.reward.reference_path={bad}",
                           f"--workdir={tmp_path / 'run'}"], capsys)
  assert code == 2
  assert stderr.strip().splitlines()[-1] == f"error: {bad}:1: no gold solution (key 'solution')"


def _arrays(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _kill_after_step_and_resume(config, main_args, interrupted, step):
  """Runs main with main_args as a subprocess, kills it (-9) once `step`'s checkpoint exists, then
  resumes in this process to config.steps."""
  import os
  import signal
  import time
  proc = subprocess.Popen([sys.executable, "-m", "compassplay_jax.main", *main_args, f"--workdir={interrupted}"],
                          cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  while not (interrupted / "checkpoints" / str(step)).is_dir() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  assert proc.poll() is None, "the run ended before it could be killed"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  with CheckpointManager(interrupted / "checkpoints", read_only=True) as manager:
    assert manager.latest_step() in (step, step + 1)
  run(config, interrupted)


def _state_at(workdir, config, step):
  """(arrays of params, optimizer state and PRNG key, checkpoint extras) of workdir's checkpoint `step`."""
  from compassplay_jax.rl.train_step import init_train_state
  from compassplay_jax.selfplay.run import train_config
  model, _ = build_model(config)
  params, opt_state = init_train_state(nnx.split(model)[1], train_config(config))
  with CheckpointManager(workdir / "checkpoints", read_only=True) as manager:
    _, params, opt_state, key, extra = manager.restore(step, params=params, opt_state=opt_state)
  return _arrays(params) + _arrays(opt_state) + [np.asarray(jax.random.key_data(key))], extra


@pytest.mark.slow
@pytest.mark.xdist_group("coding_tiny_runs")
def test_kill_and_resume_is_bitwise_identical(coding_tiny_runs):
  """coding:tiny 2 steps straight (a Session) vs. the same config as a sweep cell killed -9 while step 2
  runs and resumed by the sweep (tests/shared_runs.py): same params, optimizer state, PRNG key and task
  buffers at step 2, bit for bit."""
  from tests import shared_runs
  cell = coding_tiny_runs.sweep / "compassplay_cos" / "seed_0"
  assert coding_tiny_runs.sweep_record["killed_at"] == 1, "the cell was not killed between its checkpoints"
  assert json.loads((cell / "summary.json").read_text())["resumed_from"] == 1, "step 2 was not resumed"
  config = shared_runs.shared_config()
  arrays_a, extra_a = _state_at(coding_tiny_runs.straight, config, 2)
  arrays_b, extra_b = _state_at(cell, config, 2)
  for a, b in zip(arrays_a, arrays_b, strict=True):
    np.testing.assert_array_equal(a, b)
  assert extra_a == extra_b  # the task buffers, the step
  lines = [[json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
           for d in (coding_tiny_runs.straight, cell)]
  assert [l["step"] for l in lines[1]] == [1, 2]  # no lost or repeated step in the metrics either
  same = [{k: v for k, v in l[1].items() if not k.startswith(_MACHINE_METRICS)} for l in lines]
  assert same[0]["step"] == 2 and "train/loss" in same[0]
  assert same[0] == same[1]  # the resumed step's metrics line


# Metrics that measure the machine, not the run (wall-clock stamps, timings, compilations): they differ
# between a straight and a resumed run.
_MACHINE_METRICS = ("time", "cost/", "compile/", "tokens_per_s", "overlap")


@pytest.mark.slow
@pytest.mark.xdist_group("lean_tiny_runs")  # one worker makes the runs; no other waits on the lock
def test_lean_kill_and_resume_keeps_seed_pool_and_coverage(lean_tiny_runs):
  """Lean: 2 iterations straight vs. 1, kill -9 (during iteration 2), resume to 2: params, optimizer
  state, PRNG key, seed pool (verified proofs), coverage (first-solved iterations, curve) and the
  generation count equal bit for bit, and so does iteration 2's metrics line."""
  straight, interrupted = lean_tiny_runs
  config = _config("lean:tiny", **_lean_overrides())
  resumed_from = LEAN_STEPS - 1
  assert json.loads((interrupted / "summary.json").read_text())["resumed_from"] == resumed_from, (
      f"iteration {LEAN_STEPS} was not resumed")
  (arrays_a, extra_a), (arrays_b, extra_b) = (_state_at(d, config, LEAN_STEPS) for d in (straight, interrupted))
  for a, b in zip(arrays_a, arrays_b, strict=True):
    np.testing.assert_array_equal(a, b)
  _, restored = _state_at(straight, config, resumed_from)
  assert json.loads(restored["selfplay"]["seeds"])["seeds"], (
      f"no target proved by iteration {resumed_from}: a seed pool lost on resume would go unnoticed")
  seeds = json.loads(extra_a["selfplay"]["seeds"])["seeds"]
  assert seeds, "no target was ever proved: the seed pool would be trivially equal"
  assert extra_a["selfplay"] == extra_b["selfplay"]  # seed pool, coverage (first-solved, curve), generations
  assert json.loads(extra_b["selfplay"]["coverage"])["first_solved"]
  lines = [[json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()] for d in (straight, interrupted)]
  assert [l["step"] for l in lines[1]] == list(range(1, LEAN_STEPS + 1))  # no lost or repeated iteration
  same = [{k: v for k, v in l[-1].items() if not k.startswith(_MACHINE_METRICS)} for l in lines]
  assert "train/loss" in same[0] and "coverage" in same[0]
  assert same[0] == same[1]


# The main command on a (2, 2, 2) mesh of 8 simulated devices against the one-device run:
# tests/selfplay_mesh_cases.py::test_main_on_a_2x2x2_mesh_matches_one_device (run by tests/test_eight_devices.py).


@pytest.mark.parametrize("arg", ["coding", "coding:demo", "coding:tiny", "lean", "lean:demo", "lean:tiny"])
def test_every_config_variant_builds_and_names_known_benchmarks(arg):
  from compassplay_jax.evals import harness
  config = _config(arg)
  assert config.setting == arg.split(":")[0]
  harness.with_defaults(config.eval)
  names = [b for b in str(config.eval.benchmarks).split(",") if b]
  from compassplay_jax.evals.benchmarks import BENCHMARKS
  assert set(names) <= set(BENCHMARKS), names
