"""Does a proxy rank candidates by the reference-loss drop a real step on them gives? Pure numpy, no I/O.

experiments/proxy_vs_utility.py measures, per candidate x̃ and step size lr, the drop of the reference
loss after one SGD step on x̃ alone, drop = L_ref(θ) − L_ref(θ − lr·g(x̃)), and compares it with the
proxies a proposer reward could pay (the cosine, the raw inner product ⟨g(x̃), g_ref⟩, 1 − solve rate).
The first-order argument: drop ≈ lr·⟨g(x̃), g_ref⟩ for small lr (docs/experiments.md, "Does the cosine
track the loss drop of a real step?").

Conventions: Spearman's rho is the Pearson correlation of average ranks (ties share the mean of the
ranks they span); NaN when either side is constant. Bootstrap intervals resample candidates (pairs)
with replacement and take the percentile interval of rho over the resamples (numpy's linear
percentile); resamples where rho is undefined (a constant side) are dropped and counted.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def average_ranks(values: Sequence[float]) -> np.ndarray:
  """1-based ranks of `values`, ties given the mean of the ranks they span (float64)."""
  values = np.asarray(values, np.float64)
  _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
  ends = np.cumsum(counts).astype(np.float64)
  return ((ends - counts + 1 + ends) / 2.0)[inverse]


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
  """Pearson correlation; NaN for fewer than 2 points or a constant side."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.size < 2:
    return math.nan
  dx, dy = x - x.mean(), y - y.mean()
  denom = math.sqrt(float(np.dot(dx, dx)) * float(np.dot(dy, dy)))
  return float(np.dot(dx, dy) / denom) if denom > 0 else math.nan


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's rho (Pearson of average ranks); NaN when undefined."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f"spearman: want two equal-length 1-D arrays, got shapes {x.shape} and {y.shape}")
  return pearson(average_ranks(x), average_ranks(y))


def bootstrap_indices(n: int, resamples: int, seed: int) -> np.ndarray:
  """(resamples, n) row indices drawn with replacement, reproducible by `seed`."""
  return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_interval(x: Sequence[float], y: Sequence[float], indices: np.ndarray,
                       level: float = 0.95) -> tuple[float, float, int]:
  """(low, high, resamples used): the percentile interval of Spearman's rho over the resamples in
  `indices` (bootstrap_indices); resamples where rho is undefined are dropped."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  rhos = np.asarray([spearman(x[idx], y[idx]) for idx in indices], np.float64)
  rhos = rhos[~np.isnan(rhos)]
  if rhos.size == 0:
    return math.nan, math.nan, 0
  tail = (1.0 - level) / 2.0 * 100.0
  low, high = np.percentile(rhos, [tail, 100.0 - tail])
  return float(low), float(high), int(rhos.size)


def proxy_rows(drops: np.ndarray, lrs: Sequence[float], proxies: dict[str, Sequence[float]], *,
               resamples: int = 2000, seed: int = 0, level: float = 0.95) -> list[dict]:
  """One row per (step size, proxy): n, Spearman rho of drop vs proxy and its bootstrap interval.

  drops: (N, len(lrs)) measured reference-loss drops; proxies: {name: (N,) values}. The same resample
  indices serve every row, so rows are comparable (a paired bootstrap)."""
  drops = np.asarray(drops, np.float64)
  if drops.ndim != 2 or drops.shape[1] != len(lrs):
    raise ValueError(f"proxy_rows: drops has shape {drops.shape}, want (N, {len(lrs)})")
  n = drops.shape[0]
  indices = bootstrap_indices(n, resamples, seed)
  rows = []
  for j, lr in enumerate(lrs):
    for name, values in proxies.items():
      values = np.asarray(values, np.float64)
      if values.shape != (n,):
        raise ValueError(f"proxy_rows: proxy {name!r} has shape {values.shape}, want ({n},)")
      low, high, used = bootstrap_interval(values, drops[:, j], indices, level) if n >= 2 else (math.nan,) * 2 + (0,)
      rows.append({"lr": float(lr), "proxy": name, "n": n, "rho": spearman(values, drops[:, j]),
                   "low": low, "high": high, "resamples": used})
  return rows


def first_order(drops: Sequence[float], inner_products: Sequence[float], lr: float) -> dict:
  """The first-order prediction lr·⟨g, g_ref⟩ against the measured drops at one step size: Pearson r,
  Spearman rho, the least-squares slope through the origin (1 when the prediction is exact), the
  median ratio drop / prediction, the largest |drop − prediction| relative to max |prediction|, the
  share of drops with the prediction's sign, and the share of positive drops (the step helped)."""
  drops, pred = np.asarray(drops, np.float64), float(lr) * np.asarray(inner_products, np.float64)
  scale = float(np.max(np.abs(pred))) if pred.size else 0.0
  nonzero = np.abs(pred) > 0
  return {"lr": float(lr), "n": int(drops.size), "pearson": pearson(pred, drops), "spearman": spearman(pred, drops),
          "slope": float(np.dot(pred, drops) / np.dot(pred, pred)) if scale > 0 else math.nan,
          "median_ratio": float(np.median(drops[nonzero] / pred[nonzero])) if nonzero.any() else math.nan,
          "max_rel_error": float(np.max(np.abs(drops - pred)) / scale) if scale > 0 else math.nan,
          "sign_agrees": float(np.mean(np.sign(drops) == np.sign(pred))) if drops.size else math.nan,
          "positive": float(np.mean(drops > 0)) if drops.size else math.nan}


def _num(value: float, fmt: str) -> str:
  return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def markdown_rows(rows: Sequence[dict], subset: str) -> list[str]:
  """Table lines (no header) for proxy_rows' output: | subset | lr | proxy | n | rho | 95% interval |."""
  return [f"| {subset} | {r['lr']:g} | {r['proxy']} | {r['n']} | {_num(r['rho'], '+.2f')} | "
          f"[{_num(r['low'], '+.2f')}, {_num(r['high'], '+.2f')}] |" for r in rows]


def permutation_pvalue(x: Sequence[float], y: Sequence[float], *, resamples: int = 10000, seed: int = 0,
                       exact_up_to: int = 8) -> float:
  """Two-sided permutation p-value of Spearman's rho: the share of pairings of x with a permutation of
  y whose |rho| is at least the observed |rho| (within 1e-12). All n! permutations when
  n <= exact_up_to (the observed pairing among them), else `resamples` random ones plus the observed
  ((hits + 1) / (resamples + 1)). NaN when rho is undefined. For a handful of points, where a
  percentile bootstrap over candidates cannot be trusted, this is the test to read."""
  import itertools
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  observed = spearman(x, y)
  if math.isnan(observed):
    return math.nan
  rx, ry = average_ranks(x), average_ranks(y)
  threshold = abs(observed) - 1e-12
  if x.size <= exact_up_to:
    rhos = [pearson(rx, ry[list(p)]) for p in itertools.permutations(range(x.size))]
    return float(np.mean([abs(r) >= threshold for r in rhos]))
  rng = np.random.default_rng(seed)
  hits = sum(abs(pearson(rx, ry[rng.permutation(x.size)])) >= threshold for _ in range(resamples))
  return float((hits + 1) / (resamples + 1))
