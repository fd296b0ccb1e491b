"""A run killed before its first checkpoint is started again from step 0: its stale metrics lines go."""
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_restart_without_a_checkpoint_does_not_repeat_a_step(tmp_path):
  sys.path.insert(0, str(REPO / "configs"))
  try:
    import coding as coding_config
  finally:
    sys.path.pop(0)
  from compassplay_jax.selfplay.run import run
  config = coding_config.get_config("tiny")
  config.steps = 1
  config.compile_cache_dir = ""
  # What a run killed during step 2, before any checkpoint was written, leaves behind.
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "stale": True}) + "\n"
                                          + json.dumps({"step": 2, "stale": True}) + "\n")
  run(config, tmp_path)
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1] and "stale" not in lines[0]
