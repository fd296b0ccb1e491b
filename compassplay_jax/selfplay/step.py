"""One self-play step, in the order it runs: `run_step` below, read top to bottom.

    plan -> propose -> verify -> score -> rows -> commit -> advantages -> update

A setting (compassplay_jax/settings: coding/, lean/, or a plug-in) supplies the stages named in
`Setting`; the stages every setting shares live here: the eligibility gate and the reward stage
(`score`: g_ref, cosines, SOAR's measurement, proposer rewards), the candidate records and their
metrics (selfplay/records.py), the advantages and the update. Stages hand each other records (`Plan`,
proposals, `Verified`, `Scores`, rows); the reference sequences travel in them (`Plan.fixed_references`,
`Verified.references`). The one stage that changes a setting's own state (task buffers, Lean's seed
pool and coverage) is `commit`. Device work goes through the engine (engine.py) passed in.
`Session.step` (selfplay/session.py) is this function plus evaluation, metrics and the checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np

from compassplay_jax.rewards import proposer_rewards as rewards_lib
from compassplay_jax.rl import aggregation
from compassplay_jax.rl.advantages import trr_plus_plus
from compassplay_jax.selfplay import alignment, records, soar_measure
from compassplay_jax.selfplay.rollout import Row
from compassplay_jax.selfplay.sequences import (LENGTH_BUCKETS, PackedBatch, pack, pack_by_length, packed_shape,
                                                trained_tokens)


# ---- the records stages exchange ---------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
  """The plan stage's record: the step, and the references known before anything is generated (a fixed
  external set: their g_ref compiles in the background while the step generates). A setting's plan
  subclasses it with its own choices."""
  step: int
  fixed_references: dict[str, PackedBatch] = dataclasses.field(default_factory=dict, kw_only=True)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One proposal after verification: everything the reward stage reads."""
  group: str                      # task type ("deduction", ...) or "conjecture"
  formatted: bool                 # the response had the expected format
  valid: bool                     # the verifier accepted the proposed task
  solve_rate: float = 0.0         # fraction of the solver's samples verified correct
  solution: tuple | None = None   # (prompt ids, completion ids) whose loss gradient stands for g(x̃)
  reference: str | None = None    # key of the reference gradient g(x̃) is compared with
  jaccard: float = 0.0            # token-Jaccard to the seed / nearest shown reference
  report_cosine: bool = False     # compute the cosine even when not eligible (reported, never paid)


@dataclasses.dataclass
class Verified:
  """The verify stage's output: one Candidate per proposal, the setting's own record of the checks
  (coding: validated tasks; Lean: proof attempts and verdicts), the tokens it generated and the
  references: {key: reference sequences}, what g(x̃) of a candidate with that `reference` key is
  compared with."""
  candidates: list[Candidate]
  record: Any = None
  tokens: int = 0
  references: dict[str, PackedBatch] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SoarOptions:
  """SOAR's measurement (reward soar_utility; selfplay/soar_measure.py)."""
  heldout: PackedBatch | None     # held-out gold solutions (the NLL signal)
  group_size: int
  steps: int
  learning_rate: float
  batch_rows: int = 0             # rows per inner SGD step (0: the whole group)
  accuracy: Any = None            # soar_measure.HeldoutAnswers: the accuracy signal (None: NLL)
  optimizer: str = "sgd"          # the inner optimizer: "sgd" | "adam" (rewards/soar.py)


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
  """How a setting's candidates are scored (the reward stage's knobs)."""
  reward_name: str
  reward_cfg: rewards_lib.RewardConfig
  pad_id: int
  max_len: int                                      # reward sequences: prompt + solution tokens
  buckets: Sequence[int] = LENGTH_BUCKETS           # length buckets of the cosine passes
  fixed_rows: bool = False                          # pad cosine passes to the micro-batch (fewer shapes)
  soar: SoarOptions | None = None


