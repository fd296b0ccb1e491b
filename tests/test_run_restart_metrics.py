"""A run killed before its first checkpoint is started again from step 0: its stale metrics lines go."""
import json

import pytest

from tests import shared_runs


@pytest.mark.slow
@pytest.mark.xdist_group("coding_tiny_runs")
def test_restart_without_a_checkpoint_does_not_repeat_a_step(coding_tiny_runs):
  """The shared sweep's first cell (tests/shared_runs.py) started with what a run killed during step 2,
  before any checkpoint was written, leaves behind: metrics lines for steps 1 and 2 and no checkpoint.
  It started from step 0 (then it was killed after step 1 and resumed): none of those lines is left."""
  cell = coding_tiny_runs.sweep / shared_runs.SWEEP_REWARDS[0] / f"seed_{shared_runs.SWEEP_SEEDS[0]}"
  assert [l["step"] for l in shared_runs.STALE_LINES] == [1, 2]
  lines = [json.loads(l) for l in (cell / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2] and not any("stale" in l for l in lines)
