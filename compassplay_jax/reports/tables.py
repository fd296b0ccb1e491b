"""The paper's tables from runs grouped by arm: numbers (pure, from reports.stats) and their markdown/JSON.

Every table builder takes {arm: [runs of that arm, one per seed]} and returns a Table, or raises
Unsupported with the reason the runs cannot give it.
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from compassplay_jax.evals.benchmarks import BENCHMARKS
from compassplay_jax.reports import paper_columns, stats
from compassplay_jax.reports.runs import BASE_STEP
from compassplay_jax.rewards.novelty import COPY_THRESHOLD
from compassplay_jax.selfplay.records import CandidateRecord

ACCURACY_DIGITS = 2  # the paper's tables give accuracies (%) to two decimals
OTHER_ACCURACY = "accuracy_other"  # benchmarks evaluated but in neither paper table (AIME, ...)
BASE_LABEL = "base model (step 0)"
SOLVED_KEY = "coverage/solved"  # Lean: targets proved so far (cumulative)
COVERAGE_KEY = "coverage"  # Lean: fraction of targets proved so far
COPY_KEY = "copy_rate"  # in-band conjectures (Lean) / valid proposals (coding) with token-Jaccard > 0.8
COST_KEY = "cost/accelerator_s_total"  # wall time x devices, summed over steps


class Unsupported(Exception):
  """The runs' metrics cannot give this table or figure; the message says why."""


@dataclasses.dataclass
class Column:
  key: str
  label: str
  digits: int = 3
  gain: bool = True  # whether gain rows cover this column


@dataclasses.dataclass
class Table:
  name: str  # file stem
  title: str
  columns: list[Column]
  rows: list[dict]  # {"arm", "seeds", <column key>: {"mean", "sd", "values"}}
  baseline: str | None = None
  gains: list[dict] = dataclasses.field(default_factory=list)  # {"arm", <column key>: arm mean - baseline mean}
  notes: list[str] = dataclasses.field(default_factory=list)
  base: dict | None = None  # accuracy tables: {"arm": BASE_LABEL, "seeds": runs, <column key>: cell} at step 0
  base_gains: list[dict] = dataclasses.field(default_factory=list)  # {"arm", <column key>: arm mean - base mean}


def _cell(values) -> dict:
  mean, sd = stats.mean_sd(values)
  return {"mean": mean, "sd": sd, "values": [float(v) for v in values]}


def _fill(table: Table, per_seed: dict[str, dict[str, list[float]]], baseline: str | None) -> Table:
  """Rows (mean ± s.d. over seeds) and gain rows against `baseline` from {arm: {column: per-seed values}}."""
  for arm, columns in per_seed.items():
    row = {"arm": arm, "seeds": max((len(v) for v in columns.values()), default=0)}
    row.update({c.key: _cell(columns[c.key]) for c in table.columns if c.key in columns})
    table.rows.append(row)
  gain_columns = [c for c in table.columns if c.gain]
  if baseline is None or not gain_columns:
    return table
  if baseline not in per_seed:
    table.notes.append(f"no gain rows: baseline {baseline!r} is not among the arms ({', '.join(per_seed)})")
    return table
  table.baseline = baseline
  by_column = {c.key: stats.gain_rows({arm: cols.get(c.key, []) for arm, cols in per_seed.items()}, baseline)
               for c in gain_columns}
  for arm in per_seed:
    if arm != baseline:
      table.gains.append({"arm": arm, **{key: gains[arm] for key, gains in by_column.items()}})
  return table


def _accuracy_columns(name: str, present: set[str]) -> tuple[dict[str, str], str | None]:
  """(benchmark -> header, mean key or None) of one accuracy table."""
  for spec in paper_columns.PAPER_TABLES:
    if spec.name == name:
      return spec.columns, spec.mean_key
  if name != OTHER_ACCURACY:
    raise ValueError(f"unknown accuracy table {name!r}")
  others = [b for b in BENCHMARKS if b in present and b not in paper_columns.PAPER_BENCHMARKS]
  return {b: BENCHMARKS[b].display_name for b in others}, None


