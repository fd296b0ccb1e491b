"""The self-play loops end to end on the tiny configs: real sandbox, stand-in Lean REPL, real updates."""
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.checkpoint import CheckpointManager
from compassplay_jax.selfplay.run import build_model, run

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
  with CheckpointManager(workdir / "checkpoints", create=False) as manager:
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


@pytest.mark.slow
def test_coding_tiny_two_steps_with_the_kl_term(tmp_path):
  """The main job's loop on coding:tiny with --config.train.kl_coef=0.01 (it crashed in Session.create
  with a NameError once): two steps, and the loss is pg - entropy_coef * entropy + kl_coef * KL."""
  config = _config("coding:tiny", **{"train.kl_coef": 0.01})
  run(config, tmp_path)
  lines, extra = _check_run(tmp_path, config, 2)
  assert {"valid_rate", "reward/proposer", "reward/solver", "train/loss", "solve_rate_histogram"} <= set(lines[-1])
  assert lines[0]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is the reference
  assert lines[1]["train/kl"] > 1e-7  # step 2: one update away from it
  for line in lines:
    want = line["train/pg_loss"] - config.train.entropy_coef * line["train/entropy"] + 0.01 * line["train/kl"]
    assert line["train/loss"] == pytest.approx(want, rel=1e-4, abs=1e-7)
  buffers = extra["selfplay"]  # the task buffers are checkpointed, the built-in seed programs first
  assert set(buffers) == {"deduction", "abduction", "induction"}
  seeds = (REPO / "compassplay_jax" / "data" / "demo_seed" / "demo_seed_io.jsonl").read_text().splitlines()
  assert [b[0]["program"] for b in buffers["deduction"][:len(seeds)]] == [json.loads(l)["snippet"] for l in seeds]
  assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_lean_tiny_two_iterations_with_stand_in_repl(tmp_path):
  config = _config("lean:tiny", **_lean_overrides())
  run(config, tmp_path)
  lines, extra = _check_run(tmp_path, config, 2)
  assert "coverage" in lines[-1] and "train/loss" in lines[0]
  coverage = json.loads(extra["selfplay"]["coverage"])
  assert coverage  # the coverage history is checkpointed
  assert 0 < lines[-1]["coverage"] <= 1
  # One epoch per iteration at lean.train_batch_size rows per optimizer step (SGS: batch 32).
  for line in lines:
    if "rows" in line:
      assert line["train/optimizer_steps"] == -(-line["rows"] // config.lean.train_batch_size)


def _main(args, timeout=600):
  return subprocess.run([sys.executable, "-m", "compassplay_jax.main", *args], cwd=REPO, capture_output=True,
                        text=True, timeout=timeout)


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
def test_bad_input_is_one_line_before_any_model_loads(tmp_path, args, message):
  result = _main([*args, f"--workdir={tmp_path}"], timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and message in last, result.stderr[-2000:]
  assert not (tmp_path / "checkpoints").exists()


def test_reference_file_without_gold_solutions(tmp_path):
  bad = tmp_path / "ref.jsonl"
  bad.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
  result = _main(["--config=configs/coding.py:tiny", f"--config.reward.reference_path={bad}",
                  f"--workdir={tmp_path / 'run'}"], timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == f"error: {bad}:1: no gold solution (key 'solution')"


def _arrays(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _kill_after_step_2_and_resume(config, main_args, interrupted):
  """Runs main with main_args as a subprocess, kills it (-9) once step 2's checkpoint exists, then
  resumes in this process to config.steps."""
  import os
  import signal
  import time
  proc = subprocess.Popen([sys.executable, "-m", "compassplay_jax.main", *main_args, f"--workdir={interrupted}"],
                          cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  while not (interrupted / "checkpoints" / "2").is_dir() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  assert proc.poll() is None, "the run ended before it could be killed"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  with CheckpointManager(interrupted / "checkpoints", create=False) as manager:
    assert manager.latest_step() in (2, 3)
  run(config, interrupted)


def _assert_same_final_state(config, straight, interrupted):
  """Step 4 in both work directories, params and optimizer state equal bit for bit; the selfplay extras."""
  _, step_a, params_a, opt_a, extra_a = _restore(straight, config)
  _, step_b, params_b, opt_b, extra_b = _restore(interrupted, config)
  assert step_a == step_b == 4
  for a, b in zip(_arrays(params_a) + _arrays(opt_a), _arrays(params_b) + _arrays(opt_b)):
    np.testing.assert_array_equal(a, b)
  return extra_a, extra_b


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_identical(tmp_path):
  """4 steps straight vs. 2 steps, kill -9 (while step 3 runs), resume to 4: same params, optimizer
  state and task buffers, bit for bit."""
  straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
  config = _config("coding:tiny", steps=4)
  run(config, straight)
  _kill_after_step_2_and_resume(config, ["--config=configs/coding.py:tiny", "--config.steps=4"], interrupted)
  extra_a, extra_b = _assert_same_final_state(config, straight, interrupted)
  assert extra_a["selfplay"] == extra_b["selfplay"]
  steps = [json.loads(l)["step"] for l in (interrupted / "metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2, 3, 4]  # no lost or repeated step in the metrics either


# Metrics that measure the machine, not the run (wall-clock stamps, timings, compilations): they differ
# between a straight and a resumed run.
_MACHINE_METRICS = ("time", "cost/", "compile/", "tokens_per_s", "overlap")


@pytest.mark.slow
def test_lean_kill_and_resume_keeps_seed_pool_and_coverage(tmp_path):
  """Lean: 3 iterations straight vs. 2, kill -9 (during iteration 3), resume to 3: params, optimizer
  state, PRNG key, seed pool (verified proofs), coverage (first-solved iterations, curve) and the
  generation count equal bit for bit, and so does iteration 3's metrics line."""
  straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
  config = _config("lean:tiny", steps=3, **_lean_overrides())
  run(config, straight)
  overrides = [f"--config.{k}={v}" for k, v in _lean_overrides().items()]
  _kill_after_step_2_and_resume(config, ["--config=configs/lean.py:tiny", "--config.steps=3", *overrides],
                                interrupted)
  assert json.loads((interrupted / "summary.json").read_text())["resumed_from"] == 2, "iteration 3 was not resumed"
  states = []
  for workdir in (straight, interrupted):
    _, step, params, opt_state, _ = _restore(workdir, config)
    with CheckpointManager(workdir / "checkpoints", create=False) as manager:
      _, _, _, key, extra = manager.restore(step=3)
    assert step == 3
    states.append((_arrays(params) + _arrays(opt_state) + [np.asarray(jax.random.key_data(key))], extra))
  (arrays_a, extra_a), (arrays_b, extra_b) = states
  for a, b in zip(arrays_a, arrays_b, strict=True):
    np.testing.assert_array_equal(a, b)
  seeds = json.loads(extra_a["selfplay"]["seeds"])["seeds"]
  assert seeds, "no target was ever proved: the seed pool would be trivially equal"
  assert extra_a["selfplay"] == extra_b["selfplay"]  # seed pool, coverage (first-solved, curve), generations
  assert json.loads(extra_b["selfplay"]["coverage"])["first_solved"]
  lines = [[json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()] for d in (straight, interrupted)]
  assert [l["step"] for l in lines[1]] == [1, 2, 3]  # no lost or repeated iteration in the metrics
  same = [{k: v for k, v in l[-1].items() if not k.startswith(_MACHINE_METRICS)} for l in lines]
  assert "train/loss" in same[0] and "coverage" in same[0]
  assert same[0] == same[1]


@pytest.mark.slow
def test_coding_tiny_on_a_2x2x2_mesh_matches_one_device(tmp_path):
  """The run loop on 8 simulated devices (data, fsdp, tensor) = (2, 2, 2): sharded sampler and train
  step give the metrics of the single-device run."""
  import os
  # Both runs pad rows to one shape (packing by length is a single-device path; test_bucketed_update.py).
  overrides = {"steps": 1, "train.micro_batch_size": 4, "train.micro_batch_tokens": 0}
  config = _config("coding:tiny", **overrides)
  run(config, tmp_path / "one")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  result = subprocess.run([sys.executable, "-m", "compassplay_jax.main", "--config=configs/coding.py:tiny",
                           "--config.steps=1", "--config.train.micro_batch_size=4", "--config.mesh.data=2",
                           "--config.mesh.fsdp=2", "--config.mesh.tensor=2", f"--workdir={tmp_path / 'mesh'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "mesh" in result.stdout
  one = json.loads((tmp_path / "one" / "metrics.jsonl").read_text().splitlines()[0])
  mesh = json.loads((tmp_path / "mesh" / "metrics.jsonl").read_text().splitlines()[0])
  for key in ("train/loss", "train/grad_norm", "train/entropy", "tokens/generated", "reward/proposer"):
    assert mesh[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("arg", ["coding", "coding:demo", "coding:tiny", "lean", "lean:demo", "lean:tiny"])
def test_every_config_variant_builds_and_names_known_benchmarks(arg):
  from compassplay_jax.evals import harness
  config = _config(arg)
  assert config.setting == arg.split(":")[0]
  harness._with_defaults(config.eval)  # pylint: disable=protected-access
  names = [b for b in str(config.eval.benchmarks).split(",") if b]
  from compassplay_jax.evals.benchmarks import BENCHMARKS
  assert set(names) <= set(BENCHMARKS), names
