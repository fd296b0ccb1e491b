"""The report command on synthetic run directories with known answers (coding with evaluations, Lean
with coverage), its unsupported lines, and its one-line errors."""
import json
import math
import pathlib
import statistics

import pytest

from compassplay_jax.cli import report
from compassplay_jax.evals import report as eval_report
from compassplay_jax.reports import paper_columns

REPO = pathlib.Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(workdir: pathlib.Path, setting, reward, seed, records, evals=None):
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps({"setting": setting, "seed": seed, "reward": {"name": reward}}))
  (workdir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **r}) + "\n" for s, r in records))
  for step, correct in (evals or {}).items():
    eval_report.write_step_results(eval_report.step_dir(workdir, step), eval_report.summarize(correct, step), [])


def _coding_accuracy(arm, seed, step):
  """Correct answers out of 4 (CRUXEval-I), 5 (CRUXEval-O), 2 (MATH500): varies by arm, seed and step."""
  bonus = 1 if arm == "compassplay_cos" else 0
  i = min(4, (step // 5 + seed + bonus) % 5)
  o = min(5, (step // 5 + 2 * seed) % 6)
  m = (step // 5 + seed + bonus) % 3 == 0
  return {"cruxeval_i": [True] * i + [False] * (4 - i), "cruxeval_o": [True] * o + [False] * (5 - o),
          "math500": [m, False]}


@pytest.fixture(scope="module")
def coding_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("coding")
  for arm in ("difficulty", "compassplay_cos"):
    for seed in (0, 1, 2):
      records = [(s, {"copy_rate": ((s + seed) % 4) / 4, "cost/accelerator_s": 36.0,
                      "cost/accelerator_s_total": 36.0 * s}) for s in range(1, 21)]
      evals = {s: _coding_accuracy(arm, seed, s) for s in range(0, 21, 5)}  # step 0: the base model
      _write_run(root / arm / f"seed_{seed}", "coding", arm, seed, records, evals)
  return root


def _coverage(arm, seed, it):
  """Cumulative solved targets (of 10) at iteration `it`: cos x novelty proves faster."""
  rate = 2 if arm == "compassplay_cos_novelty" else 1
  return min(10, (it * rate + seed) // 2)


@pytest.fixture(scope="module")
def lean_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("lean")
  for arm in ("difficulty", "compassplay_cos_novelty"):
    for seed in (0, 1):
      records = [(it, {"coverage": _coverage(arm, seed, it) / 10, "coverage/solved": _coverage(arm, seed, it),
                       "copy_rate": 0.5 / it if arm == "difficulty" else 0.1 * seed,
                       "cost/accelerator_s": 7200.0, "cost/accelerator_s_total": 7200.0 * it})
                 for it in range(1, 9)]
      _write_run(root / arm / f"seed_{seed}", "lean", arm, seed, records)
  return root


def _table(out, setting, name):
  return json.loads((out / setting / f"{name}.json").read_text())


def _row(table, arm):
  return next(r for r in table["rows"] if r["arm"] == arm)


def test_accuracy_tables_from_results_files_final_quarter_base_row_and_gains(coding_runs, tmp_path):
  """eval/step_*/results.json runs with 3 of the 8 paper benchmarks: the other columns are '–', the means
  average what was evaluated, the base row is the step-0 evaluation; the paper cadence is in test_report_paper."""
  out = tmp_path / "out"
  report.write_report([coding_runs], out, baseline="difficulty", log=lambda _: None)
  tables = {name: _table(out, "coding", name) for name in ("accuracy_in_domain", "accuracy_out_of_domain")}
  assert [c["key"] for c in tables["accuracy_in_domain"]["columns"]] == [
      *paper_columns.IN_DOMAIN_COLUMNS, "in_domain_mean"]
  assert [c["key"] for c in tables["accuracy_out_of_domain"]["columns"]] == [
      *paper_columns.OUT_OF_DOMAIN_COLUMNS, "out_of_domain_mean"]
  totals = {"cruxeval_i": 4, "cruxeval_o": 5, "math500": 2}
  table_of = {"cruxeval_i": "accuracy_in_domain", "cruxeval_o": "accuracy_in_domain", "in_domain_mean": "accuracy_in_domain",
              "math500": "accuracy_out_of_domain", "out_of_domain_mean": "accuracy_out_of_domain"}
  def pct(arm, seed, step, key):
    return 100 * sum(_coding_accuracy(arm, seed, step)[key]) / totals[key]
  hand, base = {}, {}
  for arm in ("difficulty", "compassplay_cos"):
    hand[arm] = {}
    for key in totals:  # last step 20: the final quarter is steps >= 15, i.e. the evaluations at 15 and 20
      hand[arm][key] = [statistics.mean(pct(arm, seed, s, key) for s in (15, 20)) for seed in (0, 1, 2)]
    hand[arm]["in_domain_mean"] = [(a + b) / 2 for a, b in zip(hand[arm]["cruxeval_i"], hand[arm]["cruxeval_o"])]
    hand[arm]["out_of_domain_mean"] = hand[arm]["math500"]
    for key, values in hand[arm].items():
      row = _row(tables[table_of[key]], arm)
      assert row[key]["values"] == pytest.approx(values), (arm, key)
      assert row[key]["mean"] == pytest.approx(statistics.mean(values))
      assert row[key]["sd"] == pytest.approx(statistics.stdev(values))
  for key in totals:  # the base row: every run's step-0 evaluation
    base[key] = [pct(arm, seed, 0, key) for arm in ("difficulty", "compassplay_cos") for seed in (0, 1, 2)]
  base["in_domain_mean"] = [(a + b) / 2 for a, b in zip(base["cruxeval_i"], base["cruxeval_o"])]
  base["out_of_domain_mean"] = base["math500"]
  for key, values in base.items():
    cell = tables[table_of[key]]["base"][key]
    assert cell["values"] == pytest.approx(values) and cell["mean"] == pytest.approx(statistics.mean(values))
    assert cell["sd"] == pytest.approx(statistics.stdev(values))
  lcb = _row(tables["accuracy_in_domain"], "difficulty")[next(iter(paper_columns.IN_DOMAIN_COLUMNS))]
  assert lcb["mean"] is None and lcb["sd"] is None  # not evaluated: null in the JSON, '–' in the markdown
  table = tables["accuracy_in_domain"]
  assert table["baseline"] == "difficulty" and [g["arm"] for g in table["gains"]] == ["compassplay_cos"]
  assert [g["arm"] for g in table["base_gains"]] == ["difficulty", "compassplay_cos"]
  for key in ("cruxeval_i", "cruxeval_o", "in_domain_mean"):
    assert table["gains"][0][key] == pytest.approx(statistics.mean(hand["compassplay_cos"][key])
                                                   - statistics.mean(hand["difficulty"][key]))
    assert table["base_gains"][1][key] == pytest.approx(statistics.mean(hand["compassplay_cos"][key])
                                                        - statistics.mean(base[key]))
  markdown = (out / "coding" / "accuracy_in_domain.md").read_text()
  in_domain = hand["compassplay_cos"]["in_domain_mean"]
  m, sd = statistics.mean(in_domain), statistics.stdev(in_domain)
  assert "| compassplay_cos | 3 | – | " in markdown and f"{m:.2f} ± {sd:.2f} |" in markdown
  assert "| Δ compassplay_cos − difficulty |" in markdown and "| Δ compassplay_cos − base |" in markdown
  assert "final-quarter window (steps): 15–20" in markdown
  assert "not evaluated in these runs: LCB" in markdown


def test_coding_figures_and_unsupported_lines(coding_runs, tmp_path):
  out = tmp_path / "out"
  index = "\n".join(report.write_report([coding_runs], out, log=lambda _: None))
  for name in ("accuracy_vs_step", "accuracy_vs_accelerator_hours", "copy_rate_vs_iteration"):
    assert (out / "coding" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
  assert "`coverage_vs_iteration`: not supported by these runs: no 'coverage' metric" in index
  assert "`iterations_to_reach`: not supported by these runs: no 'coverage' metric" in index
  ablation = _table(out, "coding", "ablation")
  assert [c["label"] for c in ablation["columns"]] == ["copy rate @ it 20"]
  assert any("solved problems: not supported by these runs" in n for n in ablation["notes"])
  copy = [((20 + seed) % 4) / 4 for seed in (0, 1, 2)]
  assert _row(ablation, "difficulty")["copy_rate"]["mean"] == pytest.approx(statistics.mean(copy))
  cost = _table(out, "coding", "cost")
  assert _row(cost, "difficulty")["accelerator_hours"]["values"] == pytest.approx([0.2] * 3)  # 20 x 36 s
  assert _row(cost, "difficulty")["steps"]["mean"] == 20


def test_lean_ablation_reach_and_coverage_figures(lean_runs, tmp_path):
  out = tmp_path / "out"
  index = "\n".join(report.write_report([lean_runs], out, baseline="difficulty", copy_at=4, log=lambda _: None))
  for name in ("copy_rate_vs_iteration", "coverage_vs_iteration", "coverage_vs_accelerator_hours"):
    assert (out / "lean" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
  assert "`accuracy_vs_step`: not supported by these runs: no evaluation results" in index

  ablation = _table(out, "lean", "ablation")
  assert [c["label"] for c in ablation["columns"]] == ["copy rate @ it 4", "solved problems, mean over it 6–8"]
  solved = {arm: [statistics.mean(_coverage(arm, seed, it) for it in (6, 7, 8)) for seed in (0, 1)]
            for arm in ("difficulty", "compassplay_cos_novelty")}
  for arm, values in solved.items():
    assert _row(ablation, arm)["coverage/solved"]["values"] == pytest.approx(values)
  assert _row(ablation, "difficulty")["copy_rate"]["values"] == pytest.approx([0.125, 0.125])
  assert _row(ablation, "compassplay_cos_novelty")["copy_rate"]["values"] == pytest.approx([0.0, 0.1])
  gain = ablation["gains"][0]
  assert gain["arm"] == "compassplay_cos_novelty" and "copy_rate" not in gain
  assert gain["coverage/solved"] == pytest.approx(statistics.mean(solved["compassplay_cos_novelty"])
                                                  - statistics.mean(solved["difficulty"]))

  reach = _table(out, "lean", "iterations_to_reach")
  target = statistics.mean(_coverage("difficulty", seed, 8) / 10 for seed in (0, 1))  # (0.4 + 0.4) / 2
  first = {arm: [next(it for it in range(1, 9) if _coverage(arm, seed, it) / 10 >= target) for seed in (0, 1)]
           for arm in ("difficulty", "compassplay_cos_novelty")}
  assert first == {"difficulty": [8, 7], "compassplay_cos_novelty": [4, 4]}  # the hand count
  for arm, its in first.items():
    row = _row(reach, arm)
    assert row["iterations_to_reach"]["values"] == its and row["reached"] == "2/2"
    assert row["iterations_to_reach"]["mean"] == pytest.approx(statistics.mean(its))
  assert reach["gains"][0]["final_coverage"] == pytest.approx(
      statistics.mean(_coverage("compassplay_cos_novelty", s, 8) / 10 for s in (0, 1)) - target)


def test_explicit_window_and_a_missing_baseline(lean_runs, tmp_path):
  out = tmp_path / "out"
  index = "\n".join(report.write_report([lean_runs], out, baseline="soar_utility", window=(2, 3),
                                        log=lambda _: None))
  ablation = _table(out, "lean", "ablation")
  assert _row(ablation, "difficulty")["coverage/solved"]["values"] == pytest.approx(
      [statistics.mean(_coverage("difficulty", s, it) for it in (2, 3)) for s in (0, 1)])
  assert ablation["gains"] == []
  assert any("baseline 'soar_utility' is not among the arms" in n for n in ablation["notes"])
  assert "`iterations_to_reach`: not supported by these runs: iterations to reach the baseline's final coverage " \
         "need the baseline arm 'soar_utility'" in index


def test_sweep_file_names_the_arms_and_accuracy_falls_back_to_metrics(tmp_path):
  root = tmp_path / "sweep"
  for lr, acc in (("1e-3", 0.25), ("1e-4", 0.75)):
    _write_run(root / f"difficulty__lr{lr}" / "seed_0", "coding", "difficulty", 0,
               [(s, {"eval/cruxeval_o": acc + 0.01 * s}) for s in (2, 4)])
  (root / "sweep.json").write_text(json.dumps({"cells": [
      {"arm": "difficulty,train.learning_rate=1e-3", "dir": "difficulty__lr1e-3/seed_0"},
      {"arm": "difficulty,train.learning_rate=1e-4", "dir": "difficulty__lr1e-4/seed_0"},
      {"arm": "difficulty,train.learning_rate=1e-4", "dir": "difficulty__lr1e-4/seed_1"}]}))
  index = report.write_report([root], tmp_path / "out", baseline="difficulty,train.learning_rate=1e-3",
                              log=lambda _: None)
  assert any("difficulty__lr1e-4/seed_1: no metrics yet" in line for line in index)
  table = _table(tmp_path / "out", "coding", "accuracy_in_domain")
  assert table["base"] is None and any(n.startswith("no base row: no step-0 evaluation") for n in table["notes"])
  # last step 4: window [3, 4] -> the evaluation at step 4 only; in-domain mean = CRUXEval-O alone
  assert _row(table, "difficulty,train.learning_rate=1e-4")["cruxeval_o"]["mean"] == pytest.approx(79.0)
  assert _row(table, "difficulty,train.learning_rate=1e-4")["in_domain_mean"]["mean"] == pytest.approx(79.0)
  assert math.isnan(_row(table, "difficulty,train.learning_rate=1e-4")["cruxeval_o"]["sd"] or math.nan)
  assert table["gains"][0]["cruxeval_o"] == pytest.approx(50.0)


def test_benchmarks_outside_the_paper_tables_go_to_accuracy_other(tmp_path):
  """AIME24 (in neither mean) gets its own table with the same rows; it changes neither paper table."""
  for seed, aime in ((0, 0.25), (1, 0.5)):
    _write_run(tmp_path / "runs" / f"seed_{seed}", "coding", "difficulty", seed,
               [(s, {"eval/aime24": aime + s / 100, "eval/math500": 0.5}) for s in (0, 4, 8)])
  index = report.write_report([tmp_path / "runs"], tmp_path / "out", log=lambda _: None)
  other = _table(tmp_path / "out", "coding", "accuracy_other")
  assert [c["key"] for c in other["columns"]] == ["aime24"]  # no mean column
  row = _row(other, "difficulty")
  assert row["aime24"]["values"] == pytest.approx([33.0, 58.0])  # last step 8: window [6, 8] -> step 8 alone
  assert other["base"]["aime24"]["values"] == pytest.approx([25.0, 50.0])
  out_of_domain = _table(tmp_path / "out", "coding", "accuracy_out_of_domain")
  assert _row(out_of_domain, "difficulty")["out_of_domain_mean"]["values"] == pytest.approx([50.0, 50.0])
  assert "`accuracy_in_domain`: not supported by these runs: none of its benchmarks was evaluated: LCB" in "\n".join(index)


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no metrics.jsonl in it or below it"),
    (lambda p: p / "absent", "absent: no such directory"),
    (lambda p: (p / "m.jsonl").write_text("") or p, "no metrics.jsonl in it or below it"),
])
def test_bad_input_is_one_line(tmp_path, capsys, make, message):
  target = make(tmp_path)
  assert report.main([str(target), f"--out={tmp_path / 'o'}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err


def test_run_without_config_and_bad_window(tmp_path, capsys):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
  assert report.main([str(tmp_path / "run")]) == 2
  assert "run: no config.json" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    report.main([str(tmp_path / "run"), "--window=5"])
  assert "--window: want START:END iterations, got '5'" in capsys.readouterr().err


def test_runs_sharing_arm_and_seed_are_flagged(tmp_path):
  for lr in ("a", "b"):
    _write_run(tmp_path / "runs" / lr, "lean", "difficulty", 0, [(1, {"coverage": 0.5})])
  index = report.write_report([tmp_path / "runs"], tmp_path / "out", log=lambda _: None)
  warnings = [line for line in index if line.startswith("- warning: ")]
  assert len(warnings) == 1 and "arm 'difficulty': seed 0 appears in 2 runs" in warnings[0]


def test_copy_cosine_table_by_hand(tmp_path):
  """Pooled in-band candidates per run, split at J > 0.8; out-of-band and cosine-less records ignored."""
  def cand(cos, j, reward, in_band=True):
    return {"type": "deduction", "cosine": cos, "jaccard": j, "reward": reward, "in_band": in_band}
  runs = {  # (arm, seed) -> {step: candidates}
      ("compassplay_cos", 0): {1: [cand(0.9, 1.0, 0.9), cand(0.1, 0.2, 0.1), cand(0.5, 0.9, 0.5, in_band=False)],
                               2: [cand(0.7, 0.85, 0.7), cand(-0.3, 0.8, -0.3)]},  # J = 0.8 is not a copy
      ("compassplay_cos", 1): {1: [cand(0.5, 0.95, 0.5)], 2: [cand(0.2, 0.1, 0.2), cand(None, 0.1, -0.5)]},
      ("compassplay_cos_novelty", 0): {1: [cand(0.8, 1.0, 0.0), cand(0.4, 0.5, 0.2)], 2: []},
  }
  for (arm, seed), steps in runs.items():
    _write_run(tmp_path / "runs" / arm / f"seed_{seed}", "coding", arm, seed,
               [(s, {"candidates": c, "copy_rate": 0.0}) for s, c in steps.items()])
  out = tmp_path / "report"
  report.write_report([tmp_path / "runs"], out, baseline="difficulty")
  table = _table(out, "coding", "copy_cosines")
  cos = _row(table, "compassplay_cos")
  # seed 0: copies 0.9, 0.7 -> 0.8; others 0.1, -0.3 -> -0.1. seed 1: copies 0.5; others 0.2.
  assert cos["cos_copies"]["values"] == pytest.approx([0.8, 0.5])
  assert cos["cos_others"]["values"] == pytest.approx([-0.1, 0.2])
  assert cos["cos_copies"]["mean"] == pytest.approx(0.65)
  assert cos["cos_copies"]["sd"] == pytest.approx(statistics.stdev([0.8, 0.5]))
  assert cos["n_copies"]["values"] == [2.0, 1.0] and cos["n_others"]["values"] == [2.0, 1.0]
  nov = _row(table, "compassplay_cos_novelty")
  assert nov["reward_copies"]["values"] == pytest.approx([0.0]) and nov["reward_others"]["values"] == pytest.approx([0.2])
  assert "copy_cosines" in (out / "report.md").read_text()


def test_copy_cosine_table_unsupported_without_candidate_jaccards(coding_runs, tmp_path):
  lines = report.write_report([coding_runs], tmp_path / "out", baseline="difficulty")
  assert any("copy_cosines" in line and "not supported" in line for line in lines)


def test_window_means_script_by_hand(tmp_path, capsys):
  import importlib.util
  spec = importlib.util.spec_from_file_location("window_means", REPO / "experiments" / "window_means.py")
  window_means = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(window_means)
  _write_run(tmp_path / "a" / "seed_0", "coding", "a", 0,
             [(1, {"copy_rate": 0.5}), (2, {"copy_rate": 1.0}), (3, {"other": 1.0}), (4, {"copy_rate": 0.0})])
  assert window_means.main([str(tmp_path), "--keys", "copy_rate", "--windows", "1:3,4:4,5:9"]) == 0
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a/")]
  assert rows == ["| a/seed_0 | 1–3 | 0.750 |", "| a/seed_0 | 4–4 | 0.000 |", "| a/seed_0 | 5–9 | nan |"]
