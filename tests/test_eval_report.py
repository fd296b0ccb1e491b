"""Accuracy table, means, output files and the history plot."""
import json

import pytest

from compassplay_jax.evals import report


def _summary(step, crux, math500, aime=1.0):
  return report.summarize({"cruxeval_o": [True] * int(4 * crux) + [False] * (4 - int(4 * crux)),
                           "livecodebench_execution": [False, False],
                           "math500": [True] * int(2 * math500) + [False] * (2 - int(2 * math500)),
                           "aime24": [aime == 1.0]}, step)


def test_means_follow_the_paper_split():
  summary = _summary(10, crux=0.75, math500=0.5)
  assert summary["benchmarks"]["cruxeval_o"]["accuracy"] == 0.75
  assert summary["in_domain_mean"] == pytest.approx((0.75 + 0.0) / 2)
  assert summary["out_of_domain_mean"] == 0.5  # AIME is reported but in neither mean.
  assert summary["in_domain_mean_of"] == ["cruxeval_o", "livecodebench_execution"]
  table = report.markdown_table(summary)
  assert "| CRUXEval-O | in_domain | 75.0 | 3 / 4 |" in table
  assert "AIME24: reported, not part of either mean." in table


def test_outputs_and_multi_seed_plot(tmp_path):
  for seed, offset in ((0, 0.0), (1, 0.25)):
    for step in (0, 10, 20, 30):
      summary = _summary(step, crux=min(1.0, step / 40 + offset), math500=0.5)
      report.write_step_results(report.step_dir(tmp_path / f"seed{seed}", step), summary,
                                [{"benchmark": "cruxeval_o", "id": "x", "correct": True}])
  out = tmp_path / "seed0" / "eval" / "step_10"
  assert json.loads((out / "results.json").read_text())["step"] == 10
  assert (out / "results.md").read_text().startswith("## Evaluation at step 10")
  assert json.loads((out / "predictions.jsonl").read_text().splitlines()[0])["id"] == "x"
  assert sorted(report.load_history(tmp_path / "seed0")) == [0, 10, 20, 30]
  png = report.plot_history([tmp_path / "seed0", tmp_path / "seed1"], tmp_path / "history.png")
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_results_fails(tmp_path):
  with pytest.raises(FileNotFoundError, match="no eval/step_"):
    report.plot_history([tmp_path], tmp_path / "x.png")
