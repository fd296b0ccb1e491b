"""reports/stats.py against hand computations and numpy formulas written out independently."""
import math

import numpy as np
import pytest

from compassplay_jax.reports import stats


def test_final_quarter_of_the_paper_cadence_is_the_11_evaluations_150_to_200():
  steps = np.arange(5, 201, 5)  # 200 steps, evaluation every 5
  window = stats.final_window(steps)
  assert steps[window].tolist() == list(range(150, 201, 5)) and window.sum() == 11
  values = np.sin(steps)  # any values: the mean is over exactly those 11
  assert stats.final_quarter_mean(steps, values) == pytest.approx(np.mean([math.sin(s) for s in range(150, 201, 5)]))


def test_final_quarter_with_an_explicit_last_step_and_uneven_steps():
  # last step 10: window [7.5, 10] -> steps 8 and 10
  assert stats.final_quarter_mean([2, 4, 6, 8, 10], [1, 2, 3, 4, 6]) == pytest.approx(5.0)
  # the run's last step is 12 though the last evaluation was at 10: window [9, 12] -> step 10 only
  assert stats.final_quarter_mean([2, 4, 6, 8, 10], [1, 2, 3, 4, 6], last_step=12) == pytest.approx(6.0)
  assert math.isnan(stats.final_quarter_mean([], []))


def test_mean_and_sample_sd():
  mean, sd = stats.mean_sd([2.0, 4.0, 9.0])
  assert mean == pytest.approx(5.0)
  assert sd == pytest.approx(math.sqrt(((2 - 5) ** 2 + (4 - 5) ** 2 + (9 - 5) ** 2) / 2))  # n - 1 = 2
  assert stats.mean_sd([3.0])[0] == 3.0 and math.isnan(stats.mean_sd([3.0])[1])
  assert stats.mean_sd([1.0, float("nan"), 3.0]) == pytest.approx((2.0, math.sqrt(2)))
  assert all(math.isnan(x) for x in stats.mean_sd([]))


def test_three_point_trailing_rolling_mean():
  values = [3.0, 6.0, 9.0, 0.0, 3.0]
  # by hand: 3, (3+6)/2, (3+6+9)/3, (6+9+0)/3, (9+0+3)/3
  assert stats.rolling_mean(values, 3).tolist() == pytest.approx([3.0, 4.5, 6.0, 5.0, 4.0])
  rng = np.random.default_rng(0)
  x = rng.normal(size=40)
  full = np.convolve(x, np.ones(3) / 3, mode="valid")  # numpy's 3-point window from index 2 on
  assert stats.rolling_mean(x, 3)[2:] == pytest.approx(full)
  assert stats.rolling_mean(x, 1) == pytest.approx(x)
  with pytest.raises(ValueError):
    stats.rolling_mean(x, 0)


def test_gain_rows_are_seed_mean_differences_against_the_named_baseline():
  per_seed = {"difficulty": [10.0, 12.0, 14.0], "compassplay_cos": [15.0, 13.0, 17.0], "novelty_only": [9.0, 11.0]}
  gains = stats.gain_rows(per_seed, "difficulty")
  assert gains == pytest.approx({"compassplay_cos": 15.0 - 12.0, "novelty_only": 10.0 - 12.0})
  with pytest.raises(KeyError):
    stats.gain_rows(per_seed, "soar_utility")


def test_iterations_to_reach_and_value_at():
  steps = [1, 2, 3, 4, 5]
  coverage = [0.1, 0.2, 0.2, 0.35, 0.5]
  assert stats.iterations_to_reach(steps, coverage, 0.2) == 2  # reaching means >= target
  assert stats.iterations_to_reach(steps, coverage, 0.3) == 4
  assert stats.iterations_to_reach(steps, coverage, 0.6) is None
  assert stats.value_at(steps, coverage, 4) == 0.35
  assert math.isnan(stats.value_at(steps, coverage, 7))


def test_window_mean():
  assert stats.window_mean([1, 2, 3, 4, 5], [1, 2, 4, 8, 16], 3, 5) == pytest.approx(28 / 3)
  assert math.isnan(stats.window_mean([1, 2], [1, 2], 5, 6))


def test_copy_rate_curve_over_seeds_smoothed_per_seed():
  a = ([1, 2, 3, 4], [0.0, 0.3, 0.6, 0.3])
  b = ([1, 2, 3, 4], [0.6, 0.3, 0.0, 0.0])
  steps, mean, sd = stats.seed_curve([a, b], rolling=3)
  ra, rb = [0.0, 0.15, 0.3, 0.4], [0.6, 0.45, 0.3, 0.1]  # by hand, trailing 3-point
  assert steps.tolist() == [1, 2, 3, 4]
  assert mean == pytest.approx([(x + y) / 2 for x, y in zip(ra, rb)])
  assert sd == pytest.approx([abs(x - y) / math.sqrt(2) for x, y in zip(ra, rb)])  # two values: |a-b|/sqrt2


def test_seed_curve_with_a_seed_missing_steps():
  steps, mean, sd = stats.seed_curve([([1, 2, 3], [1.0, 2.0, 3.0]), ([1, 2], [3.0, 4.0])])
  assert steps.tolist() == [1, 2, 3]
  assert mean == pytest.approx([2.0, 3.0, 3.0])  # step 3: only the first seed
  assert sd[:2] == pytest.approx([math.sqrt(2), math.sqrt(2)]) and math.isnan(sd[2])