@dataclasses.dataclass
class Scores:
  """The reward stage's output, per candidate (in the candidates' order), plus its metrics."""
  eligible: np.ndarray              # (N,) bool: the gate (valid, formatted, in band, has a reference)
  cosine: list                      # (N,) float or None where no cosine was computed
  reward: np.ndarray                # (N,) float32 proposer rewards
  heldout_improvement: np.ndarray   # (N,) float32 SOAR's measured improvement (0 when not measured)
  metrics: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class UpdateOptions:
  """How rows become train batches (config.train / config.sampling; `from_config`)."""
  pad_id: int
  max_len: int            # trained sequences: prompt + completion tokens
  token_budget: int = 0   # > 0: rows packed by length into micro-batches of this many tokens
  recompute_logprobs: bool = False  # old log-probs from the train forward (update_params)
  fresh_optimizer: bool = False  # a new optimizer state before the step's first update (SGS's new trainer)
  loss_aggregation: str = "token_mean"  # "verl": veRL's mean of micro-batch token means (rl/aggregation.py)
  verl_micro_batch_rows: int = 16  # veRL's ppo_micro_batch_size_per_gpu (AZR: 16)

  @classmethod
  def from_config(cls, config, pad_id: int) -> "UpdateOptions":
    from compassplay_jax.runtime import config_base
    return cls(pad_id=pad_id, max_len=config_base.train_sequence_len(config),
               token_budget=config.train.micro_batch_tokens,
               recompute_logprobs=config_base.recompute_logprobs(config),
               fresh_optimizer=config.train.fresh_optimizer,
               loss_aggregation=config.train.loss_aggregation,
               verl_micro_batch_rows=config.train.verl_micro_batch_rows)


@dataclasses.dataclass
class StepResult:
  params: Any
  opt_state: Any
  metrics: dict[str, Any]
  rows: list[Row]            # the trained rows, advantages set
  candidates: list[Candidate]
  scores: Scores


class Setting(Protocol):
  """What a setting supplies to `run_step` (settings/coding, settings/lean; docs/architecture.md). Only
  `commit` changes the setting's state; the other stages read it and return records."""

  PHASES: tuple[str, ...]  # its timed phases besides "update" (time/<phase> in the metrics)

  def plan(self, step: int) -> Plan:
    """Host-side choices of the step, seeded by the step (random.Random(f"{seed}:{step}"))."""

  def propose(self, engine, params, plan, key, times: "PhaseTimes") -> Any:
    """Sampled proposals."""

  def verify(self, engine, params, plan, proposals, key, times: "PhaseTimes") -> Verified:
    """Checks of the proposals and the solver's samples on them -> one Candidate per proposal, and the
    reference sequences the candidates name."""

  def scoring(self) -> ScoreOptions:
    """The reward stage's knobs."""

  def rows(self, engine, params, plan, proposals, verified: Verified, scores: Scores, key,
           times: "PhaseTimes") -> tuple[list[Row], dict[str, Any]]:
    """Training rows (proposer rows and the solver's rollouts) and the setting's own metrics. Its
    metrics["candidates"], when set, are the step's CandidateRecords with the setting's own fields
    (records.build(...) then .with_fields); else run_step builds them from the candidates and scores."""

  def commit(self, plan, proposals, verified: Verified, scores: Scores) -> dict[str, Any]:
    """The step's outcomes applied to the setting's state (buffers, seed pool, coverage); its metrics."""

  def train_batches(self, rows: list[Row], step: int) -> list[list[Row]]:
    """The rows cut into optimizer steps."""

  # The session's: checkpoints and shutdown.
  def state_dict(self) -> dict[str, Any]: ...

  def load_state_dict(self, state: dict[str, Any]) -> None: ...

  def close(self) -> None: ...


# ---- the step --------------------------------------------------------------------------------------

