"""The paper's figures from runs grouped by arm: one PNG each, mean ± s.d. over seeds per arm, and beside
it a JSON file with the plotted numbers.

Every figure function takes ({arm: runs}, out_png) and returns the path written, or raises
tables.Unsupported with the reason the runs cannot give it.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from compassplay_jax.evals.benchmarks import BENCHMARKS
from compassplay_jax.reports import paper_columns, stats
from compassplay_jax.reports.runs import BASE_STEP
from compassplay_jax.reports.tables import COPY_KEY, COST_KEY, COVERAGE_KEY, Unsupported, json_safe

ROLLING = 3  # the paper smooths its curves (copy rate, accuracy) with a 3-point rolling mean
LABELS = {**paper_columns.MEAN_LABELS, **{name: spec.display_name for name, spec in BENCHMARKS.items()},
          **{name: label for t in paper_columns.PAPER_TABLES for name, label in t.columns.items()}}


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _hours_at(run, steps) -> np.ndarray:
  """Cumulative accelerator-hours of a run at each of `steps` (NaN where the step logged no cost; the
  base model's step 0 is 0 hours unless logged)."""
  cost_steps, cost = run.series(COST_KEY)
  return np.asarray([0.0 if s == BASE_STEP and s not in cost_steps else stats.value_at(cost_steps, cost, s) / 3600
                     for s in steps])


def arm_curve(arm_runs, series_fn, rolling: int = 1, x_hours: bool = False):
  """(x, mean, sd, steps) of one arm over its seeds: each seed's curve smoothed by a `rolling`-point
  trailing mean, then mean and sample s.d. over seeds per step; x is the step, or the seeds' mean
  cumulative accelerator-hours at that step."""
  curves = [series_fn(r) for r in arm_runs]
  steps, mean, sd = stats.seed_curve(curves, rolling)
  if not x_hours:
    return steps, mean, sd, steps
  _, hours_mean, _ = stats.seed_curve([(s, _hours_at(r, s)) for r, (s, _) in zip(arm_runs, curves)])
  keep = ~np.isnan(hours_mean)
  return hours_mean[keep], mean[keep], sd[keep], steps[keep]


def _panels(plt, arms, keys, series_for, *, ylabel, xlabel, rolling=1, x_hours=False, shade_final=False,
            errorbars=False, title=""):
  """The figure and its numbers: {"panels": {key: {arm: {"x", "step", "mean", "sd", "seeds"}}}, ...}."""
  cols = min(3, len(keys))
  rows = math.ceil(len(keys) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
  last_step = max((r.last_step for rs in arms.values() for r in rs), default=0)
  final = ((1 - stats.FINAL_FRACTION) * last_step, last_step) if shade_final and last_step > 0 else None
  data = {"title": title, "xlabel": xlabel, "ylabel": ylabel, "rolling": rolling, "final_quarter": final,
          "panels": {}}
  for ax, key in zip(axes.flat, keys):
    data["panels"][key] = {}
    for arm, arm_runs in arms.items():
      x, mean, sd, steps = arm_curve(arm_runs, lambda r: series_for(r, key), rolling, x_hours)
      if x.size == 0:
        continue
      data["panels"][key][arm] = {"x": x.tolist(), "step": steps.tolist(), "mean": mean.tolist(),
                                  "sd": sd.tolist(), "seeds": len(arm_runs)}
      label = f"{arm} (n={len(arm_runs)})"
      if errorbars:
        ax.errorbar(x, mean, yerr=np.nan_to_num(sd), marker="o", markersize=2.5, capsize=2, elinewidth=0.8,
                    label=label)
      else:
        line, = ax.plot(x, mean, marker="o", markersize=2.5, label=label)
        ax.fill_between(x, mean - np.nan_to_num(sd), mean + np.nan_to_num(sd), color=line.get_color(), alpha=0.2)
    if final:
      ax.axvspan(*final, color="grey", alpha=0.12, label="final quarter")
    ax.set_title(LABELS.get(key, key), fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return fig, data


def _save(plt, fig_data, out_png) -> pathlib.Path:
  """Writes the PNG and, beside it, the plotted numbers as <name>.json."""
  fig, data = fig_data
  out_png = pathlib.Path(out_png)
  out_png.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out_png, dpi=120)
  plt.close(fig)
  out_png.with_suffix(".json").write_text(json.dumps(json_safe(data), indent=1) + "\n")
  return out_png


def _accuracy_keys(arms) -> list[str]:
  """The two means, the paper's columns in table order, then other benchmarks evaluated."""
  present = {k for rs in arms.values() for r in rs for accs in r.accuracy.values() for k in accs}
  paper = [b for t in paper_columns.PAPER_TABLES for b in t.columns]
  return ([k for k in paper_columns.MEANS if k in present] + [b for b in paper if b in present]
          + [b for b in BENCHMARKS if b in present and b not in paper])


def _accuracy_pct(run, key):
  steps, values = run.accuracy_series(key)
  return steps, 100 * values


def accuracy_vs_step(arms, out_png) -> pathlib.Path:
  keys = _accuracy_keys(arms)
  if not keys:
    raise Unsupported("no evaluation results in these runs (evaluation runs when eval.every_steps > 0)")
  plt = _pyplot()
  fig = _panels(plt, arms, keys, _accuracy_pct, ylabel=f"accuracy (%, {ROLLING}-pt rolling mean)", xlabel="step",
                rolling=ROLLING, shade_final=True, errorbars=True,
                title="Greedy accuracy against step (step 0: base model; final quarter shaded)")
  return _save(plt, fig, out_png)


def _require_cost(arms):
  if not any(r.series(COST_KEY)[0].size for rs in arms.values() for r in rs):
    raise Unsupported(f"no {COST_KEY!r} metric in these runs (runs from before it was recorded)")


def accuracy_vs_accelerator_hours(arms, out_png) -> pathlib.Path:
  keys = [k for k in _accuracy_keys(arms) if k in paper_columns.MEANS] or _accuracy_keys(arms)
  if not keys:
    raise Unsupported("no evaluation results in these runs (evaluation runs when eval.every_steps > 0)")
  _require_cost(arms)
  plt = _pyplot()
  fig = _panels(plt, arms, keys, _accuracy_pct, ylabel=f"accuracy (%, {ROLLING}-pt rolling mean)",
                xlabel="cumulative accelerator-hours (evaluation excluded)", rolling=ROLLING, x_hours=True,
                errorbars=True, title="Greedy accuracy against cumulative accelerator-hours (one point per step)")
  return _save(plt, fig, out_png)


def _require(arms, key, why):
  if not any(r.series(key)[0].size for rs in arms.values() for r in rs):
    raise Unsupported(f"no {key!r} metric in these runs{why}")


def copy_rate_vs_iteration(arms, out_png) -> pathlib.Path:
  _require(arms, COPY_KEY, "")
  plt = _pyplot()
  fig = _panels(plt, arms, [COPY_KEY], lambda r, k: r.series(k), ylabel=f"copy rate ({ROLLING}-pt rolling mean)",
                xlabel="iteration", rolling=ROLLING, title="Copy rate (token-Jaccard to the seed > 0.8)")
  return _save(plt, fig, out_png)


def coverage_vs_iteration(arms, out_png) -> pathlib.Path:
  _require(arms, COVERAGE_KEY, " (Lean runs log it)")
  plt = _pyplot()
  fig = _panels(plt, arms, [COVERAGE_KEY], lambda r, k: r.series(k), ylabel="cumulative coverage",
                xlabel="iteration", title="Cumulative coverage against iteration")
  return _save(plt, fig, out_png)


def coverage_vs_accelerator_hours(arms, out_png) -> pathlib.Path:
  _require(arms, COVERAGE_KEY, " (Lean runs log it)")
  _require_cost(arms)
  plt = _pyplot()
  fig = _panels(plt, arms, [COVERAGE_KEY], lambda r, k: r.series(k), ylabel="cumulative coverage",
                xlabel="cumulative accelerator-hours", x_hours=True,
                title="Cumulative coverage against accelerator-hours")
  return _save(plt, fig, out_png)


FIGURES = {
    "accuracy_vs_step": accuracy_vs_step,
    "accuracy_vs_accelerator_hours": accuracy_vs_accelerator_hours,
    "copy_rate_vs_iteration": copy_rate_vs_iteration,
    "coverage_vs_iteration": coverage_vs_iteration,
    "coverage_vs_accelerator_hours": coverage_vs_accelerator_hours,
}
