"""The candidate record: one per proposal and step, what the step's shared metrics, the per-step line
(selfplay/run.py), the end-of-run table (selfplay/summary.py) and the reports (reports/tables.py) read.

In metrics.jsonl a record is one dict of `metrics["candidates"]`: the shared fields below, then the
setting's own (Lean: seed, advantage, sgs_band, copy, rename, duplicate). Every setting gets the same
shared metrics from its records (`step_metrics`), so they compare across settings:

  in_band     formatted, valid and inside the run's band (rewards.proposer_rewards.in_band with the run's
              config.reward band): the same rule everywhere
  paid_by     "cosine" (or the reward's name) when the gate let the reward pay it, else "gate"
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

_SHARED = ("type", "solve_rate", "cosine", "reward", "valid", "in_band", "jaccard", "paid_by", "formatted")
# The metrics every step logs from its records (selfplay/run.py's line and the reports read them).
METRIC_KEYS = ("candidates", "valid_rate", "format_rate", "in_band_rate", "in_band_count", "cos_paid_count",
               "cos_share", "reward/proposer")  # and cos_valid_mean when a valid candidate has a cosine


@dataclasses.dataclass(frozen=True)
class CandidateRecord:
  type: str                     # the candidate's group: a task type, "conjecture", ...
  solve_rate: float
  cosine: float | None          # None where no cosine was computed
  reward: float                 # the proposer reward
  valid: bool
  in_band: bool                 # formatted, valid, in the run's band
  jaccard: float | None         # token-Jaccard to the seed / nearest shown reference (copies: > 0.8)
  paid_by: str                  # "cosine" | the reward's name | "gate"
  formatted: bool = True
  fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the setting's own

  def with_fields(self, **fields) -> "CandidateRecord":
    return dataclasses.replace(self, fields={**self.fields, **fields})

  def to_json(self) -> dict[str, Any]:
    return {**{k: getattr(self, k) for k in _SHARED}, **self.fields}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "CandidateRecord":
    """A metrics.jsonl record; a field an older run did not log reads as unknown (NaN, None, "") or,
    for valid / in_band / formatted, as False / False / True."""
    return cls(type=d.get("type", ""), solve_rate=float(d.get("solve_rate", math.nan)), cosine=d.get("cosine"),
               reward=float(d.get("reward", math.nan)), valid=bool(d.get("valid", False)),
               in_band=bool(d.get("in_band", False)), jaccard=d.get("jaccard"), paid_by=d.get("paid_by", ""),
               formatted=bool(d.get("formatted", True)), fields={k: v for k, v in d.items() if k not in _SHARED})


def build(candidates, scores, options) -> list[CandidateRecord]:
  """The records of a step's candidates (step.Candidate) from the reward stage's step.Scores, under the
  run's step.ScoreOptions (its reward name and band)."""
  from compassplay_jax.rewards import proposer_rewards as rewards_lib
  band = np.asarray(rewards_lib.eligible([c.solve_rate for c in candidates], [c.valid for c in candidates],
                                         [c.formatted for c in candidates], options.reward_cfg), bool)
  paid = "cosine" if rewards_lib.uses_cosine(options.reward_name) else options.reward_name
  return [CandidateRecord(type=c.group, solve_rate=float(c.solve_rate), cosine=scores.cosine[i],
                          reward=float(scores.reward[i]), valid=bool(c.valid), in_band=bool(band[i]),
                          jaccard=float(c.jaccard), paid_by=paid if scores.eligible[i] else "gate",
                          formatted=bool(c.formatted))
          for i, c in enumerate(candidates)]


def cosine_share(records: Sequence[CandidateRecord]) -> float:
  """Fraction of the proposer reward's magnitude, Σ|r|, paid by gradient cosines (0 when Σ|r| = 0).

  Gate rewards are negative constants, cosines lie in [-1, 1]: magnitudes make both count."""
  total = sum(abs(r.reward) for r in records)
  return sum(abs(r.reward) for r in records if r.paid_by == "cosine") / total if total > 0 else 0.0


def rate(records: Sequence[CandidateRecord], field: str) -> float:
  """The fraction of records whose `field` is true (0 for none)."""
  return float(np.mean([bool(getattr(r, field)) for r in records])) if records else 0.0


def step_metrics(records: Sequence[CandidateRecord]) -> dict[str, Any]:
  """The shared metrics (METRIC_KEYS) of one step's records."""
  cosines = [r.cosine for r in records if r.valid and r.cosine is not None]
  metrics = {"candidates": [r.to_json() for r in records],
             "valid_rate": rate(records, "valid"), "format_rate": rate(records, "formatted"),
             "in_band_rate": rate(records, "in_band"), "in_band_count": sum(r.in_band for r in records),
             "cos_paid_count": sum(r.paid_by == "cosine" for r in records), "cos_share": cosine_share(records),
             "reward/proposer": float(np.mean([r.reward for r in records])) if records else 0.0}
  if cosines:
    metrics["cos_valid_mean"] = float(np.mean(cosines))
  return metrics
