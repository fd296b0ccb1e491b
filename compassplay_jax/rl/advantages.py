"""Advantage estimators: AZR's TRR++ and SGS's REINFORCE½ (solver) / REINFORCE (conjecturer).

All functions are pure numpy on host arrays (rewards come from Python verifiers) and return one
float32 advantage per sequence; the loss broadcasts it over the sequence's completion tokens.
Formulas and sources are in docs/training.md.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# veRL's masked_whiten adds this inside the rsqrt (docs/paper_settings.md §5.2).
TRR_EPS = 1e-8


def _as_1d(name: str, values, n: int | None = None) -> np.ndarray:
  arr = np.asarray(values)
  if arr.ndim != 1:
    raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
  if n is not None and arr.shape[0] != n:
    raise ValueError(f"{name} has length {arr.shape[0]}, expected {n}")
  return arr


def _group_index(*keys: Sequence) -> np.ndarray:
  """Dense integer id of each row's key tuple (first-seen order)."""
  ids: dict[tuple, int] = {}
  return np.array([ids.setdefault(k, len(ids)) for k in zip(*keys)], dtype=np.int64)


def trr_plus_plus(rewards, task_types, roles, token_counts, eps: float = TRR_EPS) -> np.ndarray:
  """Task-Relative REINFORCE++ advantages, exactly veRL's token-level masked whitening per group.

  Within each (task type, role) group with sequences i, rewards R_i and completion lengths L_i
  (every completion token of sequence i carries the return R_i, γ = 1):
    N   = Σ_i L_i                                   (token count of the group)
    μ   = Σ_i L_i R_i / N                           (token-weighted mean)
    σ²  = Σ_i L_i (R_i − μ)² / (N − 1)              (token-level, unbiased; 0 when N ≤ 1)
    A_i = (R_i − μ) / sqrt(σ² + eps)
  Sequences with L_i = 0 get A_i = 0 (they have no tokens to carry it).

  Args:
    rewards: (B,) scalar reward of each sequence.
    task_types: (B,) hashable task type of each sequence (e.g. "code_i", "code_o", "code_f").
    roles: (B,) hashable role of each sequence (e.g. "propose", "solve").
    token_counts: (B,) number of completion tokens (the loss-mask sum) of each sequence.
    eps: added to the variance inside the square root (veRL: 1e-8).

  Returns:
    (B,) float32 advantages.
  """
  r = _as_1d("rewards", rewards).astype(np.float64)
  n = r.shape[0]
  lengths = _as_1d("token_counts", token_counts, n).astype(np.float64)
  if np.any(lengths < 0):
    raise ValueError("token_counts must be non-negative")
  groups = _group_index(_as_1d("task_types", task_types, n).tolist(), _as_1d("roles", roles, n).tolist())
  adv = np.zeros(n, np.float64)
  for g in np.unique(groups):
    rows = groups == g
    w, rg = lengths[rows], r[rows]
    tokens = w.sum()
    if tokens == 0:
      continue
    mu = (w * rg).sum() / tokens
    var = (w * (rg - mu) ** 2).sum() / (tokens - 1) if tokens > 1 else 0.0
    adv[rows] = (rg - mu) / np.sqrt(var + eps)
  adv[lengths == 0] = 0.0
  return adv.astype(np.float32)


def solve_rates(correct, group_ids) -> np.ndarray:
  """(B,) mean of `correct` over the rows sharing each row's group id (a problem's k attempts)."""
  c = _as_1d("correct", correct).astype(np.float64)
  groups = _group_index(_as_1d("group_ids", group_ids, c.shape[0]).tolist())
  totals = np.bincount(groups, weights=c)
  counts = np.bincount(groups)
  return (totals / counts)[groups]


