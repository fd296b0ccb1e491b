"""Tiny real model, 3 items per benchmark, through the engine's one queue: completes and writes every
output; budgets, the cadence and the hosts' shares of the queue."""
import json
import pathlib

import ml_collections
import pytest

from compassplay_jax.evals import harness

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"


def _run(tmp_path, engine: str, budgets: str = "") -> tuple[dict, list[dict]]:
  from compassplay_jax.cli import evaluate as evaluate_cli  # pylint: disable=g-import-not-at-top
  eval_cfg = harness.default_eval_config()
  eval_cfg.update(benchmarks="all", data_dir=str(FIXTURES), limit=3, max_new_tokens=16, batch_size=8,
                  progress=False, engine=engine, budgets=budgets)
  config = ml_collections.ConfigDict({"workdir": str(tmp_path / engine), "eval": eval_cfg.to_dict()})
  png = evaluate_cli.run(config, ["tiny"], step=0)
  assert png.exists()
  out = tmp_path / engine / "eval" / "step_0"
  assert (out / "results.md").exists()
  rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
  return json.loads((out / "results.json").read_text()), rows


@pytest.mark.slow
def test_tiny_model_end_to_end_through_the_rollout_queue(tmp_path):
  """Every benchmark through the CLI's one queue with budgets per kind and per benchmark (the queue
  decodes rows of different lengths side by side). That the queue's greedy texts equal the static
  sampler's at mixed budgets: test_session.py (a coding:tiny run's step-2 evaluation, both paths)."""
  budgets = "math=12,cruxeval_o=20,livecodebench_execution=8"
  results, rows = _run(tmp_path, "rollout", budgets)
  assert set(results["benchmarks"]) == set(harness.load_items({"benchmarks": "all", "data_dir": str(FIXTURES)}))
  assert len(rows) == 3 * len(results["benchmarks"]) == 36
  # Each row stopped at its own budget: the math rows' completions are shorter than CRUXEval-O's.
  lengths = {}
  for r in rows:
    lengths.setdefault(r["benchmark"], set()).add(len(r["completion"]))
  assert max(lengths["math500"]) < max(lengths["cruxeval_o"]), lengths


def test_budgets_due_and_config_errors():
  items = {"cruxeval_o": [harness.benchmarks_lib.EvalItem(benchmark="cruxeval_o", kind="cruxeval_o", item_id="a")],
           "math500": [harness.benchmarks_lib.EvalItem(benchmark="math500", kind="math", item_id="b")] * 2,
           "gsm8k": [harness.benchmarks_lib.EvalItem(benchmark="gsm8k", kind="math", item_id="c")]}
  cfg = {"max_new_tokens": 100, "budgets": "math=16000,gsm8k=50"}
  assert harness.budgets_for(items, cfg) == [100, 16000, 16000, 50]  # name beats kind beats the default
  with pytest.raises(ValueError, match=r"config.eval.budgets: bad entry 'maths=3'"):
    harness.check_eval_config({"budgets": "maths=3"})
  with pytest.raises(ValueError, match=r"config.eval.engine: 'vllm' is not one of"):
    harness.check_eval_config({"engine": "vllm"})
  # The paper's cadence: step 0, every 25 steps, every 5 from step 150 (configs/coding.py).
  paper = {"every_steps": 25, "dense_every_steps": 5, "dense_from_step": 150, "at_start": True}
  steps = [s for s in range(201) if harness.due(s, paper)]
  assert steps == [0, 25, 50, 75, 100, 125] + list(range(150, 201, 5))
  assert len([s for s in steps if s >= 150]) == 11
  assert [s for s in range(21) if harness.due(s, {"every_steps": 5, "at_start": False})] == [5, 10, 15, 20]
  assert not any(harness.due(s, {"every_steps": 0}) for s in range(10))


def test_hosts_get_a_like_mix_of_the_evaluation_queue():
  """engine.dealt_order: hosts take contiguous shares of the queue (distributed.Shares), so the prompts
  are dealt first; the paper's queue puts 2,806 math prompts (16,000-token budgets) after 2,079 code
  ones, and without dealing one v5p host would get all 2,442 remaining math prompts."""
  from compassplay_jax.infra.distributed import Shares
  from compassplay_jax.runtime.engine import dealt_order
  n, code = 4885, 2079
  for hosts in (2, 4):
    order = dealt_order(n, hosts)
    assert sorted(order) == list(range(n))
    shares = [Shares(n, hosts, p).take(order) for p in range(hosts)]
    math_per_host = [sum(i >= code for i in share) for share in shares]
    # Each host's share of the math prompts is its share of the queue (within one prompt).
    assert all(abs(m - (n - code) * len(share) / n) <= 1 for m, share in zip(math_per_host, shares)), math_per_host
    undealt = [sum(i >= code for i in Shares(n, hosts, p).take(list(range(n)))) for p in range(hosts)]
    assert max(undealt) - min(undealt) > 1000  # what the contiguous split alone gives
  assert dealt_order(5, 1) == [0, 1, 2, 3, 4] and dealt_order(0, 3) == []