def accuracy_table(arms, name: str = "accuracy_in_domain", baseline: str | None = "difficulty") -> Table:
  """One of the paper's accuracy tables (paper_columns.PAPER_TABLES; or OTHER_ACCURACY: every other
  evaluated benchmark), in %. A row per arm: each run's number is the mean of its evaluations in the
  final quarter of its steps (step 0 never counts), then mean ± sample s.d. over seeds. The base row is
  the step-0 evaluation (the base model), mean ± s.d. over every run that has one. Gain rows: each arm's
  mean minus the base mean, and each arm's mean minus the baseline arm's."""
  runs = [r for rs in arms.values() for r in rs]
  present = {k for r in runs for accs in r.accuracy.values() for k in accs}
  if not present:
    raise Unsupported("no evaluation results in these runs (eval/step_*/results.json or eval/* metrics; "
                      "evaluation runs when eval.every_steps > 0)")
  benchmarks, mean_key = _accuracy_columns(name, present)
  if not benchmarks:
    raise Unsupported("every benchmark evaluated is in the paper's two tables")
  if not any(b in present for b in benchmarks):
    raise Unsupported("none of its benchmarks was evaluated: "
                      + ", ".join(f"{label} ({b})" for b, label in benchmarks.items()))
  columns = [Column(b, label, digits=ACCURACY_DIGITS) for b, label in benchmarks.items()]
  if mean_key:
    columns.append(Column(mean_key, "mean", digits=ACCURACY_DIGITS))
  title = next((t.title for t in paper_columns.PAPER_TABLES if t.name == name), "Other benchmarks: accuracy (%)")
  table = Table(name, f"{title}: mean over the final quarter of steps; mean ± s.d. over seeds", columns, [])
  per_seed = {}
  for arm, arm_runs in arms.items():
    per_seed[arm] = {c.key: [100 * stats.final_quarter_mean(*r.accuracy_series(c.key, base=False),
                                                             last_step=r.last_step) for r in arm_runs]
                     for c in columns}
  windows = sorted({(math.ceil((1 - stats.FINAL_FRACTION) * r.last_step), r.last_step) for r in runs})
  table.notes.append("final-quarter window (steps): " + ", ".join(f"{a}–{b}" for a, b in windows))
  missing = [f"{label} ({b})" for b, label in benchmarks.items() if b not in present]
  if missing:
    table.notes.append("not evaluated in these runs: " + ", ".join(missing)
                       + ("; the mean is over the other columns" if mean_key else ""))
  _fill(table, per_seed, baseline)
  _add_base(table, runs, per_seed)
  return table


def _add_base(table: Table, runs, per_seed: dict[str, dict[str, list[float]]]) -> None:
  """The base row from the runs' step-0 evaluations, and each arm's gain over it."""
  based = [r for r in runs if BASE_STEP in r.accuracy]
  if not based:
    table.notes.append(f"no base row: no step-{BASE_STEP} evaluation in these runs (the loop evaluates the base "
                       "model before its first step when evaluation is on; runs from before that have none)")
    return
  table.base = {"arm": BASE_LABEL, "seeds": len(based)}
  for c in table.columns:
    table.base[c.key] = _cell([100 * r.accuracy[BASE_STEP][c.key] if c.key in r.accuracy[BASE_STEP] else math.nan
                               for r in based])
  table.notes.append(f"base row: the step-{BASE_STEP} evaluation (before any update), mean ± s.d. over the "
                     f"{len(based)} of {len(runs)} runs that have one, all arms together (one model)")
  for arm, columns in per_seed.items():
    table.base_gains.append({"arm": arm, **{c.key: stats.mean_sd(columns[c.key])[0] - table.base[c.key]["mean"]
                                            for c in table.columns}})


def _common_last_step(runs) -> int:
  return min(r.last_step for r in runs)


