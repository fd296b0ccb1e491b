"""The paper's two accuracy tables and accuracy figures on synthetic runs at the paper's cadence (2 methods x
3 seeds, 200 steps, evaluation every 5 plus the base model at step 0), against closed-form hand values.

Each run's accuracy on benchmark b is linear in the step: acc = B[b] + K[arm][b] * step / 200 + S[b] * seed.
Hand computation: the final quarter is the 11 evaluations at steps 150, 155, ..., 200, whose mean step is
175, so a run's number is B + 0.875 K + S * seed; over seeds 0, 1, 2 the mean is B + 0.875 K + S and the
sample s.d. is S. The base model (step 0) of every run is B + S * seed.
"""
import json
import math
import statistics

import pytest

from compassplay_jax.cli import report
from compassplay_jax.reports import paper_columns

IN_DOMAIN = list(paper_columns.IN_DOMAIN_COLUMNS)  # LCB, CRUXEval-I, CRUXEval-O
OUT_OF_DOMAIN = list(paper_columns.OUT_OF_DOMAIN_COLUMNS)  # MATH500, AMC23, GSM8K, Minerva, OlympiadBench
ARMS = ("difficulty", "compassplay_cos")  # the baseline first: the report puts its row first
SEEDS = (0, 1, 2)
B = dict(zip(IN_DOMAIN + OUT_OF_DOMAIN, (0.2040, 0.3520, 0.4110, 0.5230, 0.3000, 0.7150, 0.1830, 0.2270)))
S = dict(zip(IN_DOMAIN + OUT_OF_DOMAIN, (0.0120, 0.0080, 0.0150, 0.0100, 0.0250, 0.0060, 0.0090, 0.0110)))
K = {"difficulty": dict(zip(B, (0.0400, 0.0320, 0.0480, 0.0160, 0.0800, 0.0080, 0.0240, 0.0400))),
     "compassplay_cos": dict(zip(B, (0.0800, 0.0640, 0.0960, 0.0480, 0.1200, 0.0160, 0.0320, 0.0560)))}
COST_PER_STEP = {"difficulty": 36.0, "compassplay_cos": 54.0}  # accelerator-seconds, times (1 + 0.1 seed)


def _accuracy(arm, seed, benchmark, step):
  return B[benchmark] + K[arm][benchmark] * step / 200 + S[benchmark] * seed


