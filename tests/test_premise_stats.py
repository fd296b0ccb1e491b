"""The statistics of the premise experiments (reports/proxy.py): Spearman's rho with ties against a hand
computation, and the bootstrap interval's determinism. Pure numpy, well under a second."""
import math

import numpy as np

from compassplay_jax.reports import proxy


def test_spearman_with_ties_matches_a_hand_computation():
  x = [1.0, 2.0, 2.0, 3.0, 5.0]
  y = [2.0, 1.0, 4.0, 4.0, 3.0]
  # By hand: x ranks 1, 2.5, 2.5, 4, 5; y ranks 2, 1, 4.5, 4.5, 3 (ties share the mean rank).
  np.testing.assert_allclose(proxy.average_ranks(x), [1, 2.5, 2.5, 4, 5])
  np.testing.assert_allclose(proxy.average_ranks(y), [2, 1, 4.5, 4.5, 3])
  # Deviations from the mean rank 3: dx = -2, -.5, -.5, 1, 2; dy = -1, -2, 1.5, 1.5, 0.
  # sum dx dy = 2 + 1 - .75 + 1.5 + 0 = 3.75; sum dx^2 = 9.5; sum dy^2 = 9.5 -> rho = 3.75 / 9.5.
  assert math.isclose(proxy.spearman(x, y), 3.75 / 9.5, rel_tol=1e-12)
  assert math.isclose(proxy.spearman(y, x), 3.75 / 9.5, rel_tol=1e-12)
  assert math.isnan(proxy.spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # a constant side
  assert math.isclose(proxy.spearman([1.0, 2.0, 3.0], [10.0, 200.0, 3000.0]), 1.0)


def test_bootstrap_interval_is_deterministic_and_brackets_rho():
  rng = np.random.default_rng(3)
  x = rng.normal(size=20)
  y = x + rng.normal(scale=0.5, size=20)
  first = proxy.bootstrap_interval(x, y, proxy.bootstrap_indices(20, 200, seed=7))
  again = proxy.bootstrap_interval(x, y, proxy.bootstrap_indices(20, 200, seed=7))
  other = proxy.bootstrap_interval(x, y, proxy.bootstrap_indices(20, 200, seed=8))
  assert first == again
  assert first != other
  low, high, used = first
  assert low <= proxy.spearman(x, y) <= high and used == 200
  rows = proxy.proxy_rows(y[:, None], [1e-5], {"x": x, "-x": -x}, resamples=200, seed=0)
  assert rows == proxy.proxy_rows(y[:, None], [1e-5], {"x": x, "-x": -x}, resamples=200, seed=0)
  # The same resamples serve every proxy (paired): the interval of -x mirrors that of x.
  assert math.isclose(rows[0]["low"], -rows[1]["high"]) and math.isclose(rows[0]["high"], -rows[1]["low"])


def test_permutation_pvalue_exact_and_sampled():
  # n = 4, a perfect ordering: of the 24 pairings, exactly 2 reach |rho| = 1 (same and reversed order).
  assert math.isclose(proxy.permutation_pvalue([1, 2, 3, 4], [10, 20, 30, 40]), 2 / 24)
  assert math.isclose(proxy.permutation_pvalue([1, 2, 3, 4], [40, 30, 20, 10]), 2 / 24)
  assert math.isnan(proxy.permutation_pvalue([1, 1, 1], [1, 2, 3]))
  rng = np.random.default_rng(0)
  x = rng.normal(size=12)
  y = x + rng.normal(scale=0.3, size=12)
  p = proxy.permutation_pvalue(x, y, resamples=300, seed=1)
  assert p == proxy.permutation_pvalue(x, y, resamples=300, seed=1)  # reproducible by its seed
  assert 0 < p < 0.05