def ablation_table(arms, baseline: str | None = "difficulty", copy_at: int | None = None,
                   window: tuple[float, float] | None = None) -> Table:
  """The cos × novelty ablation: copy rate at one iteration and solved problems averaged over an
  iteration window, with the gain in solved problems over the baseline."""
  runs = [r for rs in arms.values() for r in rs]
  has_copy = any(r.series(COPY_KEY)[0].size for r in runs)
  has_solved = any(r.series(SOLVED_KEY)[0].size for r in runs)
  if not has_copy and not has_solved:
    raise Unsupported(f"neither {COPY_KEY!r} nor {SOLVED_KEY!r} is in these runs' metrics")
  last = _common_last_step(runs)
  copy_at = last if copy_at is None else copy_at
  start, end = window if window is not None else (math.ceil(0.75 * last), last)
  columns, notes = [], []
  if has_copy:
    columns.append(Column(COPY_KEY, f"copy rate @ it {copy_at}", digits=3, gain=False))
  else:
    notes.append(f"copy rate: not supported by these runs: no {COPY_KEY!r} metric")
  if has_solved:
    columns.append(Column(SOLVED_KEY, f"solved problems, mean over it {start:g}–{end:g}", digits=2))
  else:
    notes.append(f"solved problems: not supported by these runs: no {SOLVED_KEY!r} metric (Lean runs log it)")
  table = Table("ablation", "Cos × novelty ablation; mean ± s.d. over seeds", columns, [], notes=notes)
  per_seed = {}
  for arm, arm_runs in arms.items():
    per_seed[arm] = {}
    if has_copy:
      per_seed[arm][COPY_KEY] = [stats.value_at(*r.series(COPY_KEY), copy_at) for r in arm_runs]
    if has_solved:
      per_seed[arm][SOLVED_KEY] = [stats.window_mean(*r.series(SOLVED_KEY), start, end) for r in arm_runs]
  return _fill(table, per_seed, baseline)


def reach_table(arms, baseline: str | None = "difficulty") -> Table:
  """Final cumulative coverage, and the iterations each arm needs to reach the baseline's final
  coverage (the baseline's seed mean at its last iteration)."""
  runs = [r for rs in arms.values() for r in rs]
  if not any(r.series(COVERAGE_KEY)[0].size for r in runs):
    raise Unsupported(f"no {COVERAGE_KEY!r} metric in these runs (Lean runs log it)")
  if baseline is None or baseline not in arms:
    raise Unsupported(f"iterations to reach the baseline's final coverage need the baseline arm {baseline!r} "
                      f"(arms: {', '.join(arms)})")
  finals = {arm: [r.series(COVERAGE_KEY)[1][-1] if r.series(COVERAGE_KEY)[1].size else math.nan for r in rs]
            for arm, rs in arms.items()}
  target = stats.mean_sd(finals[baseline])[0]
  table = Table("iterations_to_reach", f"Cumulative coverage and iterations to reach {baseline}'s final coverage "
                f"({target:.4f}); mean ± s.d. over seeds that reach it",
                [Column("final_coverage", "final coverage", digits=4, gain=True),
                 Column("iterations_to_reach", "iterations to reach", digits=1, gain=False),
                 Column("reached", "seeds reaching", gain=False)], [])
  per_seed = {}
  for arm, arm_runs in arms.items():
    reached = [stats.iterations_to_reach(*r.series(COVERAGE_KEY), target) for r in arm_runs]
    per_seed[arm] = {"final_coverage": finals[arm], "iterations_to_reach": [x for x in reached if x is not None]}
  _fill(table, per_seed, baseline)
  for row, arm in zip(table.rows, arms):
    hits = len(per_seed[arm]["iterations_to_reach"])
    row["reached"] = f"{hits}/{len(arms[arm])}"
    row["seeds"] = len(arms[arm])
  table.notes.append(f"target: {baseline}'s final coverage, mean over its {len(arms[baseline])} seed(s) = {target:.6g}")
  return table


def cost_table(arms) -> Table:
  """Steps reached and accelerator-hours (wall time × devices, summed over steps) per arm."""
  runs = [r for rs in arms.values() for r in rs]
  if not any(r.series(COST_KEY)[0].size for r in runs):
    raise Unsupported(f"no {COST_KEY!r} metric in these runs (runs from before it was recorded)")
  table = Table("cost", "Steps and accelerator-hours (wall time × devices); mean ± s.d. over seeds",
                [Column("steps", "steps reached", digits=1, gain=False),
                 Column("accelerator_hours", "accelerator-hours", digits=4, gain=False)], [])
  per_seed = {arm: {"steps": [float(r.last_step) for r in rs],
                    "accelerator_hours": [r.series(COST_KEY)[1][-1] / 3600 if r.series(COST_KEY)[1].size else math.nan
                                          for r in rs]}
              for arm, rs in arms.items()}
  return _fill(table, per_seed, None)


def _copy_split(run, start: int, end: int) -> dict[str, list[float]]:
  """A run's in-band candidate records with a cosine and a Jaccard, steps start..end, split at the copy threshold."""
  out = {"copies": [], "others": [], "reward_copies": [], "reward_others": []}
  for record in run.records:
    if not start <= record["step"] <= end:
      continue
    for c in map(CandidateRecord.from_json, record.get("candidates") or []):
      if c.in_band and c.cosine is not None and c.jaccard is not None:
        side = "copies" if c.jaccard > COPY_THRESHOLD else "others"
        out[side].append(float(c.cosine))
        out["reward_" + side].append(float(c.reward))
  return out


