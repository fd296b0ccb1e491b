"""Proposer reward functions and the eligibility gate."""
import numpy as np
import pytest

from compassplay_jax.rewards.proposer_rewards import (AZR_CODE, AZR_PAPER, REWARD_FNS, RewardConfig, eligible,
                                                      proposer_rewards)

# Candidates: eligible, solve rate 0, solve rate 1, invalid, badly formatted, eligible.
COS = np.array([0.5, 0.9, 0.9, 0.9, 0.9, -0.2])
S = np.array([0.25, 0.0, 1.0, 0.5, 0.5, 0.875])
VALID = np.array([True, True, True, False, True, True])
FMT = np.array([True, True, True, True, False, True])
J = np.array([0.2, 0.0, 0.0, 0.0, 0.0, 0.5])


def rewards(name, config=AZR_CODE, **kw):
  args = dict(cosines=COS, solve_rates=S, valid=VALID, well_formatted=FMT, jaccard_to_seed=J, config=config)
  args.update(kw)
  return np.asarray(proposer_rewards(name, **args))


def test_each_reward_behind_the_azr_code_gate():
  gate = [-0.5, -0.5, -1.0, -1.0]  # s = 0, s = 1, invalid, bad format
  np.testing.assert_allclose(rewards("compassplay_cos"), [0.5] + gate + [-0.2])
  np.testing.assert_allclose(rewards("compassplay_cos_novelty"), [0.4] + gate + [-0.1])
  np.testing.assert_allclose(rewards("difficulty"), [0.75] + gate + [0.125])
  np.testing.assert_allclose(rewards("novelty_only"), [0.8] + gate + [0.5])


def test_paper_config_and_custom_values():
  np.testing.assert_allclose(rewards("difficulty", AZR_PAPER), [0.75, 0.0, 0.0, -0.5, -1.0, 0.125])
  custom = RewardConfig(bad_format=-3.0, invalid=-2.0, out_of_band=7.0)
  np.testing.assert_allclose(rewards("novelty_only", custom), [0.8, 7.0, 7.0, -2.0, -3.0, 0.5])
  np.testing.assert_array_equal(eligible(S, VALID, FMT), [True, False, False, False, False, True])


def test_bad_format_takes_precedence_and_defaults_are_all_valid():
  r = rewards("difficulty", valid=np.array([False] * 6), well_formatted=np.array([False, True] * 3))
  np.testing.assert_allclose(r, [-1.0] * 6)
  r = proposer_rewards("difficulty", solve_rates=S)  # valid / well_formatted default to True
  np.testing.assert_allclose(r, [0.75, -0.5, -0.5, 0.5, 0.5, 0.125])


def test_soar_utility_needs_its_measurement_and_ignores_the_band():
  imp = np.array([0.1, 0.2, -0.1, 0.3, 0.4, 0.0])
  np.testing.assert_allclose(rewards("soar_utility", heldout_improvement=imp), [0.1, 0.2, -0.1, -1.0, -1.0, 0.0],
                             atol=1e-7)
  with pytest.raises(ValueError, match="heldout_improvement"):
    rewards("soar_utility")


def test_unknown_name_and_missing_inputs_raise():
  assert set(REWARD_FNS) == {"compassplay_cos", "compassplay_cos_novelty", "difficulty", "novelty_only",
                             "soar_utility"}
  with pytest.raises(ValueError, match="unknown proposer reward"):
    rewards("nope")
  with pytest.raises(ValueError, match="jaccard_to_seed"):
    rewards("novelty_only", jaccard_to_seed=None)


def test_novelty_rewards_take_the_token_jaccard_of_novelty_py():
  novelty = pytest.importorskip("compassplay_jax.rewards.novelty")
  seed, cand = "def f(x):\n    return x + 1", "def g(y):\n    return y * 2 + 1"
  j = novelty.token_jaccard(cand, seed)
  r = proposer_rewards("compassplay_cos_novelty", cosines=[0.5], solve_rates=[0.5], jaccard_to_seed=[j])
  np.testing.assert_allclose(r, [0.5 * novelty.novelty(cand, seed)], rtol=1e-6)
