"""evaluate() end to end with a fake generate_fn (3 items per benchmark), and the CLI's run()."""
import json
import pathlib

import ml_collections
import pytest

from compassplay_jax.cli import evaluate as evaluate_cli
from compassplay_jax.evals import harness
from compassplay_jax.evals import prompts

pytest.importorskip("compassplay_jax.verifiers.sandbox", reason="sandbox not available")

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"
SOLUTIONS = json.loads((FIXTURES / "livecodebench_solutions.json").read_text())


def _eval_config(**overrides):
  cfg = harness.default_eval_config()
  cfg.benchmarks = "all"
  cfg.data_dir = str(FIXTURES)
  cfg.limit = 3
  cfg.batch_size = 4
  cfg.progress = False
  cfg.update(overrides)
  return cfg


def _oracle_generate_fn(items, right=True):
  """A stand-in policy: answers every prompt with the gold answer (or a wrong one)."""
  by_prompt = {}
  for item_list in items.values():
    for item in item_list:
      if item.kind == "cruxeval_o":
        answer = f"```output\n{item.output if right else 'None'}\n```"
      elif item.kind == "cruxeval_i":
        answer = f"```input\n{item.input if right else 'None, None, None'}\n```"
      elif item.kind == "lcb":
        index = next(k for k, s in SOLUTIONS.items() if item.item_id == k)
        answer = f"```python\n{SOLUTIONS[index] if right else 'print(0)'}```"
      else:
        answer = f"\\boxed{{{item.answer if right else 'wrong'}}}"
      by_prompt[prompts.build_prompt(item, "azr")] = f" think </think> <answer>{answer}</answer>"
  return lambda batch, budgets=None: [by_prompt[p] for p in batch]  # a generate_fn or a generate_queue


def test_evaluate_writes_table_predictions_and_plot(tmp_path):
  cfg = _eval_config()
  items = harness.load_items(cfg)
  assert all(len(v) == 3 for v in items.values())
  for step, right in ((10, False), (20, True)):
    summary = harness.evaluate(_oracle_generate_fn(items, right), None, items, eval_config=cfg, step=step,
                               workdir=tmp_path)
    accuracies = {n: r["accuracy"] for n, r in summary["benchmarks"].items()}
    assert set(accuracies.values()) == {1.0 if right else 0.0}, accuracies
  out = tmp_path / "eval" / "step_20"
  results = json.loads((out / "results.json").read_text())
  assert results["in_domain_mean"] == 1.0 and results["out_of_domain_mean"] == 1.0
  rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
  assert len(rows) == 3 * len(items) == 36 and all(r["correct"] for r in rows)
  assert {"benchmark", "id", "prompt", "completion", "extracted", "gold", "detail"} <= set(rows[0])
  assert "| **in domain mean** | in_domain | **100.0** |" in (out / "results.md").read_text()
  from compassplay_jax.evals import report  # pylint: disable=g-import-not-at-top
  assert report.plot_history([tmp_path], tmp_path / "h.png").exists()


def test_generate_fn_batches_sorted_and_checked():
  seen = []
  def fake(batch):
    seen.append(len(batch))
    return [p.upper() for p in batch]
  assert harness.generate_all(fake, ["bb", "a", "ccc"], 2, progress=False) == ["BB", "A", "CCC"]
  assert seen == [2, 1]
  with pytest.raises(ValueError, match="returned 0 completions for 2 prompts"):
    harness.generate_all(lambda b: [], ["a", "b"], 2, progress=False)


def test_config_errors_are_one_line():
  with pytest.raises(ValueError, match="config.eval: unknown key 'bogus'"):
    harness.load_items({"bogus": 1})
  with pytest.raises(ValueError, match="config.eval.paths: bad entry 'nope'"):
    harness.load_items({"paths": "nope", "data_dir": str(FIXTURES)})
  items = harness.load_items({"benchmarks": "gsm8k", "paths": f"gsm8k={FIXTURES / 'gsm8k/test.jsonl'}",
                              "data_dir": "/nonexistent"})
  assert len(items["gsm8k"]) == 3


def test_cli_run_evaluates_each_checkpoint_and_plots(tmp_path):
  config = ml_collections.ConfigDict({"workdir": str(tmp_path), "eval": _eval_config().to_dict()})
  items = harness.load_items(config.eval)
  loads = []
  def load_generate_fn(cfg, checkpoint):
    loads.append(checkpoint)
    return _oracle_generate_fn(items, right=checkpoint.endswith("200")), None
  png = evaluate_cli.run(config, ["/ck/step_100", "/ck/step_200"], benchmarks="cruxeval_o,gsm8k",
                         load_generate_fn=load_generate_fn)
  assert loads == ["/ck/step_100", "/ck/step_200"] and png.exists()
  assert sorted(p.name for p in (tmp_path / "eval").glob("step_*")) == ["step_100", "step_200"]
  final = json.loads((tmp_path / "eval" / "step_200" / "results.json").read_text())
  assert list(final["benchmarks"]) == ["cruxeval_o", "gsm8k"]


def test_cli_checkpoint_paths(tmp_path):
  # The model glue itself runs in tests/test_eval_end_to_end.py; a missing training checkpoint is one line.
  missing = tmp_path / "run" / "checkpoints" / "7"
  with pytest.raises(FileNotFoundError, match=r"checkpoints/7: checkpoint directory does not exist"):
    evaluate_cli._load_generate_fn({"model": {"path": "tiny"}}, str(missing))  # pylint: disable=protected-access
  assert evaluate_cli.step_from_path("/runs/a/checkpoint-120/") == 120
  with pytest.raises(ValueError, match="cannot read a step"):
    evaluate_cli.step_from_path("/runs/final")
