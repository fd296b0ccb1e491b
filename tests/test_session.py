"""selfplay/session.py: a run built once and stepped one step per call (the run loop's body)."""
import json
import math

import pytest

from tests import shared_runs


@pytest.mark.slow
@pytest.mark.parametrize("reward", [pytest.param("compassplay_cos", marks=pytest.mark.xdist_group("coding_tiny_runs")),
                                    "difficulty"])
def test_steps_one_at_a_time_then_resume(tmp_path, request, reward):
  """Two steps through a Session, then a new Session on the workdir resumes for a third
  (shared_runs.step_then_resume). compassplay_cos's is the shared straight run of coding:tiny (with the
  KL term), which test_selfplay.py also compares bit for bit with the same config killed and resumed."""
  if reward == "compassplay_cos":
    runs = request.getfixturevalue("coding_tiny_runs")
    workdir, record = runs.straight, runs.session
  else:
    # Step 2 traced (config.profile.steps): compassplay_jax/infra/profiling.py's Session-level check.
    # It also evaluates at step 2 (shared_runs.with_evaluation), then again through the static sampler.
    workdir, record = tmp_path, shared_runs.step_then_resume(reward, tmp_path, profile_steps="2", eval_every=2)
  assert record["start"] == 0
  loss0 = record["loss_before"]
  assert math.isfinite(loss0) and loss0 > 0  # difficulty runs get their own copy of the reference set
  assert record["reference_on_setting"] == (reward != "difficulty")
  assert record["step_count"] == 2
  metrics_keys = [set(keys) for keys in record["metrics_keys"]]
  assert len(metrics_keys) == 2 and all({"reward/proposer", "copy_rate", "train/loss"} <= k for k in metrics_keys)
  if reward == "difficulty":  # no reference set on the setting: no cosines computed
    assert not any("cos_valid_mean" in k for k in metrics_keys)
  loss2 = record["loss_after"]
  assert math.isfinite(loss2) and loss2 != loss0  # two updates (lr 1e-3) moved the solver
  assert record["logged_steps"] == [1, 2]
  # A new session on the same workdir resumes after the last checkpoint.
  assert tuple(record["resumed"]) == (2, 2)
  assert record["resumed_time_step"] > 0 and record["resumed_step_count"] == 3
  assert record["logged_steps_after_resume"] == [1, 2, 3]
  assert [json.loads(l)["step"] for l in (workdir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
  if reward == "difficulty":
    _evaluation_went_through_the_continuous_engine(workdir, record)
    # One trace (step 2's, not the resumed step 3's), holding the step's own programs by name: the
    # continuous engine's decode and the bucketed update's accumulate.
    from compassplay_jax.infra import profiling
    traces = list((workdir / "profile").rglob(profiling.PERFETTO_FILE))
    assert len(traces) == 1, traces
    programs = dict(profiling.program_totals(profiling.summarize(traces[0])))
    assert {"jit_decode_chunk_program", "jit_accumulate"} <= set(programs), sorted(programs)  # tiny: dense


def _evaluation_went_through_the_continuous_engine(workdir, record):
  """Step 2's evaluation decoded every prompt in one queue of the continuous engine (its counters are in
  the metrics), gave the static sampler's greedy answers at the same params, and its time is in the
  step's accelerator cost."""
  step1, step2 = record["metrics"]
  assert not any(k.startswith(("eval/", "eval_engine/")) for k in step1) and step1["cost/eval_accelerator_s"] == 0
  # Before each update the rollout engine gave its cache and weight copy back (run_step).
  assert step1["memory/rollout_released_bytes"] > 0 and step2["memory/rollout_released_bytes"] > 0
  assert step2["eval_engine/continuous"] == 1 and step2["eval_engine/prompts"] == 4  # 2 CRUXEval-O + 2 MATH-500
  assert step2["eval_engine/decode_steps"] > 0 and step2["time/eval"] > 0
  assert step2["cost/accelerator_s"] == pytest.approx(step2["time/step"] + step2["time/eval"])  # one device
  assert step2["cost/eval_accelerator_s"] == pytest.approx(step2["time/eval"])
  static = record["eval_static"]
  assert "eval_engine/continuous" not in static
  assert {k: v for k, v in step2.items() if k.startswith("eval/")} == {k: v for k, v in static.items() if k.startswith("eval/")}

  def completions(root):
    rows = [json.loads(line) for line in (root / "eval" / "step_2" / "predictions.jsonl").read_text().splitlines()]
    return [(r["benchmark"], r["id"], r["completion"]) for r in rows]
  rollout, static_rows = completions(workdir), completions(workdir / "static_eval")
  assert len(rollout) == 4 and rollout == static_rows
