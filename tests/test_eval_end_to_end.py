"""Tiny real model, 3 items per benchmark, through the sampler: completes and writes every output."""
import json
import pathlib

import ml_collections
import pytest

from compassplay_jax.evals import harness

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"


@pytest.mark.slow
def test_tiny_model_end_to_end(tmp_path):
  from compassplay_jax import evaluate as evaluate_cli  # pylint: disable=g-import-not-at-top
  eval_cfg = harness.default_eval_config()
  eval_cfg.update(benchmarks="all", data_dir=str(FIXTURES), limit=3, max_new_tokens=16, batch_size=8,
                  progress=False)
  config = ml_collections.ConfigDict({"workdir": str(tmp_path), "eval": eval_cfg.to_dict()})
  png = evaluate_cli.run(config, ["tiny"], step=0)
  out = tmp_path / "eval" / "step_0"
  results = json.loads((out / "results.json").read_text())
  assert set(results["benchmarks"]) == set(harness.load_items(eval_cfg))
  assert len((out / "predictions.jsonl").read_text().splitlines()) == 3 * len(results["benchmarks"]) == 36
  assert (out / "results.md").exists() and png.exists()
