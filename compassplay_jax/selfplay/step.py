"""One self-play step, read top to bottom:

    propose ─> verify ─> reward ─> advantages ─> update
    setting.collect: sample proposals and solutions (engine's sampler), check them (sandbox / Lean),
      score proposers (engine's g_ref and cosines, the eligibility gate below, proposer_rewards)
    advantages: per row, TRR++ over (group, role) unless the setting set its own (Lean)
    update: rows packed into batches, one engine train step per batch the setting asks for

The settings (selfplay/coding.py, selfplay/lean.py) supply `collect` (and optionally
`train_batches`); everything they share lives here: the phase timer, the eligibility gate,
advantages and the update. Device work goes through the engine (engine.py) passed in.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from compassplay_jax.rewards.proposer_rewards import RewardConfig
from compassplay_jax.rewards.proposer_rewards import eligible as band_gate
from compassplay_jax.rl.advantages import trr_plus_plus
from compassplay_jax.selfplay.rollout import Row
from compassplay_jax.selfplay.sequences import pack, pack_by_length


class PhaseTimes:
  """Seconds per phase of a step. `with times("generate", "generate: proposals"):` adds the block's
  wall time to "generate" and announces the label to the progress callback as the block starts."""

  def __init__(self, phases: Sequence[str] = (), progress: Callable[[str], Any] | None = None):
    self.seconds = {p: 0.0 for p in phases}
    self._progress = progress or (lambda label: None)

  @contextlib.contextmanager
  def __call__(self, phase: str, label: str | None = None):
    self._progress(label or phase)
    t0 = time.time()
    try:
      yield
    finally:
      self.seconds[phase] = self.seconds.get(phase, 0.0) + time.time() - t0

  def metrics(self) -> dict[str, float]:
    return {f"time/{name}": seconds for name, seconds in self.seconds.items()}


def eligible(solve_rates, valid, formatted=None, has_reference=None) -> np.ndarray:
  """(N,) bool: the candidates a cosine may pay. proposer_rewards' gate (valid, formatted, 0 < s < 1)
  and, where given, a reference gradient to compare with (Lean's local reference)."""
  rates = np.asarray(solve_rates, np.float32)
  formatted = np.ones(rates.shape, bool) if formatted is None else np.asarray(formatted, bool)
  gate = np.asarray(band_gate(rates, np.asarray(valid, bool), formatted, RewardConfig()), bool)
  return gate if has_reference is None else gate & np.asarray(has_reference, bool)


def row_advantages(rows: Sequence[Row], token_counts) -> np.ndarray:
  """(len(rows),) advantages: the rows' own when every row carries one (Lean's REINFORCE weights),
  else TRR++ over (group, role) groups, token-weighted by each row's trained completion tokens."""
  if all(r.advantage is not None for r in rows):
    return np.asarray([r.advantage for r in rows], np.float32)
  return trr_plus_plus([r.reward for r in rows], [r.group for r in rows], [r.role for r in rows], token_counts)


def _masks(rows):
  return [np.ones(len(r.completion_ids)) if r.completion_mask is None else r.completion_mask for r in rows]


def padded_batch(rows: Sequence[Row], pad_id: int, micro_batch_size: int, max_len: int | None = None) -> dict:
  """All rows in one completion-window batch (rows padded to a multiple of micro_batch_size), with advantages."""
  packed = pack([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id, [r.logprobs for r in rows],
                row_multiple=micro_batch_size, max_len=max_len, completion_window=True, completion_masks=_masks(rows))
  advantages = np.zeros((packed.tokens.shape[0],), np.float32)
  advantages[:len(rows)] = row_advantages(rows, packed.loss_mask[:len(rows)].sum(-1))
  return {**packed.as_dict(), "advantages": advantages}


def length_buckets(rows: Sequence[Row], pad_id: int, token_budget: int, max_len: int | None = None) -> list[dict]:
  """The same rows as micro-batches packed by real length (sequences.pack_by_length); advantages are
  computed over all rows first, exactly as in padded_batch."""
  packed = pack_by_length([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id,
                          [r.logprobs for r in rows], _masks(rows), token_budget=token_budget, max_len=max_len)
  counts = np.zeros(len(rows), np.float32)
  for idx, p in packed:
    counts[idx] = p.loss_mask[:len(idx)].sum(-1)
  adv = row_advantages(rows, counts)
  batches = []
  for idx, p in packed:
    advantages = np.zeros((p.tokens.shape[0],), np.float32)
    advantages[:len(idx)] = adv[idx]
    batches.append({**p.as_dict(), "advantages": advantages})
  return batches


def update(engine, params, opt_state, chunks: Sequence[Sequence[Row]], key, *, pad_id: int, max_len: int,
           token_budget: int = 0, ref_params=None):
  """One engine train step per chunk of rows -> (params, opt_state, metrics).

  token_budget > 0: rows packed by length (engine.bucketed_train_step); else one padded batch with
  rows in multiples of the engine's train micro-batch (engine.train_step). ref_params: the frozen
  reference policy of the KL term (its log-probs are computed on the engine for every batch)."""
  step_metrics, trained, padded = [], 0, 0
  for i, chunk in enumerate(chunks):
    k = key if i == 0 else jax.random.fold_in(key, i)
    if token_budget > 0:
      micro = length_buckets(chunk, pad_id, token_budget, max_len)
      params, opt_state, m = engine.bucketed_train_step(params, opt_state, micro, k, ref_params=ref_params)
    else:
      size = engine.settings.train.micro_batch_size or engine.batch_divisor
      micro = [padded_batch(chunk, pad_id, size, max_len)]
      batch = engine.put_batch(micro[0])
      if ref_params is not None:
        batch = engine.with_reference(ref_params, batch, size)
      params, opt_state, m = engine.train_step(params, opt_state, batch, k)
    step_metrics.append(jax.device_get(m))
    trained += int(sum(mb["loss_mask"].sum() for mb in micro))
    padded += int(sum(mb["tokens"].size for mb in micro))
  metrics = {f"train/{name}": float(np.mean([m[name] for m in step_metrics])) for name in step_metrics[0]}
  metrics.update({"train/optimizer_steps": len(chunks), "tokens/trained": trained, "tokens/update_padded": padded,
                  "rows": sum(len(c) for c in chunks)})
  return params, opt_state, metrics


# ---- the step: propose -> verify -> reward (-> advantages -> update, above) ---------------------------

@dataclasses.dataclass
class Candidate:
  """One proposal after verification: all the reward stage reads, and what it writes back."""
  group: str                      # task type ("deduction", ...) or "conjecture"
  formatted: bool                 # the response had the expected format
  valid: bool                     # the verifier accepted the proposed task
  solve_rate: float = 0.0         # fraction of the solver's samples verified correct
  solution: tuple | None = None   # (prompt ids, completion ids) whose loss gradient stands for g(x̃)
  reference: str | None = None    # key of the reference gradient g(x̃) is compared with
  jaccard: float = 0.0            # token-Jaccard to the seed / nearest shown reference
  report_cosine: bool = False     # compute the cosine even when not eligible (reported, never paid)
  heldout_improvement: float = 0.0  # SOAR's measured group improvement (soar_utility; rewards/soar.py)
  eligible: bool = False          # set by the reward stage (the gate below)
  cosine: float | None = None     # set by the reward stage where computed
  reward: float = 0.0             # set by the reward stage


def score(engine, params, candidates: Sequence[Candidate], references: dict, *, reward_name: str,
          reward_cfg: RewardConfig, pad_id: int, max_len: int, uses_cosine: bool, **cosine_kwargs) -> None:
  """The reward stage, shared by both settings: the eligibility gate, one g_ref per reference at the
  current params, the cosines of eligible (and report_cosine) candidates, then proposer_rewards."""
  from compassplay_jax.rewards.proposer_rewards import proposer_rewards
  from compassplay_jax.selfplay import alignment
  if not candidates:
    return
  gate = eligible([c.solve_rate for c in candidates], [c.valid for c in candidates], None,
                  [c.reference is not None or not uses_cosine for c in candidates])
  for c, ok in zip(candidates, gate):
    c.eligible = bool(ok)
  if uses_cosine:
    for key, reference in references.items():
      members = [c for c in candidates if c.reference == key and c.solution is not None
                 and (c.eligible or (c.report_cosine and c.valid))]
      if not members:
        continue
      g_ref = alignment.reference_gradient(engine, params, reference, pad_id)
      cos = alignment.candidate_cosines(engine, params, g_ref, [c.solution[0] for c in members],
                                        [c.solution[1] for c in members], pad_id, max_len=max_len, **cosine_kwargs)
      for c, value in zip(members, cos["cosines"]):
        c.cosine = float(value)
  rewards = proposer_rewards(
      reward_name, cosines=np.asarray([c.cosine or 0.0 for c in candidates], np.float32),
      solve_rates=np.asarray([c.solve_rate for c in candidates], np.float32),
      valid=np.asarray([c.valid for c in candidates], bool),
      well_formatted=np.asarray([c.formatted for c in candidates], bool),
      jaccard_to_seed=np.asarray([c.jaccard for c in candidates], np.float32),
      heldout_improvement=np.asarray([c.heldout_improvement for c in candidates], np.float32), config=reward_cfg)
  for c, r in zip(candidates, np.asarray(rewards, np.float32)):
    c.reward = float(r)


def collect(setting, engine, params, step: int, key, progress: Callable[[str], Any] | None = None):
  """One step's rollouts and rewards: (training rows, metrics). The setting supplies the stages:

    plan(step)                                   host-side choices for the step (seeded by the step)
    propose(engine, params, plan, key, times)    sampled proposals
    verify(engine, params, plan, proposals, key, times) -> [Candidate]   checks and solve rates
    references(plan, candidates) -> {key: PackedBatch}                  what g(x̃) is compared with
    score_options: keyword arguments of `score` (reward name and gate, lengths, cosine passes)
    rows(engine, params, plan, proposals, candidates, key, times) -> (rows, metrics)
  """
  times = PhaseTimes(setting.PHASES, progress)
  k_propose, k_verify, k_rows = jax.random.split(key, 3)
  plan = setting.plan(step)
  proposals = setting.propose(engine, params, plan, k_propose, times)
  candidates = setting.verify(engine, params, plan, proposals, k_verify, times)
  with times("reward", "reward: cosines"):
    score(engine, params, candidates, setting.references(plan, candidates), **setting.score_options)
  rows, metrics = setting.rows(engine, params, plan, proposals, candidates, k_rows, times)
  metrics.update(times.metrics())
  return rows, metrics


def default_engine(graphdef, params, config):
  """A one-device engine, for a setting used outside the run loop (tests, tools)."""
  from compassplay_jax import sharding as sh
  from compassplay_jax.engine import Engine, EngineSettings
  mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
  return Engine.build(graphdef, params, mesh, EngineSettings.from_config(config))
