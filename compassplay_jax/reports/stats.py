"""The paper's numbers from per-step series: pure functions on numpy arrays, no I/O.

Conventions (docs/experiments.md):
  * a run's number is the mean over its final quarter of steps: steps s with s >= 0.75 * last step
    (200 steps, evaluation every 5: the 11 evaluations at steps 150-200);
  * over seeds: mean ± sample standard deviation (ddof = 1; undefined for one seed);
  * a gain row is an arm's seed mean minus the baseline's seed mean;
  * curves are smoothed, where the paper does, by a 3-point trailing rolling mean.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

FINAL_FRACTION = 0.25


def final_window(steps: Sequence[float], last_step: float | None = None,
                 fraction: float = FINAL_FRACTION) -> np.ndarray:
  """Boolean mask of the steps in the final `fraction` of [0, last_step] (last_step: default the largest step)."""
  steps = np.asarray(steps, np.float64)
  if steps.size == 0:
    return np.zeros((0,), bool)
  last = float(steps.max()) if last_step is None else float(last_step)
  return (steps >= (1.0 - fraction) * last) & (steps <= last)


def final_quarter_mean(steps: Sequence[float], values: Sequence[float], last_step: float | None = None) -> float:
  """Mean of `values` over the final-quarter window of `steps` (NaN when the window is empty)."""
  values = np.asarray(values, np.float64)
  mask = final_window(steps, last_step)
  return float(values[mask].mean()) if mask.any() else math.nan


def window_mean(steps: Sequence[float], values: Sequence[float], start: float, end: float) -> float:
  """Mean of `values` at steps in [start, end] (NaN when none)."""
  steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  mask = (steps >= start) & (steps <= end)
  return float(values[mask].mean()) if mask.any() else math.nan


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
  """(mean, sample s.d.) over seeds, NaNs dropped; s.d. is NaN with fewer than two values."""
  values = np.asarray([v for v in values if v is not None and not math.isnan(v)], np.float64)
  if values.size == 0:
    return math.nan, math.nan
  return float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else math.nan


def rolling_mean(values: Sequence[float], window: int = 3) -> np.ndarray:
  """Trailing rolling mean: point i averages values[max(0, i - window + 1) .. i] (shorter at the start)."""
  values = np.asarray(values, np.float64)
  if window < 1:
    raise ValueError(f"rolling window must be >= 1, got {window}")
  sums = np.cumsum(np.concatenate([[0.0], values]))
  hi = np.arange(1, values.size + 1)
  lo = np.maximum(0, hi - window)
  return (sums[hi] - sums[lo]) / (hi - lo)


def gain_rows(seed_values: dict[str, Sequence[float]], baseline: str) -> dict[str, float]:
  """{arm: mean over its seeds - mean over the baseline's seeds} for every arm but the baseline."""
  if baseline not in seed_values:
    raise KeyError(baseline)
  base, _ = mean_sd(seed_values[baseline])
  return {arm: mean_sd(values)[0] - base for arm, values in seed_values.items() if arm != baseline}


def value_at(steps: Sequence[float], values: Sequence[float], step: float) -> float:
  """The value logged at `step` (NaN when that step is absent)."""
  steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  hits = np.flatnonzero(steps == step)
  return float(values[hits[-1]]) if hits.size else math.nan


def iterations_to_reach(steps: Sequence[float], values: Sequence[float], target: float) -> float | None:
  """The first step whose value is >= target (None when the run never reaches it)."""
  steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  hits = np.flatnonzero(values >= target)
  return float(steps[hits[0]]) if hits.size else None


def seed_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]], rolling: int = 1):
  """Mean and sample s.d. over seeds of per-seed (steps, values) curves, each first smoothed by a
  trailing rolling mean of `rolling` points. Returns (steps, mean, sd) on the union of steps; a seed
  without a step does not count there; sd is NaN where fewer than two seeds have the step."""
  all_steps = np.unique(np.concatenate([np.asarray(s, np.float64) for s, _ in curves])) if curves else np.zeros(0)
  table = np.full((len(curves), all_steps.size), np.nan)
  for i, (steps, values) in enumerate(curves):
    smoothed = rolling_mean(values, rolling) if rolling > 1 else np.asarray(values, np.float64)
    table[i, np.searchsorted(all_steps, np.asarray(steps, np.float64))] = smoothed
  counts = np.sum(~np.isnan(table), axis=0)
  with np.errstate(all="ignore"):
    mean = np.where(counts > 0, np.nansum(table, axis=0) / np.maximum(counts, 1), np.nan)
    sd = np.array([np.std(col[~np.isnan(col)], ddof=1) if n > 1 else np.nan for col, n in zip(table.T, counts)])
  return all_steps, mean, sd