def run_step(setting: Setting, engine, params, opt_state, step: int, key, *, update: UpdateOptions | None,
             ref_params=None, progress: Callable[[str], Any] | None = None) -> StepResult:
  """One self-play step. update=None stops after the advantages (params unchanged): rollouts and
  rewards only. ref_params: the frozen reference policy of the KL term (train.kl_coef > 0)."""
  t0 = time.time()
  times = PhaseTimes(setting.PHASES + ("update",), progress)
  k_propose, k_verify, k_rows, k_update = jax.random.split(key, 4)
  plan = setting.plan(step)
  options = setting.scoring()
  compile_ahead(engine, params, opt_state, options, plan, update)
  proposals = setting.propose(engine, params, plan, k_propose, times)
  verified = setting.verify(engine, params, plan, proposals, k_verify, times)
  scores = score(engine, params, verified.candidates, verified.references, options, times)
  rows, metrics = setting.rows(engine, params, plan, proposals, verified, scores, k_rows, times)
  candidates = metrics.pop("candidates", None) or records.build(verified.candidates, scores, options)
  metrics = {**metrics, **records.step_metrics(candidates), **scores.metrics,
             **setting.commit(plan, proposals, verified, scores)}
  rows = with_advantages(rows, update.max_len if update else None)
  if update is not None and rows:
    with times("update", "update"):
      # The rollout engine's cache and weight copy are not needed until the next step: the update gets
      # their memory (docs/sharding.md). They come back with the next generate call.
      metrics["memory/rollout_released_bytes"] = float(engine.release_rollout_memory())
      params, opt_state, train_metrics = update_params(engine, params, opt_state, setting.train_batches(rows, step),
                                                       k_update, update, ref_params=ref_params)
    metrics.update(train_metrics)
  metrics.update(times.metrics())
  metrics["time/step"] = wall = time.time() - t0
  # Phases overlap (checks run while the device decodes): the share of phase time hidden by it.
  busy = sum(times.seconds.values())
  metrics["overlap"] = max(0.0, (busy - wall) / busy) if busy > 0 else 0.0
  return StepResult(params, opt_state, metrics, rows, verified.candidates, scores)


def compile_ahead(engine, params, opt_state, options: "ScoreOptions", plan: Plan, update: UpdateOptions | None) -> None:
  """Starts compiling the programs whose shapes are known before the step generates, on the engine's
  background thread (infra/compile_ahead.py; nothing once they are compiled): g_ref of the plan's fixed
  reference sets, then the length-bucketed step's optimizer update."""
  if not engine.ahead.enabled:
    return
  if rewards_lib.uses_cosine(options.reward_name):
    for reference in plan.fixed_references.values():
      alignment.reference_gradient_ahead(engine, params, reference)
  if update is not None and update.token_budget > 0 and opt_state is not None:
    engine.update_ahead(params, opt_state)


# ---- score: the reward stage --------------------------------------------------------------------

def cosines_ahead(engine, params, options: "ScoreOptions", prompt_ids, solution_ids) -> None:
  """Compiles, in the background, the cosine pass of candidates with these (prompt, solution) ids
  (or ids of the same lengths), when the reward uses cosines."""
  if engine.ahead.enabled and rewards_lib.uses_cosine(options.reward_name):
    alignment.candidate_cosines_ahead(engine, params, prompt_ids, solution_ids, max_len=options.max_len,
                                      fixed_rows=options.fixed_rows, buckets=options.buckets)


def eligible(solve_rates, valid, formatted, has_reference=None, *, config: rewards_lib.RewardConfig) -> np.ndarray:
  """(N,) bool: the candidates a cosine may pay. proposer_rewards' gate (formatted, valid, in the run's
  band: config is the run's RewardConfig) and, where given, a reference gradient to compare with."""
  rates = np.asarray(solve_rates, np.float32)
  gate = np.asarray(rewards_lib.eligible(rates, np.asarray(valid, bool), np.asarray(formatted, bool), config), bool)
  return gate if has_reference is None else gate & np.asarray(has_reference, bool)


