"""Proposer rewards over a batch of candidates, selected by name. Pure functions of arrays.

Every reward goes through the same eligibility gate, in this order of precedence:
  1. not well formatted (tags/answer block unparsable)   -> config.bad_format
  2. invalid (validity checks failed)                     -> config.invalid
  3. solve rate outside the open band (0, 1)               -> config.out_of_band
  4. otherwise the named score:
       compassplay_cos          r_cos(x)                       (gradient-alignment cosine)
       compassplay_cos_novelty  r_cos(x) * (1 - J(x, seed))     (J: token Jaccard, rewards/novelty.py)
       difficulty               1 - s                           (AZR learnability; s = solve rate)
       novelty_only             1 - J(x, seed)
       soar_utility             measured held-out improvement of a trained solver copy (rewards/soar.py)

Defaults and their sources (docs/paper_settings.md §4.1):
  AZR_CODE (the default, matches the released AZR models; reward_managers.py L400-436):
    bad_format = -1, invalid = -1 (any validity failure zeroes the format score), out_of_band = -0.5.
  AZR_PAPER (Eq. 4 and Eq. 6 of the AZR paper; see AZR issue #37 for the mismatch):
    bad_format = -1, invalid = -0.5 ("wrong but well-formatted"; our reading of Eq. 6),
    out_of_band = 0 (Eq. 4: r_propose = 0 when the solve rate is 0 or 1).
Note that r_cos can be negative, so an eligible candidate can score below out_of_band; choose the
values for the experiment at hand.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Values given to ineligible candidates, and the solve-rate band (open interval)."""
  bad_format: float = -1.0
  invalid: float = -1.0
  out_of_band: float = -0.5
  band_low: float = 0.0
  band_high: float = 1.0
  # SOAR's reward has no solve rate: only the format/validity gate applies unless this is True.
  soar_uses_band: bool = False


AZR_CODE = RewardConfig()
AZR_PAPER = RewardConfig(bad_format=-1.0, invalid=-0.5, out_of_band=0.0)


def _f32(x, name):
  if x is None:
    raise ValueError(f"proposer reward needs {name!r}")
  return jnp.asarray(x, jnp.float32)


def compassplay_cos(*, cosines=None, **_):
  """r_cos: the gradient-alignment cosine (rewards/cosines.py; 0 for a no-loss-token candidate)."""
  return _f32(cosines, "cosines")


def compassplay_cos_novelty(*, cosines=None, jaccard_to_seed=None, **_):
  """r_cos x (1 - J(x, seed))."""
  return _f32(cosines, "cosines") * (1.0 - _f32(jaccard_to_seed, "jaccard_to_seed"))


def difficulty(*, solve_rates=None, **_):
  """AZR learnability 1 - s (the gate already removed s in {0, 1})."""
  return 1.0 - _f32(solve_rates, "solve_rates")


def novelty_only(*, jaccard_to_seed=None, **_):
  """1 - J(x, seed)."""
  return 1.0 - _f32(jaccard_to_seed, "jaccard_to_seed")


def soar_utility(*, heldout_improvement=None, **_):
  """SOAR's grounded teacher reward (docs/paper_settings.md §11), given its measurement.

  The reward itself is a pure function; its input is measured by the loop (selfplay/soar_measure.py
  with rewards/soar.py): candidates are cut into groups of reward.soar_group_size, a copy of the
  solver takes reward.soar_inner_steps SGD steps on each group's verified tasks, and
  heldout_improvement[i] is that copy's gain on held-out problems for the group of candidate i:
  greedy accuracy after minus before (reward.soar_signal = "accuracy", SOAR's reward) or L_H(before) -
  L_H(after), L_H the held-out gold solutions' mean NLL ("nll"). Every candidate in a group gets the
  same value. (SOAR trains its copies with RLOO and averages several student runs; docs/rewards.md
  lists the differences.)
  """
  return _f32(heldout_improvement, "heldout_improvement")


# The reward names and their sets: the one home of both (config_base.check_config checks the name).
SOAR_UTILITY = "soar_utility"
REWARD_FNS: dict[str, Callable] = {
    "compassplay_cos": compassplay_cos,
    "compassplay_cos_novelty": compassplay_cos_novelty,
    "difficulty": difficulty,
    "novelty_only": novelty_only,
    SOAR_UTILITY: soar_utility,
}

# The rewards that read a gradient cosine (a run with one of them computes g_ref and the cosines).
COSINE_REWARDS: frozenset[str] = frozenset({"compassplay_cos", "compassplay_cos_novelty"})
# The rewards with the novelty factor (1 - J): a candidate with J = 1 to its seed (every verbatim copy)
# scores exactly 0 under them.
NOVELTY_REWARDS: frozenset[str] = frozenset({"compassplay_cos_novelty", "novelty_only"})


def uses_cosine(name: str) -> bool:
  """True when the named proposer reward is paid by the gradient cosine."""
  return name in COSINE_REWARDS


def uses_novelty(name: str) -> bool:
  """True when the named proposer reward has the novelty factor 1 - J(x, seed)."""
  return name in NOVELTY_REWARDS


def in_band(solve_rates, config: RewardConfig = AZR_CODE):
  """band_low < s < band_high (default 0 < s < 1: the solver sometimes, not always, succeeds). The
  one home of the band rule; a float gives a bool, an array an array."""
  if isinstance(solve_rates, (int, float, np.floating)):
    return bool(config.band_low < solve_rates < config.band_high)
  s = _f32(solve_rates, "solve_rates")
  return (s > config.band_low) & (s < config.band_high)


def eligible(solve_rates, valid, well_formatted, config: RewardConfig = AZR_CODE):
  """(N,) bool: well formatted, valid and in the band."""
  s = _f32(solve_rates, "solve_rates")
  return _mask(well_formatted, s) & _mask(valid, s) & in_band(s, config)


def _mask(x, like):
  return jnp.ones(like.shape, bool) if x is None else jnp.asarray(x).astype(bool)


def proposer_rewards(name, *, cosines=None, solve_rates=None, valid=None, well_formatted=None, jaccard_to_seed=None,
                     heldout_improvement=None, config: RewardConfig = AZR_CODE):
  """(N,) float32 rewards of the named function behind the eligibility gate (module docstring).

  Args:
    name: a key of REWARD_FNS.
    cosines: (N,) r_cos (CosineResult.cosines).
    solve_rates: (N,) solver success fraction s in [0, 1] (required except for soar_utility).
    valid, well_formatted: (N,) bool; None means all True.
    jaccard_to_seed: (N,) token Jaccard J(x, seed) in [0, 1] (rewards/novelty.py).
    heldout_improvement: (N,) SOAR's measured improvement (soar_utility only).
    config: ineligible values and band; AZR_CODE (default) or AZR_PAPER.
  """
  if name not in REWARD_FNS:
    raise ValueError(f"unknown proposer reward {name!r}; choose from {sorted(REWARD_FNS)}")
  score = REWARD_FNS[name](cosines=cosines, solve_rates=solve_rates, jaccard_to_seed=jaccard_to_seed,
                           heldout_improvement=heldout_improvement)
  if name == SOAR_UTILITY and not config.soar_uses_band:
    band = jnp.ones(score.shape, bool)
  else:
    band = in_band(_f32(solve_rates, "solve_rates"), config)
  out = jnp.where(band, score, config.out_of_band)
  out = jnp.where(_mask(valid, score), out, config.invalid)
  return jnp.where(_mask(well_formatted, score), out, config.bad_format).astype(jnp.float32)
