"""The end-of-run proposer summary: cosine share and table (hand-computed oracles), and the tiny run's
printed table, PNG and per-step in-band / cosine-share metrics."""
import json

import pytest

from compassplay_jax.selfplay import summary

CANDIDATES = [
    {"type": "deduction", "solve_rate": 0.5, "cosine": 0.2, "reward": 0.2, "valid": True, "in_band": True,
     "paid_by": "cosine"},
    {"type": "deduction", "solve_rate": 1.0, "cosine": 0.1, "reward": -0.5, "valid": True, "in_band": False,
     "paid_by": "gate"},
    {"type": "abduction", "solve_rate": 0.25, "cosine": -0.3, "reward": -0.3, "valid": True, "in_band": True,
     "paid_by": "cosine"},
    {"type": "abduction", "solve_rate": 0.0, "cosine": None, "reward": -1.0, "valid": False, "in_band": False,
     "paid_by": "gate"},
]


def test_cosine_share_is_the_cosine_paid_part_of_the_reward_magnitude():
  # |0.2| + |-0.3| paid by cosines out of 0.2 + 0.5 + 0.3 + 1.0 = 2.0
  assert summary.cosine_share(CANDIDATES) == pytest.approx(0.5 / 2.0)
  assert summary.cosine_share(CANDIDATES[1:2] + CANDIDATES[3:]) == 0.0
  assert summary.cosine_share([]) == 0.0


def test_candidate_table_lists_every_candidate():
  table = summary.candidate_table(7, CANDIDATES).splitlines()
  assert table[0].strip() == "step 7: 4 candidates, 2 in band, 25% of proposer reward |r| paid by cosines"
  assert table[1].split() == ["type", "solve", "cosine", "reward", "valid", "in-band", "paid", "by"]
  assert table[2].split() == ["deduction", "0.50", "+0.200", "+0.200", "yes", "yes", "cosine"]
  assert table[5].split() == ["abduction", "0.00", "-", "-1.000", "no", "no", "gate"]


@pytest.mark.slow
@pytest.mark.xdist_group("coding_tiny_runs")
def test_tiny_run_prints_the_table_and_writes_the_png(coding_tiny_runs):
  """On the shared sweep's compassplay_cos/seed_1 (tests/shared_runs.py): coding:tiny run straight through
  by `python -m compassplay_jax.main`, its output in the cell's sweep.log."""
  from tests import shared_runs
  config = shared_runs.shared_config()
  workdir = coding_tiny_runs.sweep / "compassplay_cos" / "seed_1"
  out = (workdir / "sweep.log").read_text()
  assert len([l for l in out.splitlines() if l.startswith("$ ")]) == 1  # one run, straight through
  assert "[compassplay] done: 2 steps" in out
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  for line in lines:
    assert {"in_band_count", "cos_paid_count", "cos_share", "candidates", "compile/count"} <= set(line)
    assert len(line["candidates"]) == config.coding.proposals_per_type * 2  # deduction and abduction
    assert line["in_band_count"] == sum(c["in_band"] for c in line["candidates"])
    assert line["cos_share"] == pytest.approx(summary.cosine_share(line["candidates"]))
    # Every proposal's validation verdict is counted by reason, per step (the window resets).
    validation = {k: v for k, v in line.items() if k.startswith("verdicts/validation/")}
    assert sum(validation.values()) >= len(line["candidates"]), validation
  assert summary.candidate_table(lines[-1]["step"], lines[-1]["candidates"]) in out
  png = workdir / summary.PNG_NAME
  assert f"plot: {png}" in out
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
