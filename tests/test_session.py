"""selfplay/session.py: a run built once and stepped one step per call (the run loop's body)."""
import json
import math
import pathlib

import pytest

from compassplay_jax.selfplay.session import Session
from compassplay_jax.sweep import load_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def _tiny(reward, steps=2):
  config = load_config(f"{REPO / 'configs' / 'coding.py'}:tiny")
  config.reward.name = reward
  config.steps = steps
  return config


@pytest.mark.slow
@pytest.mark.parametrize("reward", ["compassplay_cos", "difficulty"])
def test_steps_one_at_a_time_then_resume(tmp_path, reward):
  with Session.create(_tiny(reward), tmp_path) as session:
    loss0 = session.reference_loss()
    assert math.isfinite(loss0) and loss0 > 0  # difficulty runs get their own copy of the reference set
    assert session.setting.reference is None if reward == "difficulty" else session.setting.reference is not None
    metrics = [session.step(), session.step()]
    assert session.step_count == 2
    assert all("reward/proposer" in m and "copy_rate" in m and "train/loss" in m for m in metrics)
    if reward == "difficulty":  # no reference set on the setting: no cosines computed
      assert not any("cos_valid_mean" in m for m in metrics)
    loss2 = session.reference_loss()
    assert math.isfinite(loss2) and loss2 != loss0  # two updates (lr 1e-3) moved the solver
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2]
  # A new session on the same workdir resumes after the last checkpoint.
  with Session.create(_tiny(reward, steps=3), tmp_path) as session:
    assert (session.start, session.step_count) == (2, 2)
    assert session.step()["time/step"] > 0 and session.step_count == 3
  assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