def copy_cosine_table(arms, window: tuple[float, float] | None = None) -> Table:
  """Why the local-reference shortcut pays copies: the mean cosine and reward of in-band copies of the
  seed (token-Jaccard > 0.8) against the other in-band candidates, pooled over a run's steps (coding
  runs' per-candidate records); mean ± s.d. over seeds."""
  runs = [r for rs in arms.values() for r in rs]
  records = [CandidateRecord.from_json(c)
             for r in runs for record in r.records for c in record.get("candidates") or []]
  if not any(c.jaccard is not None and c.cosine is not None for c in records):
    raise Unsupported("no candidate records with both a cosine and a token-Jaccard (coding runs with a "
                      "cosine reward record them)")
  start, end = window if window is not None else (1, _common_last_step(runs))
  table = Table("copy_cosines", f"In-band candidates, steps {start:g}–{end:g}: copies of the seed (J > "
                f"{COPY_THRESHOLD}) vs the rest; mean ± s.d. over seeds of each run's pooled mean",
                [Column("cos_copies", "cosine, copies", gain=False), Column("cos_others", "cosine, others", gain=False),
                 Column("reward_copies", "reward, copies", gain=False),
                 Column("reward_others", "reward, others", gain=False),
                 Column("n_copies", "copies", digits=0, gain=False), Column("n_others", "others", digits=0, gain=False)],
                [])
  per_seed = {}
  for arm, arm_runs in arms.items():
    splits = [_copy_split(r, start, end) for r in arm_runs]
    mean = lambda xs: float(np.mean(xs)) if xs else math.nan  # noqa: E731
    per_seed[arm] = {"cos_copies": [mean(s["copies"]) for s in splits],
                     "cos_others": [mean(s["others"]) for s in splits],
                     "reward_copies": [mean(s["reward_copies"]) for s in splits],
                     "reward_others": [mean(s["reward_others"]) for s in splits],
                     "n_copies": [float(len(s["copies"])) for s in splits],
                     "n_others": [float(len(s["others"])) for s in splits]}
  return _fill(table, per_seed, None)


# ---- rendering -------------------------------------------------------------------------------------

def _number(value, digits: int) -> str:
  return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _mean_sd_text(cell, digits: int) -> str:
  if not isinstance(cell, dict):
    return str(cell)
  mean, sd = cell["mean"], cell["sd"]
  if math.isnan(mean):
    return "–"
  return _number(mean, digits) + ("" if math.isnan(sd) else f" ± {_number(sd, digits)}")


def to_markdown(table: Table) -> str:
  header = ["arm", "seeds"] + [c.label for c in table.columns]
  lines = [f"## {table.title}", "", "| " + " | ".join(header) + " |",
           "|---|---:|" + "---:|" * len(table.columns)]
  for row in ([table.base] if table.base else []) + table.rows:
    cells = [row["arm"], str(row["seeds"])] + [_mean_sd_text(row.get(c.key, {"mean": math.nan, "sd": math.nan}),
                                                              c.digits) for c in table.columns]
    lines.append("| " + " | ".join(cells) + " |")
  gain_rows = [(f"Δ {g['arm']} − base", g) for g in table.base_gains]
  gain_rows += [(f"Δ {g['arm']} − {table.baseline}", g) for g in table.gains]
  for label, gain in gain_rows:
    cells = [label, ""]
    for c in table.columns:
      value = gain.get(c.key)
      cells.append("" if value is None else ("–" if math.isnan(value) else f"{value:+.{c.digits}f}"))
    lines.append("| " + " | ".join(cells) + " |")
  lines += [""] + [f"- {note}" for note in table.notes]
  return "\n".join(lines).rstrip() + "\n"


def json_safe(value):
  if isinstance(value, float) and math.isnan(value):
    return None
  if isinstance(value, dict):
    return {k: json_safe(v) for k, v in value.items()}
  if isinstance(value, list):
    return [json_safe(v) for v in value]
  if isinstance(value, np.generic):
    return json_safe(value.item())
  return value


def to_json(table: Table) -> str:
  """The table as JSON (NaN as null): columns, rows with per-seed values, gain rows, notes."""
  return json.dumps(json_safe(dataclasses.asdict(table)), indent=2) + "\n"