@pytest.fixture(scope="module")
def paper_report(tmp_path_factory):
  """Runs as the loop writes them (step 0: the base model's eval/<benchmark> line; every 5th step an
  evaluation; every step its cost), and the report over them."""
  root = tmp_path_factory.mktemp("paper")
  for arm in ARMS:
    for seed in SEEDS:
      run = root / "runs" / arm / f"seed_{seed}"
      run.mkdir(parents=True)
      (run / "config.json").write_text(json.dumps({"setting": "coding", "seed": seed, "reward": {"name": arm}}))
      per_step = COST_PER_STEP[arm] * (1 + 0.1 * seed)
      lines = []
      for step in range(0, 201):
        record = {"step": step}
        if step:
          record.update({"cost/accelerator_s": per_step, "cost/accelerator_s_total": per_step * step})
        if step % 5 == 0:
          record.update({f"eval/{b}": _accuracy(arm, seed, b, step) for b in B})
        lines.append(json.dumps(record))
      (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  out = root / "report"
  index = report.write_report([root / "runs"], out, baseline="difficulty", log=lambda _: None)
  return out, index


def _hand_cells(benchmarks):
  """{row label: [(mean, sd) per column]} and {gain label: [gain per column]} in %, the mean column last."""
  def column_mean(f):
    return statistics.mean(f(b) for b in benchmarks)
  arm_mean = {arm: {b: 100 * (B[b] + 0.875 * K[arm][b] + S[b]) for b in benchmarks} for arm in ARMS}
  base_values = {b: [100 * (B[b] + S[b] * seed) for _ in ARMS for seed in SEEDS] for b in benchmarks}
  rows = {"base model (step 0)": [(statistics.mean(base_values[b]), statistics.stdev(base_values[b]))
                                  for b in benchmarks]}
  base_mean_column = [column_mean(lambda b: base_values[b][i]) for i in range(len(ARMS) * len(SEEDS))]
  rows["base model (step 0)"].append((statistics.mean(base_mean_column), statistics.stdev(base_mean_column)))
  for arm in ARMS:
    # per seed, the mean column is const + 100 * mean(S) * seed: s.d. over seeds 0, 1, 2 is 100 * mean(S)
    rows[arm] = [(arm_mean[arm][b], 100 * S[b]) for b in benchmarks]
    rows[arm].append((column_mean(lambda b: arm_mean[arm][b]), 100 * column_mean(lambda b: S[b])))
  gains = {}
  for arm in ARMS:  # an arm minus the base: 0.875 K (the seed terms cancel: both average seed 1)
    gains[f"Δ {arm} − base"] = [100 * 0.875 * K[arm][b] for b in benchmarks]
    gains[f"Δ {arm} − base"].append(column_mean(lambda b: 100 * 0.875 * K[arm][b]))
  diff = [100 * 0.875 * (K["compassplay_cos"][b] - K["difficulty"][b]) for b in benchmarks]
  gains["Δ compassplay_cos − difficulty"] = diff + [statistics.mean(diff)]
  return rows, gains


def _markdown_rows(path):
  return {cells[0]: cells[1:] for cells in
          ([c.strip() for c in line.strip().strip("|").split("|")] for line in path.read_text().splitlines()
           if line.startswith("| ") and not line.startswith("| arm "))}


@pytest.mark.parametrize("name, benchmarks, headers", [
    ("accuracy_in_domain", IN_DOMAIN, ["LCB", "CRUXEval-I", "CRUXEval-O", "mean"]),
    ("accuracy_out_of_domain", OUT_OF_DOMAIN, ["MATH500", "AMC23", "GSM8K", "Minerva", "OlympiadBench", "mean"]),
])
def test_both_tables_cell_by_cell(paper_report, name, benchmarks, headers):
  out, _ = paper_report
  table = json.loads((out / "coding" / f"{name}.json").read_text())
  assert [c["label"] for c in table["columns"]] == headers
  rows, gains = _hand_cells(benchmarks)
  markdown = (out / "coding" / f"{name}.md").read_text()
  assert markdown.splitlines()[2] == "| arm | seeds | " + " | ".join(headers) + " |"
  md = _markdown_rows(out / "coding" / f"{name}.md")
  assert list(md) == list(rows) + list(gains)  # base row, arms (baseline first), gains over base, over baseline
  for label, cells in rows.items():
    assert md[label][0] == ("6" if label.startswith("base") else "3")
    assert md[label][1:] == [f"{m:.2f} ± {sd:.2f}" for m, sd in cells], label  # two decimals, cell by cell
  for label, cells in gains.items():
    assert md[label][1:] == [f"{g:+.2f}" for g in cells], label
  # JSON: the same numbers unrounded, and the per-seed values
  json_rows = {r["arm"]: r for r in [table["base"]] + table["rows"]}
  keys = [c["key"] for c in table["columns"]]
  for label, cells in rows.items():
    for key, (m, sd) in zip(keys, cells):
      assert json_rows[label][key]["mean"] == pytest.approx(m) and json_rows[label][key]["sd"] == pytest.approx(sd)
  for arm in ARMS:
    for b in benchmarks:
      assert json_rows[arm][b]["values"] == pytest.approx([100 * (B[b] + 0.875 * K[arm][b] + S[b] * s) for s in SEEDS])
  base_gains = {f"Δ {g['arm']} − base": g for g in table["base_gains"]}
  arm_gains = {f"Δ {g['arm']} − {table['baseline']}": g for g in table["gains"]}
  for label, cells in gains.items():
    gain = {**base_gains, **arm_gains}[label]
    assert [gain[k] for k in keys] == pytest.approx(cells), label
  assert "final-quarter window (steps): 150–200" in markdown


def test_hand_values_in_the_paper_format(paper_report):
  """A few cells worked out on paper, as the table prints them."""
  out, _ = paper_report
  md = _markdown_rows(out / "coding" / "accuracy_in_domain.md")
  # LCB, compassplay_cos: 20.40 + 0.875 * 8.00 + 1.20 = 28.60, s.d. 1.20
  assert md["compassplay_cos"][1] == "28.60 ± 1.20"
  # LCB base: 20.40, 21.60, 22.80 twice: mean 21.60, s.d. sqrt(4 * 1.44 / 5) = 1.0733
  assert md["base model (step 0)"][1] == "21.60 ± 1.07"
  assert md["Δ compassplay_cos − base"][1] == "+7.00" and md["Δ difficulty − base"][1] == "+3.50"
  assert md["Δ compassplay_cos − difficulty"][1] == "+3.50"
  out_md = _markdown_rows(out / "coding" / "accuracy_out_of_domain.md")
  # GSM8K, difficulty: 71.50 + 0.875 * 0.80 + 0.60 = 72.80, s.d. 0.60
  assert out_md["difficulty"][3] == "72.80 ± 0.60"


def _trailing3(values):
  return [statistics.mean(values[max(0, i - 2):i + 1]) for i in range(len(values))]


def test_accuracy_figures_rolling_mean_error_bars_shade_and_hours(paper_report):
  out, index = paper_report
  for name in ("accuracy_vs_step", "accuracy_vs_accelerator_hours"):
    assert (out / "coding" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure `{name}`: [coding/{name}.png]" in "\n".join(index)
  by_step = json.loads((out / "coding" / "accuracy_vs_step.json").read_text())
  assert by_step["rolling"] == 3 and by_step["final_quarter"] == [150, 200]
  steps = list(range(0, 201, 5))
  lcb = IN_DOMAIN[0]
  for arm in ARMS:
    curve = by_step["panels"][lcb][arm]
    assert curve["x"] == steps and curve["seeds"] == 3
    # each seed smoothed (trailing 3 points, step 0 included), then the seed mean; the seed terms stay S * seed
    hand = [100 * (B[lcb] + K[arm][lcb] * t / 200 + S[lcb]) for t in _trailing3(steps)]
    assert hand[1] == pytest.approx(100 * (B[lcb] + K[arm][lcb] * 2.5 / 200 + S[lcb]))  # steps 0 and 5
    assert curve["mean"] == pytest.approx(hand)
    assert curve["sd"] == pytest.approx([100 * S[lcb]] * len(steps))  # the error bars
    in_domain = by_step["panels"]["in_domain_mean"][arm]["mean"]
    assert in_domain == pytest.approx([statistics.mean(100 * (B[b] + K[arm][b] * t / 200 + S[b]) for b in IN_DOMAIN)
                                       for t in _trailing3(steps)])
  by_hours = json.loads((out / "coding" / "accuracy_vs_accelerator_hours.json").read_text())
  assert list(by_hours["panels"]) == ["in_domain_mean", "out_of_domain_mean"]
  for arm in ARMS:
    point = by_hours["panels"]["out_of_domain_mean"][arm]
    # one point per evaluated step: the seeds' mean cumulative hours there (base model at 0 hours)
    assert point["step"] == steps
    assert point["x"] == pytest.approx([t * COST_PER_STEP[arm] * statistics.mean(1 + 0.1 * s for s in SEEDS) / 3600
                                        for t in steps])
    assert point["mean"] == pytest.approx(by_step["panels"]["out_of_domain_mean"][arm]["mean"])
    assert not math.isnan(point["sd"][-1])