def score(engine, params, candidates: Sequence[Candidate], references: dict, options: ScoreOptions,
          times: "PhaseTimes | None" = None) -> Scores:
  """The reward stage, shared by every setting: the eligibility gate, one g_ref per reference at the
  current params, the cosines of eligible (and report_cosine) candidates, SOAR's measurement, then
  proposer_rewards."""
  times = times or PhaseTimes()
  n = len(candidates)
  uses_cosine = rewards_lib.uses_cosine(options.reward_name)
  gate = eligible([c.solve_rate for c in candidates], [c.valid for c in candidates], [c.formatted for c in candidates],
                  [c.reference is not None or not uses_cosine for c in candidates], config=options.reward_cfg)
  cosines: list = [None] * n
  if uses_cosine:
    with times("reward", "reward: cosines"):
      members_of = {key: [i for i, c in enumerate(candidates) if c.reference == key and c.solution is not None
                          and (gate[i] or (c.report_cosine and c.valid))] for key in references}
      for members in members_of.values():  # the cosine passes compile while g_ref runs
        cosines_ahead(engine, params, options, [candidates[i].solution[0] for i in members],
                      [candidates[i].solution[1] for i in members])
      for key, reference in references.items():
        members = members_of[key]
        if not members:
          continue
        g_ref = alignment.reference_gradient(engine, params, reference, options.pad_id)
        cos = alignment.candidate_cosines(
            engine, params, g_ref, [candidates[i].solution[0] for i in members],
            [candidates[i].solution[1] for i in members], options.pad_id, max_len=options.max_len,
            fixed_rows=options.fixed_rows, buckets=options.buckets)
        for i, value in zip(members, cos["cosines"]):
          cosines[i] = float(value)
  heldout, metrics = np.zeros((n,), np.float32), {}
  if options.soar is not None:
    with times("soar", "reward: SOAR inner training"):
      heldout, metrics = soar_measure.measure(engine, params, candidates, options.soar, pad_id=options.pad_id,
                                              max_len=options.max_len, reward_cfg=options.reward_cfg)
  rewards = rewards_lib.proposer_rewards(
      options.reward_name, cosines=np.asarray([c or 0.0 for c in cosines], np.float32),
      solve_rates=np.asarray([c.solve_rate for c in candidates], np.float32),
      valid=np.asarray([c.valid for c in candidates], bool),
      well_formatted=np.asarray([c.formatted for c in candidates], bool),
      jaccard_to_seed=np.asarray([c.jaccard for c in candidates], np.float32),
      heldout_improvement=heldout, config=options.reward_cfg)
  return Scores(np.asarray(gate, bool), cosines, np.asarray(rewards, np.float32), np.asarray(heldout, np.float32),
                metrics)


# ---- advantages and update -----------------------------------------------------------------------

def _mask(r: Row) -> np.ndarray:
  return np.ones(len(r.completion_ids)) if r.completion_mask is None else np.asarray(r.completion_mask)


def with_advantages(rows: Sequence[Row], max_len: int | None) -> list[Row]:
  """The rows with their advantages: their own when every row carries one (Lean's REINFORCE weights),
  else TRR++ over (group, role) groups, token-weighted by each row's trained completion tokens
  (after truncation to max_len, as the update packs them)."""
  rows = list(rows)
  if all(r.advantage is not None for r in rows):
    return rows
  counts = [trained_tokens(r.prompt_ids, r.completion_ids, _mask(r), max_len) for r in rows]
  adv = trr_plus_plus([r.reward for r in rows], [r.group for r in rows], [r.role for r in rows], counts)
  return [dataclasses.replace(r, advantage=float(a)) for r, a in zip(rows, np.asarray(adv, np.float32))]