def reinforce_half(correct, group_ids, *, max_solve_rate: float = 0.5, sample_weights=None) -> np.ndarray:
  """SGS's REINFORCE½ solver weights: log-likelihood on correct proofs of hard-but-solved problems.

  A_i = c_i · [0 < s_g(i) ≤ max_solve_rate] · w_i, with c_i ∈ {0, 1} the verification outcome of
  attempt i, s_g the solve rate of its problem over its k attempts, and w_i an optional per-attempt
  weight (SGS: 0 for proofs containing `try`). The baseline is 0: no mean is subtracted; the "½" is
  the solve-rate filter, not a baseline. Rows with A_i = 0 carry no gradient; SGS never puts them in
  the batch (its loss divides by the token count of the kept proofs), so drop them before training
  to reproduce its normalisation exactly.
  """
  c = _as_1d("correct", correct).astype(np.float64)
  if not np.all((c == 0) | (c == 1)):
    raise ValueError("correct must hold only 0/1 values")
  s = solve_rates(c, group_ids)
  adv = c * ((s > 0) & (s <= max_solve_rate))
  if sample_weights is not None:
    adv = adv * _as_1d("sample_weights", sample_weights, c.shape[0]).astype(np.float64)
  return adv.astype(np.float32)


def conjecture_band(rates, quantile: float = 0.7) -> np.ndarray:
  """SGS's difficulty band: mask of conjectures with 0 < s ≤ p, p = sorted({s : 0 < s < 1})[⌊q·n⌋].

  With no conjecture strictly inside (0, 1) no row is in band.
  """
  s = _as_1d("rates", rates).astype(np.float64)
  inside = np.sort(s[(s > 0) & (s < 1)])
  if inside.size == 0:
    return np.zeros(s.shape, bool)
  p = inside[min(int(quantile * inside.size), inside.size - 1)]
  return (s > 0) & (s <= p)


def reinforce(rewards, selected=None) -> np.ndarray:
  """SGS's REINFORCE conjecturer weights: batch min-max normalised rewards.

  Over the selected rows (default all): A_i = (r_i − min r) / (max r − min r), and A_i = 1 for all of
  them when max r = min r; unselected rows get 0. So the baseline is the batch minimum (that row gets
  weight 0) and the scale is the batch range. SGS's raw reward is r = R_guide · (1 − s) on in-band
  conjectures (`conjecture_band`), with out-of-band conjectures unselected.
  """
  r = _as_1d("rewards", rewards).astype(np.float64)
  sel = np.ones(r.shape, bool) if selected is None else _as_1d("selected", selected, r.shape[0]).astype(bool)
  adv = np.zeros(r.shape, np.float64)
  if sel.any():
    lo, hi = r[sel].min(), r[sel].max()
    adv[sel] = 1.0 if hi == lo else (r[sel] - lo) / (hi - lo)
  return adv.astype(np.float32)


def overlong_penalty(lengths, max_tokens: int, gamma: float = 0.8) -> np.ndarray:
  """DAPO-style soft length penalty in [−1, 0]: 0 up to γ·max_tokens, then linear down to −1 at max_tokens.

  SGS's `length_reward` (sgs step2_train.py:57-73, γ = 0.8): a kept proof's or conjecture's weight
  is replaced by it when it is negative (`length_penalized`, `sgs_solver_weights`).
  """
  n = _as_1d("lengths", lengths).astype(np.float64)
  start = gamma * max_tokens
  return np.clip(-(n - start) / (max_tokens - start), -1.0, 0.0).astype(np.float32)


# The most a copy of its seed (novelty 0) may get under the floored baseline: one RMS unit of the
# whitened rows below the baseline, whatever the other rows score.
COPY_ADVANTAGE = -1.0


