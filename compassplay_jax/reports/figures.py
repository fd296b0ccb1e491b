"""The paper's figures from runs grouped by arm: one PNG each, mean ± s.d. over seeds per arm.

Every figure function takes ({arm: runs}, out_png) and returns the path written, or raises
tables.Unsupported with the reason the runs cannot give it.
"""
from __future__ import annotations

import math
import pathlib

import numpy as np

from compassplay_jax.evals.benchmarks import BENCHMARKS
from compassplay_jax.reports import stats
from compassplay_jax.reports.runs import DOMAIN_MEANS
from compassplay_jax.reports.tables import COPY_KEY, COST_KEY, COVERAGE_KEY, Unsupported

ROLLING = 3  # the paper smooths the per-iteration copy rate with a 3-point rolling mean
LABELS = {"in_domain_mean": "in-domain mean", "out_of_domain_mean": "out-of-domain mean",
          **{name: spec.display_name for name, spec in BENCHMARKS.items()}}


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _hours_at(run, steps) -> np.ndarray:
  """Cumulative accelerator-hours of a run at each of `steps` (NaN where the step logged no cost)."""
  cost_steps, cost = run.series(COST_KEY)
  return np.asarray([stats.value_at(cost_steps, cost, s) / 3600 for s in steps])


def arm_curve(arm_runs, series_fn, rolling: int = 1, x_hours: bool = False):
  """(x, mean, sd) of one arm over its seeds; x is the step, or the seeds' mean cumulative
  accelerator-hours at that step."""
  curves = [series_fn(r) for r in arm_runs]
  steps, mean, sd = stats.seed_curve(curves, rolling)
  if not x_hours:
    return steps, mean, sd
  _, hours_mean, _ = stats.seed_curve([(s, _hours_at(r, s)) for r, (s, _) in zip(arm_runs, curves)])
  keep = ~np.isnan(hours_mean)
  return hours_mean[keep], mean[keep], sd[keep]


def _panels(plt, arms, keys, series_for, *, ylabel, xlabel, rolling=1, x_hours=False, shade_final=False, title=""):
  cols = min(3, len(keys))
  rows = math.ceil(len(keys) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
  for ax, key in zip(axes.flat, keys):
    last = 0.0
    for arm, arm_runs in arms.items():
      x, mean, sd = arm_curve(arm_runs, lambda r: series_for(r, key), rolling, x_hours)
      if x.size == 0:
        continue
      line, = ax.plot(x, mean, marker="o", markersize=2.5, label=f"{arm} (n={len(arm_runs)})")
      ax.fill_between(x, mean - np.nan_to_num(sd), mean + np.nan_to_num(sd), color=line.get_color(), alpha=0.2)
      last = max(last, float(np.nanmax(x)))
    if shade_final and last > 0:
      ax.axvspan(0.75 * last, last, color="grey", alpha=0.12, label="final quarter")
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
  return fig


def _save(plt, fig, out_png) -> pathlib.Path:
  out_png = pathlib.Path(out_png)
  out_png.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out_png, dpi=120)
  plt.close(fig)
  return out_png


def _accuracy_keys(arms) -> list[str]:
  present = {k for rs in arms.values() for r in rs for accs in r.accuracy.values() for k in accs}
  return [k for k in DOMAIN_MEANS.values() if k in present] + [b for b in BENCHMARKS if b in present]


def _accuracy_pct(run, key):
  steps, values = run.accuracy_series(key)
  return steps, 100 * values


def accuracy_vs_step(arms, out_png) -> pathlib.Path:
  keys = _accuracy_keys(arms)
  if not keys:
    raise Unsupported("no evaluation results in these runs (evaluation runs when eval.every_steps > 0)")
  plt = _pyplot()
  fig = _panels(plt, arms, keys, _accuracy_pct, ylabel="accuracy (%)", xlabel="step", shade_final=True,
                title="Greedy accuracy against step (final quarter shaded)")
  return _save(plt, fig, out_png)


def _require_cost(arms):
  if not any(r.series(COST_KEY)[0].size for rs in arms.values() for r in rs):
    raise Unsupported(f"no {COST_KEY!r} metric in these runs (runs from before it was recorded)")


def accuracy_vs_accelerator_hours(arms, out_png) -> pathlib.Path:
  keys = [k for k in _accuracy_keys(arms) if k in DOMAIN_MEANS.values()] or _accuracy_keys(arms)
  if not keys:
    raise Unsupported("no evaluation results in these runs (evaluation runs when eval.every_steps > 0)")
  _require_cost(arms)
  plt = _pyplot()
  fig = _panels(plt, arms, keys, _accuracy_pct, ylabel="accuracy (%)", xlabel="cumulative accelerator-hours",
                x_hours=True, title="Greedy accuracy against cumulative accelerator-hours")
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