def verl_weighted(rows: Sequence[Row], options: UpdateOptions) -> list[Row]:
  """One PPO mini-batch's rows with veRL's aggregation folded into their loss masks
  (rl/aggregation.py): each row's trained tokens (after truncation to max_len) count in its veRL
  micro-batch of options.verl_micro_batch_rows consecutive rows."""
  counts = [trained_tokens(r.prompt_ids, r.completion_ids, _mask(r), options.max_len) for r in rows]
  weights = aggregation.verl_row_weights(counts, options.verl_micro_batch_rows)
  return [dataclasses.replace(r, completion_mask=_mask(r) * w) for r, w in zip(rows, weights)]


def _advantages(rows: Sequence[Row]) -> np.ndarray:
  if any(r.advantage is None for r in rows):
    raise ValueError("rows without advantages: run them through step.with_advantages first")
  return np.asarray([r.advantage for r in rows], np.float32)


def padded_batch(rows: Sequence[Row], pad_id: int, micro_batch_size: int, max_len: int | None = None) -> dict:
  """All rows (advantages set) in one completion-window batch, rows padded to a multiple of micro_batch_size."""
  packed = pack([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id, [r.logprobs for r in rows],
                row_multiple=micro_batch_size, max_len=max_len, completion_window=True,
                completion_masks=[_mask(r) for r in rows])
  advantages = np.zeros((packed.tokens.shape[0],), np.float32)
  advantages[:len(rows)] = _advantages(rows)
  return {**packed.as_dict(), "advantages": advantages}


def length_buckets(rows: Sequence[Row], pad_id: int, token_budget: int, max_len: int | None = None) -> list[dict]:
  """The same rows as micro-batches packed by real length (sequences.pack_by_length)."""
  adv = _advantages(rows)
  packed = pack_by_length([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id,
                          [r.logprobs for r in rows], [_mask(r) for r in rows], token_budget=token_budget,
                          max_len=max_len)
  batches = []
  for idx, p in packed:
    advantages = np.zeros((p.tokens.shape[0],), np.float32)
    advantages[:len(idx)] = adv[idx]
    batches.append({**p.as_dict(), "advantages": advantages})
  return batches


def update_params(engine, params, opt_state, chunks: Sequence[Sequence[Row]], key, options: UpdateOptions, *,
                  ref_params=None):
  """One engine train step per chunk of rows (advantages set) -> (params, opt_state, metrics).

  options.token_budget > 0: rows packed by length (engine.bucketed_train_step); else one padded batch
  with rows in multiples of the engine's train micro-batch (engine.train_step). ref_params: the frozen
  reference policy of the KL term (its log-probs are computed on the engine for every batch).
  options.recompute_logprobs: the old log-probs of every chunk are the train forward's at the params
  before the first chunk's step (veRL's old_log_prob), not the sampler's: the first chunk takes its
  own forward's (its ratio is exactly 1), later chunks are recomputed before any step.
  options.fresh_optimizer: the chunks start from a new optimizer state (fresh_opt_state)."""
  if options.fresh_optimizer:
    opt_state = fresh_opt_state(engine, params, opt_state)
  if options.loss_aggregation == "verl":
    chunks = [verl_weighted(chunk, options) for chunk in chunks]
  bucketed = options.token_budget > 0
  size = engine.settings.train.micro_batch_size or engine.batch_divisor
  if bucketed:  # each process places only its share of every micro-batch's rows
    host = [length_buckets(chunk, options.pad_id, options.token_budget, options.max_len) for chunk in chunks]
    placed = [[_place_share(engine, mb, ref_params) for mb in micro] for micro in host]
  else:  # each process packs and places only its share of every chunk's rows (distributed.Shares)
    host, placed = [], []
    for chunk in chunks:
      local, batch = _local_train_batch(engine, chunk, options, size, ref_params)
      host.append([local])
      placed.append([batch])
  if options.recompute_logprobs:
    for i, micro in enumerate(placed):
      for mb in micro:
        rows = mb["tokens"].shape[0]
        if i == 0:  # the params are the old policy's: the step's own forward, exactly
          mb["old_from_forward"] = engine.put_batch({"f": np.ones((rows,), np.float32)})["f"]
        else:
          mb["old_logprobs"] = engine.train_logprobs(params, mb, whole=bucketed)
  step_metrics = []
  for i, micro in enumerate(placed):
    k = key if i == 0 else jax.random.fold_in(key, i)
    if bucketed:
      params, opt_state, m = engine.bucketed_train_step(params, opt_state, micro, k)
    else:
      params, opt_state, m = engine.train_step(params, opt_state, micro[0], k)
    step_metrics.append(jax.device_get(m))
  metrics = {f"train/{name}": float(np.mean([m[name] for m in step_metrics])) for name in step_metrics[0]}
  metrics.update({"train/optimizer_steps": len(chunks), "rows": sum(len(c) for c in chunks),
                  "tokens/trained": int(sum(trained_tokens(r.prompt_ids, r.completion_ids, _mask(r), options.max_len)
                                            for chunk in chunks for r in chunk)),
                  "tokens/update_padded": int(sum(mb["tokens"].size for micro in placed for mb in micro))})
  if len(chunks) > 1:  # PPO mini-batches: from the second the ratio leaves 1 (per optimizer step, in order)
    metrics.update({f"train/per_step/{name}": [float(m[name]) for m in step_metrics]
                    for name in ("ratio_mean", "clip_frac", "approx_kl", "loss")})
  return params, opt_state, metrics


def fresh_opt_state(engine, params, opt_state):
  """optimizer.init(params), laid out like opt_state and written into its buffers (donated): new
  moments, step count and schedule, as SGS builds a new trainer every iteration."""
  reset = jax.jit(lambda p, _: engine.optimizer.init(p), donate_argnums=1, keep_unused=True,
                  out_shardings=engine.opt_shardings(opt_state))
  return reset(params, opt_state)


def _place_share(engine, host_batch: dict, ref_params) -> dict:
  """A host micro-batch every process built whole, placed from process-local rows: each process hands
  over only its share of the rows (sharding.put_local_rows); with ref_params the reference log-probs
  join it."""
  from compassplay_jax.infra import distributed
  shares = distributed.Shares.of(len(host_batch["tokens"]))
  local = {k: shares.take(np.asarray(v)) for k, v in host_batch.items()}
  batch = engine.put_local_rows(local, engine.local_rows(shares.size))
  return batch if ref_params is None else engine.with_reference(ref_params, batch)


def _local_train_batch(engine, rows: Sequence[Row], options: UpdateOptions, micro_batch_size: int, ref_params):
  """(this process's host batch, the placed global batch) of one optimizer step: every process packs
  its share of the rows at the column shape of all of them, as its rows of the global batch (a
  multiple of the train micro-batch); with ref_params the reference log-probs join it."""
  from compassplay_jax.infra import distributed
  shares = distributed.Shares.of(len(rows))
  shape = packed_shape([(len(r.prompt_ids), len(r.completion_ids)) for r in rows], max_len=options.max_len,
                       completion_window=True)
  mine = shares.take(list(rows))
  packed = pack([r.prompt_ids for r in mine], [r.completion_ids for r in mine], options.pad_id,
                [r.logprobs for r in mine], max_len=options.max_len, completion_window=True,
                completion_masks=[_mask(r) for r in mine], shape=shape)
  local = {**packed.as_dict(), "advantages": _advantages(mine) if mine else np.zeros((0,), np.float32)}
  per_process = engine.local_rows(shares.size, micro_batch_size)
  batch = engine.put_local_rows(local, per_process)
  if ref_params is not None:
    batch = engine.with_reference(ref_params, batch, micro_batch_size)
  return local, batch


# ---- timing -------------------------------------------------------------------------------------

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

  def add(self, phase: str, seconds: float) -> None:
    """Time a phase spent in the background (checks overlapped with decoding, selfplay/overlap.py)."""
    self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

  def metrics(self) -> dict[str, float]:
    return {f"time/{name}": seconds for name, seconds in self.seconds.items()}