def floored_baseline_advantages(rewards, selected=None, floor: float = 0.0, copies=None) -> np.ndarray:
  """Proposer advantages that train copies down, always, and never up.

  The trained rows are the selected ones (default all) and the `copies` (selected or not). Copies
  count at reward 0, the value the novelty factor gives them. With b = max(mean r, floor) and
  σ = sqrt(mean (r − b)²) over the trained rows:
    A_i = (r_i − b) / σ                 (0 when σ = 0)
    A_i = min((0 − b) / σ, −1)          for a copy
  and 0 for every other row. It is REINFORCE with a batch-mean baseline (Williams 1992), whitened over
  the round as REINFORCE++ / AZR's TRR++ (arXiv 2505.03335) do, with the baseline floored at `floor`
  (0), so a row scoring 0 is never trained up. The baseline alone pushes a reward-0 copy down only when
  b > 0, and a copy outside the band (solve rate 1, as a copy of a solved seed usually is) would not be
  trained at all; the cap and the copies' membership make both hold always. `copies` are the caller's
  zero-novelty rows (token-Jaccard 1 to the seed: every verbatim copy). SGS's min-max weights
  (`reinforce`) are never negative, so they never push a copy down: reinforce([0, -0.1, 0.2]) =
  [0.33, 0, 1]; here [-0.27, -1.07, 1.34], and [-1, -1.07, 1.34] with row 0 flagged as a copy.
  """
  r = _as_1d("rewards", rewards).astype(np.float64)
  sel = np.ones(r.shape, bool) if selected is None else _as_1d("selected", selected, r.shape[0]).astype(bool)
  copy = np.zeros(r.shape, bool) if copies is None else _as_1d("copies", copies, r.shape[0]).astype(bool)
  r = np.where(copy, 0.0, r)
  trained = sel | copy
  adv = np.zeros(r.shape, np.float64)
  if trained.any():
    deviation = r[trained] - max(r[trained].mean(), floor)
    scale = np.sqrt(np.mean(deviation ** 2))
    if scale > 1e-12:
      adv[trained] = deviation / scale
  adv[copy] = np.minimum(adv[copy], COPY_ADVANTAGE)
  return adv.astype(np.float32)


def length_penalized(advantages, trained, lengths, max_tokens: int, gamma: float = 0.8) -> np.ndarray:
  """SGS's DAPO length rule on trained rows: a trained row whose length passes gamma·max_tokens gets
  min(A, overlong_penalty) (in [−1, 0)).

  SGS replaces the weight of such a conjecture or proof by the penalty (sgs step2_train.py:304-310
  for conjectures, :556-564 for proofs); its weights are never negative, so replacing is taking the
  minimum, which is what a signed advantage needs: an overlong copy already at −1 stays at −1.
  """
  a = _as_1d("advantages", advantages).astype(np.float64)
  t = _as_1d("trained", trained, a.shape[0]).astype(bool)
  penalty = overlong_penalty(_as_1d("lengths", lengths, a.shape[0]), max_tokens, gamma).astype(np.float64)
  return np.where(t & (penalty < 0), np.minimum(a, penalty), a).astype(np.float32)


def sgs_solver_weights(correct, group_ids, *, max_solve_rate: float = 0.5, zero_weight=None, lengths=None,
                       max_tokens: int | None = None, gamma: float = 0.8) -> np.ndarray:
  """SGS's prover weights: REINFORCE½ plus its two rules on kept proofs (sgs step2_train.py,
  prepare_prover_train_data, repo LukeBailey181/sgs).

  A proof flagged in `zero_weight` (SGS: it contains `try`) gets 0. A kept proof whose length
  passes gamma·max_tokens gets the DAPO length penalty (`overlong_penalty`, in [−1, 0)) as its
  weight instead of 1, so an overlong correct proof is trained down.
  """
  c = _as_1d("correct", correct)
  keep = None if zero_weight is None else 1.0 - _as_1d("zero_weight", zero_weight, c.shape[0]).astype(np.float64)
  w = reinforce_half(correct, group_ids, max_solve_rate=max_solve_rate, sample_weights=keep).astype(np.float64)
  if lengths is not None:
    if not max_tokens:
      raise ValueError("sgs_solver_weights: lengths given without max_tokens")
    penalty = overlong_penalty(_as_1d("lengths", lengths, c.shape[0]), max_tokens, gamma)
    w = np.where((w != 0) & (penalty < 0), penalty, w)
  return w.astype(np.float32)
