"""Step-time model of the paper configs: decode schedules, per-step call counts, hardware, seconds.

Pure functions, no jax: experiments/step_time.py supplies the per-call FLOPs and bytes (XLA's cost
analysis of the engine's functions) and prints the tables (docs/sharding.md, "Step time of the
paper configs").

* Decode schedules. A row of L tokens occupies L - 1 decode steps: its first token comes from the
  prefill (sampling/decode.prefill; the continuous engine counts slot steps the same way).
  `static_decode_steps`: what sampling.static_engine.StaticEngine does, micro-batches of `rows` requests
  decoded one after another, each until its longest row ends. `continuous_decode_steps`: continuous
  batching with `slots` slots in arrival order, each finished row's slot taking the next request
  (sampling/continuous.py with refill_threshold 1 and order "arrival").
* Call counts of one step (`coding_step_plan`, `lean_iteration_plan`): derived from a run config as
  settings/coding/setting.py, settings/lean/setting.py, selfplay/step.py and selfplay/alignment.py batch their
  device calls, with the outcome rates that no config holds (valid proposals, solved targets, ...)
  as stated assumptions.
* The program that runs (experiments/step_time.py --program): `engine_slots` (the continuous engine's
  slot count from its memory budget), `continuous_run` (its chunks, windows and drain, call by call),
  `paged_engine_layout` / `paged_run` / `paged_step_figures` (the paged engine, the default layout:
  slots and pool from the budget, admission and preemption by pages, each step reading held pages),
  `sampler_mesh` / `sampler_weight_bytes` (per-host weight copies across processes),
  `decode_step_figures`, `FixedCosts` / `run_seconds` (per-step, per-chunk and per-call costs),
  `rollout_programs` (compile counts), `checkpoint_seconds`, `evaluation_steps`, `greedy_lengths`.
* `seconds(...)`: a call's time on a device from its per-device FLOPs, HBM bytes and interconnect
  bytes: max(FLOPs / (peak x eff), bytes / (bandwidth x eff), link bytes / (link x eff)).
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Sequence

import numpy as np

from compassplay_jax.runtime import config_base
from compassplay_jax.rewards.proposer_rewards import uses_cosine


# ---- decode schedules ---------------------------------------------------------------------------

def _steps(length: int) -> int:
  if length < 1:
    raise ValueError(f"a generated row has at least one token, got length {length}")
  return int(length) - 1


def static_decode_steps(lengths: Sequence[int], rows: int) -> int:
  """Decode steps of the static schedule: requests in the given order cut into micro-batches of
  `rows`, each decoded until its longest row ends, one micro-batch after another."""
  if rows < 1:
    raise ValueError(f"rows={rows} is less than 1")
  lengths = [int(x) for x in lengths]
  return sum(max(_steps(x) for x in lengths[i:i + rows]) for i in range(0, len(lengths), rows))


def continuous_decode_steps(lengths: Sequence[int], slots: int) -> int:
  """Decode steps of continuous batching with `slots` slots: requests enter in the given order, each
  into the first slot that frees (all slots free at step 0); the count is the step at which the
  last row ends."""
  if slots < 1:
    raise ValueError(f"slots={slots} is less than 1")
  free_at = [0] * slots  # a min-heap of the steps at which each slot frees
  end = 0
  for x in lengths:
    start = heapq.heappop(free_at)
    finish = start + _steps(x)
    end = max(end, finish)
    heapq.heappush(free_at, finish)
  return end


def kv_token_reads(lengths: Sequence[int], prompt: int) -> int:
  """Cache entries (tokens) attention reads over all decode steps of these rows when it reads only the
  filled part of each row's cache: a row of L tokens decodes L - 1 steps, the one producing token t
  (t = 1 .. L - 1) over prompt + t entries (the prompt and the tokens before it, itself included)."""
  steps = [_steps(x) for x in lengths]
  return sum(n * prompt + n * (n + 1) // 2 for n in steps)


def lognormal_lengths(n: int, mean: float, sigma: float, cap: int, rng: np.random.Generator) -> np.ndarray:
  """n response lengths from a log-normal whose uncapped mean is `mean` (median mean * exp(-sigma^2/2)),
  rounded, at least 1 token and at most `cap` (the sampler's max_new_tokens)."""
  if mean <= 1 or sigma < 0 or cap < 1:
    raise ValueError(f"length distribution: mean={mean} must exceed 1, sigma={sigma} >= 0, cap={cap} >= 1")
  mu = math.log(mean) - sigma ** 2 / 2
  return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), 1, cap).astype(np.int64)


# ---- hardware -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Hardware:
  """One accelerator of a slice: its published peak and bandwidths, and where they are published."""
  name: str
  peak_flops: float      # dense bf16 FLOP/s
  hbm_bytes_s: float     # HBM bandwidth, bytes/s
  link_bytes_s: float    # inter-chip bandwidth per chip, one direction, bytes/s
  source: str


HARDWARE = {
    # cloud.google.com/tpu/docs/v5p: "Peak compute per chip (bf16) 459 TFLOPs", "HBM2e capacity and
    # bandwidth 95GB, 2765 GBps", "Interchip Interconnect BW 4800 Gbps" (= 600 GB/s).
    "v5p": Hardware("TPU v5p", 459e12, 2765e9, 600e9,
                    "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 2765 GB/s HBM2e, ICI 4800 Gbps"),
    # NVIDIA's H100 datasheet (nvidia.com/en-us/data-center/h100): BF16 Tensor Core 1,979 TFLOPS "with
    # sparsity" (989 dense), GPU memory bandwidth 3.35 TB/s, NVLink 900 GB/s (both directions).
    "h100": Hardware("H100 SXM", 989e12, 3350e9, 450e9,
                     "NVIDIA H100 datasheet: 1979 TFLOP/s bf16 with sparsity = 989 dense, 3.35 TB/s HBM3, "
                     "NVLink 900 GB/s bidirectional"),
}


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """Fractions of the published peaks a program reaches (stated assumptions, not measurements)."""
  flops: float = 0.4   # of peak FLOP/s for matmul-bound passes (MFU)
  hbm: float = 0.65    # of HBM bandwidth
  link: float = 0.5    # of the inter-chip bandwidth for collectives

  def __post_init__(self):
    for name in ("flops", "hbm", "link"):
      value = getattr(self, name)
      if not 0 < value <= 1:
        raise ValueError(f"efficiency {name}={value} is not in (0, 1]")


def seconds(flops: float, hbm_bytes: float, link_bytes: float, hw: Hardware, eff: Efficiency) -> float:
  """One call's time on one device from its per-device figures: the slowest of compute, HBM traffic
  and collective traffic (they overlap at best)."""
  return max(flops / (hw.peak_flops * eff.flops), hbm_bytes / (hw.hbm_bytes_s * eff.hbm),
             link_bytes / (hw.link_bytes_s * eff.link))


def bound(flops: float, hbm_bytes: float, link_bytes: float, hw: Hardware, eff: Efficiency) -> str:
  """Which of the three terms of `seconds` decides it: "compute", "HBM" or "link"."""
  terms = {"compute": flops / (hw.peak_flops * eff.flops), "HBM": hbm_bytes / (hw.hbm_bytes_s * eff.hbm),
           "link": link_bytes / (hw.link_bytes_s * eff.link)}
  return max(terms, key=terms.get)


# ---- what one step calls --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GenerateCall:
  """One rollout-engine `generate` call: `prompts` requests, `samples` rows each."""
  label: str
  prompts: int
  samples: int

  @property
  def rows(self) -> int:
    return self.prompts * self.samples


@dataclasses.dataclass(frozen=True)
class CheckBatch:
  """Verifier jobs as the loop submits them: `groups` groups one after another, each of
  `jobs_per_group` jobs spread over at most `workers` processes. `overlaps`: the label of the
  generate call whose decoding these checks run beside (selfplay/overlap.BackgroundChecks starts an
  item's check as soon as its rows finish), "" when they run after it."""
  label: str
  groups: int
  jobs_per_group: int
  workers: int
  overlaps: str = ""

  @property
  def jobs(self) -> int:
    return self.groups * self.jobs_per_group


@dataclasses.dataclass(frozen=True)
class StepPlan:
  """Device calls and host jobs of one step. Unit calls are of one fixed-shape program each: a g_ref
  or cosine micro-batch, a train micro-batch (the train step scans its micro-batches)."""
  setting: str
  generate: tuple[GenerateCall, ...]
  checks: tuple[CheckBatch, ...]  # verifier jobs (sandbox programs / Lean proofs), in order
  g_ref_passes: int           # g_ref micro-batches (forward + backward)
  g_ref_rows: int             # rows per g_ref micro-batch
  cosine_passes: int          # fused-cosine micro-batches
  cosine_rows: int
  train_micro_batches: int
  train_rows: int             # rows per train micro-batch
  optimizer_steps: int
  logprob_passes: int = 0     # train micro-batches whose old log-probs are recomputed by a forward pass
  update_chunks: tuple[int, ...] = ()  # rows of each optimizer step, in order
  notes: tuple[str, ...] = ()

  @property
  def prompts(self) -> int:
    return sum(c.prompts for c in self.generate)

  @property
  def sequences(self) -> int:
    return sum(c.rows for c in self.generate)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _update_counts(config, chunks: Sequence[int], micro: int) -> tuple[int, int]:
  """(train micro-batches, recomputed log-prob passes) of optimizer steps over `chunks` rows each
  (step.update_params: each chunk padded to the micro-batch; with train.recompute_logprobs every chunk
  after the first gets a forward pass per micro-batch first, the first uses its own forward)."""
  per_chunk = [-(-n // micro) for n in chunks]
  return sum(per_chunk), (sum(per_chunk[1:]) if config_base.recompute_logprobs(config) else 0)


def packed_update_tokens(chunks: Sequence[Sequence[tuple[int, int]]], token_budget: int, max_len: int | None,
                         batch_divisor: int) -> int:
  """Tokens the passes of a packed update hold (train.micro_batch_tokens > 0): each optimizer step's rows,
  given as (prompt, completion) lengths, packed by length (selfplay/sequences.length_groups, as
  step.update_params packs them), each micro-batch's rows padded to a multiple of the mesh's batch
  divisor (engine.bucketed_train_step)."""
  from compassplay_jax.selfplay.sequences import length_groups
  return sum(_round_up(rows, batch_divisor) * (prompt + completion)
             for lengths in chunks
             for _, rows, (prompt, completion) in length_groups(lengths, token_budget, max_len=max_len))


def reward_micro_batch(config_micro_batch: int, rows: int, batch_divisor: int) -> int:
  """Rows per g_ref / cosine micro-batch for a call of `rows` rows: engine.Engine.reward_micro_batch
  (the config's micro-batch, rounded up to the mesh, at most the call's rows rounded up to it)."""
  return min(_round_up(config_micro_batch, batch_divisor), _round_up(rows, batch_divisor))


def coding_step_plan(config, batch_divisor: int, *, valid_fraction: float = 1.0, host_workers: int = 64) -> StepPlan:
  """The device calls of one coding step (settings/coding/setting.py), all proposals valid at fraction 1.

  generate: the proposals in one call per decoding mode (coding.CodingSelfPlay._propose_all: the
  types that share a scaffold and prefix share a call; a scaffold decodes two segments), the solve-rate
  samples of the valid proposals in one call, the solver rollouts in one call. Checks: proposals are
  validated one after another (CodingSelfPlay.verify runs validation.validate_proposal per proposal
  on its host), one job each; the solve-rate samples and the rollouts on the sandbox pool's workers,
  one job per sample, beside the decoding of their call (BackgroundChecks). Reward (step.score with the external
  reference): g_ref over reward.reference_size rows; cosines of every valid candidate
  (report_cosine), micro-batches padded to the reward micro-batch (fixed_rows). Update: one row per
  proposal and per rollout, in train.ppo_mini_batches optimizer steps (coding.ppo_mini_batches; AZR: 1).
  """
  c = config.coding
  types = [t.strip() for t in c.task_types.split(",") if t.strip()]
  modes: dict[tuple, list[str]] = {}
  for t in types:
    scaffolded = bool(c.input_scaffold) and t != "induction"
    modes.setdefault((scaffolded, scaffolded or t != "induction"), []).append(t)
  generate = []
  for (scaffolded, _), group in modes.items():
    prompts = c.proposals_per_type * len(group)
    for segment in (("program", "input") if scaffolded else ("",)):
      generate.append(GenerateCall(f"proposals ({'/'.join(group)}{', ' + segment if segment else ''})", prompts, 1))
  proposals = c.proposals_per_type * len(types)
  valid = int(round(valid_fraction * proposals))
  if valid:
    generate.append(GenerateCall("solve-rate samples", valid, c.solve_samples))
  rollouts = c.solver_tasks_per_type * len(types)
  generate.append(GenerateCall("solver rollouts", rollouts, 1))
  r = config.reward
  uses_cos = uses_cosine(r.name) and valid > 0
  g_mb = reward_micro_batch(r.micro_batch_size, r.reference_size, batch_divisor)
  ref_rows = _round_up(r.reference_size, batch_divisor)
  cos_mb = _round_up(r.micro_batch_size, batch_divisor)
  train_mb = _round_up(config.train.micro_batch_size, batch_divisor)
  rows = proposals + rollouts
  k = max(1, min(config.train.ppo_mini_batches, rows))  # K near-equal pieces
  bounds = np.linspace(0, rows, k + 1).round().astype(int)  # as settings/coding/setting.ppo_mini_batches cuts them
  chunks = [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])]
  micro_batches, logprob_passes = _update_counts(config, chunks, train_mb)
  workers = config.sandbox.num_workers or host_workers  # 0 = the host's cores
  checks = (CheckBatch("proposals (one by one)", proposals, 1, workers),
            CheckBatch("solve-rate samples", 1, valid * c.solve_samples, workers, overlaps="solve-rate samples"),
            CheckBatch("solver rollouts", 1, rollouts, workers, overlaps="solver rollouts"))
  notes = [f"valid proposals: {valid} of {proposals} (assumed fraction {valid_fraction})"]
  if r.reference == "local":
    notes.append("reward.reference=local: one g_ref per seed; counted here as the external set (not modelled)")
  return StepPlan(
      "coding", tuple(generate), checks=checks,
      g_ref_passes=-(-ref_rows // g_mb) if uses_cos else 0, g_ref_rows=g_mb,
      cosine_passes=-(-valid // cos_mb) if uses_cos else 0, cosine_rows=cos_mb,
      train_micro_batches=micro_batches, train_rows=train_mb, optimizer_steps=k, logprob_passes=logprob_passes,
      update_chunks=tuple(chunks), notes=tuple(notes))


@dataclasses.dataclass(frozen=True)
class LeanOutcomes:
  """What a Lean iteration's counts depend on besides the config (stated assumptions)."""
  targets: int = 3323              # D3k (docs/paper_settings.md §1.2)
  solved_fraction: float = 0.5     # targets with a verified proof: the seeds conjectures are conditioned on
  valid_fraction: float = 0.515    # conjectures that parse and check (SGS §4.1: 51.5% parseable at start)
  eligible_fraction: float = 0.3   # valid conjectures with 0 < s < 1 (cosine computed)
  solver_row_fraction: float = 0.1  # proof attempts kept as solver rows (verified, 0 < s <= 0.5, no `try`)
  conjecture_row_fraction: float = 0.7  # eligible conjectures in SGS's band (s <= p70) with a nonzero advantage


def lean_iteration_plan(config, batch_divisor: int, outcomes: LeanOutcomes = LeanOutcomes(),
                        host_workers: int = 64) -> StepPlan:
  """The device calls of one Lean iteration (settings/lean/setting.py).

  generate: one conjecture call (conjectures_per_seed per seed; conditioning "seeds" = every solved
  target), one proof call (proofs_per_problem for every target and every valid conjecture). Checks:
  one Lean job per proof on the pool's lean.num_workers (0: the host's cores), beside the proofs'
  decoding (LeanSelfPlay._prove's BackgroundChecks). Reward (step.score, local reference): per seed with an eligible conjecture
  one g_ref of its one verified proof and one cosine call of its conjecture; each call's single row is
  padded to the mesh's batch divisor (alignment.reference_gradient / candidate_cosines without
  fixed_rows). Update: the rows in optimizer steps of lean.train_batch_size (one epoch), each in
  train micro-batches.
  """
  l, o = config.lean, outcomes
  if l.conditioning != "seeds":
    raise ValueError(f"lean_iteration_plan models conditioning='seeds', not {l.conditioning!r}")
  targets = o.targets if not l.targets_per_iteration else min(l.targets_per_iteration, o.targets)
  seeds = int(round(o.solved_fraction * o.targets))
  if l.seeds_per_iteration:
    seeds = min(seeds, l.seeds_per_iteration)
  conjectures = seeds * l.conjectures_per_seed
  valid = int(round(o.valid_fraction * conjectures))
  eligible = int(round(o.eligible_fraction * valid))
  proofs = (targets + valid) * l.proofs_per_problem
  generate = (GenerateCall("conjectures", seeds, l.conjectures_per_seed),
              GenerateCall("proofs (targets + valid conjectures)", targets + valid, l.proofs_per_problem))
  uses_cos = uses_cosine(config.reward.name)
  one_row = reward_micro_batch(config.reward.micro_batch_size, 1, batch_divisor)
  rows = int(round(o.solver_row_fraction * proofs)) + int(round(o.conjecture_row_fraction * eligible))
  size = l.train_batch_size or rows
  chunks = [min(size, rows - start) for start in range(0, rows, size)] * l.epochs_per_iteration
  steps = len(chunks)
  train_mb = _round_up(config.train.micro_batch_size, batch_divisor)
  micro_batches, logprob_passes = _update_counts(config, chunks, train_mb)
  notes = (f"targets {targets}; seeds {seeds} (solved fraction {o.solved_fraction}); conjectures {conjectures}, "
           f"valid {valid} ({o.valid_fraction}), eligible {eligible} ({o.eligible_fraction}); "
           f"train rows {rows} (solver {o.solver_row_fraction} of {proofs} proofs + conjectures "
           f"{o.conjecture_row_fraction} of eligible)",)
  return StepPlan(
      "lean", generate,
      checks=(CheckBatch("proofs", 1, proofs, l.num_workers or host_workers, overlaps=generate[1].label),),
      g_ref_passes=eligible if uses_cos else 0, g_ref_rows=one_row,
      cosine_passes=eligible if uses_cos else 0, cosine_rows=one_row,
      train_micro_batches=micro_batches, train_rows=train_mb, optimizer_steps=steps, logprob_passes=logprob_passes,
      update_chunks=tuple(chunks), notes=notes)


def check_seconds(batch: CheckBatch, job_s: float, timeout_fraction: float, timeout_s: float) -> float:
  """Expected wall seconds of a CheckBatch: each group's jobs spread over min(jobs, workers) processes
  at `job_s` each, plus the timeout's wall time when one of its jobs runs into it (each job does with
  probability `timeout_fraction`)."""
  if batch.workers < 1:
    raise ValueError(f"{batch.label}: workers={batch.workers} is less than 1")
  g = batch.jobs_per_group
  if not g or not batch.groups:
    return 0.0
  parallel = min(g, batch.workers)
  per_group = math.ceil(g / parallel) * job_s + (1 - (1 - timeout_fraction) ** g) * timeout_s
  return batch.groups * per_group


# ---- the program that runs: continuous engine, per-host copies, fixed costs, evaluation ----------
#
# What the loop runs (2026-12-04): every rollout and the evaluation go through the continuous engine
# (sampling/continuous.py) on the sampler mesh (engine.Engine.sampler_mesh: the mesh on one process,
# each host's own block of it across processes, with a whole bf16 weight copy per host), its slot
# count from the memory budget (half the free device memory after params and optimizer state,
# batching.device_memory_budget / slots_for_budget), its attention over power-of-two windows of the
# cache (slots.windows) sized by the longest live row, chunks of sampling.chunk_tokens steps with a
# host read after each. The functions below model that program; experiments/step_time.py prices it.

def param_count(cfg) -> int:
  """Parameters of a models.config.ModelConfig decoder (embedding, blocks, final norm, LM head)."""
  h, i, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
  q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
  attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if getattr(cfg, "attention_bias", False) else 0)
  block = attn + 3 * h * i + 2 * h
  head = 0 if cfg.tie_word_embeddings else v * h
  return v * h + layers * block + h + head


def matmul_params(cfg) -> int:
  """Parameters a token's forward multiplies by (all but the embedding lookup; the LM head counts)."""
  return param_count(cfg) - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def free_device_bytes(limit_bytes: float, params: int, devices: int, state_bytes_per_param: int = 12) -> float:
  """Per-device bytes free when the rollout engine measures its budget: the allocator's limit less the
  fp32 params and AdamW's two fp32 moments (12 bytes a parameter), spread over `devices`."""
  free = limit_bytes - state_bytes_per_param * params / devices
  if free <= 0:
    raise ValueError(f"params and optimizer state ({state_bytes_per_param * params / devices:.3g} B per device) "
                     f"exceed the device limit {limit_bytes:.3g} B")
  return free


def engine_slots(cfg, cache_length: int, budget_bytes: float, max_bucket: int, *, tensor: int, batch_divisor: int,
                 cache_dtype: str = "bfloat16", max_prefill_tokens: int = 2048) -> int:
  """The continuous engine's slot count at this cache length (ContinuousEngine.max_slots): the budget
  per device less a prefill of the engine's prefill rows at max_bucket, over batching.bytes_per_slot,
  times the batch devices."""
  from compassplay_jax.sampling import batching
  prefill_rows = batching.pow2_at_most(max(1, max_prefill_tokens // max_bucket))
  per_device = batching.slots_for_budget(cfg, cache_length, cache_dtype, int(budget_bytes), max_bucket,
                                         tensor=tensor, prefill_rows=prefill_rows)
  return per_device * batch_divisor


def paged_engine_layout(cfg, budget_bytes: float, page_size: int, max_bucket: int, max_new: int, *, tensor: int,
                        batch_divisor: int, rows: int | None = None, paged_fill: float = 0.5,
                        cache_dtype: str = "bfloat16", max_prefill_tokens: int = 2048) -> tuple[int, int]:
  """(slots over the mesh, pool pages per batch shard with its trash page) of the paged engine
  (ContinuousEngine.paged_layout with a memory budget): batching.paged_layout_for_budget per device,
  rows expected to fill paged_fill of their budget; for a call of `rows` rows (None: the most the
  budget allows), at most its rows rounded up (call_slots) and no more pages than those slots hold."""
  from compassplay_jax.sampling import batching
  prefill_rows = batching.pow2_at_most(max(1, max_prefill_tokens // max_bucket))
  need = max_bucket + max_new
  local, pages = batching.paged_layout_for_budget(cfg, int(budget_bytes), page_size, cache_dtype, max_bucket,
                                                  max_bucket + paged_fill * max_new, need, tensor=tensor,
                                                  prefill_rows=prefill_rows)
  slots = local * batch_divisor
  if rows is None:
    return slots, pages
  slots = call_slots(slots, rows, batch_divisor)
  return slots, min(pages, slots // batch_divisor * -(-need // page_size) + 1)


def pow2_at_least(n: int) -> int:
  return 1 << (max(int(n), 1) - 1).bit_length()


def call_slots(max_slots: int, rows: int, batch_divisor: int) -> int:
  """Slots a generate call of `rows` rows uses (ContinuousEngine._shape): at most its rows rounded up
  to a power of two (and to the batch divisor)."""
  want = pow2_at_least(rows)
  want = max(batch_divisor, -(-want // batch_divisor) * batch_divisor)
  return min(max_slots, want)


def windows(length: int, smallest: int = 64) -> tuple[int, ...]:
  """slots.windows: length, length/2, ... down to `smallest`."""
  out = [length]
  while out[-1] % 2 == 0 and out[-1] // 2 >= smallest:
    out.append(out[-1] // 2)
  return tuple(out)


@dataclasses.dataclass
class ContinuousRun:
  """One continuous-engine generate call, simulated chunk by chunk.

  steps: decode steps; chunks: decode_chunk calls (one host read each); shape_steps: {(slots,
  window): decode steps run at that slot count and attention window}; slot_window_entries: sum over
  steps of slots x window (cache columns attention reads, all slots); filled_entries: what attention
  over each live row's filled columns would read instead; prefills: [(rows, bucket)] per prefill call;
  inserts: insert calls; compacts: {(from, to)} slot-count moves."""
  steps: int = 0
  chunks: int = 0
  shape_steps: dict = dataclasses.field(default_factory=dict)
  slot_window_entries: int = 0
  filled_entries: int = 0
  prefills: list = dataclasses.field(default_factory=list)
  inserts: int = 0
  compacts: set = dataclasses.field(default_factory=set)
  useful_slot_steps: int = 0
  # Paged runs (paged_run): {(slots, columns read per step on the fullest device): steps}; the columns
  # are the live rows' held pages (page_size each); preempted rows and the decode steps they lost.
  paged_steps: dict = dataclasses.field(default_factory=dict)
  preempted: int = 0
  lost_steps: int = 0
  table_width: int = 0  # pages per row of the kernels' page table (one per call)


def _drain_shrink(run: ContinuousRun, slots: int, live: int, d: int, shrink_floor: int) -> int:
  """The drain's shrink (ContinuousEngine._shrink): divisor x the power of two holding the live rows
  of a shard (an even split), at least shrink_floor a shard; the move is recorded as a compact."""
  need = max(pow2_at_least(-(-live // d)), shrink_floor)
  if need < slots // d:
    run.compacts.add((slots, d * need))
    return d * need
  return slots


def _admission_calls(run: ContinuousRun, taken, buckets, samples: int, prefilled: set, d: int,
                     max_prefill_tokens: int) -> None:
  """One admission's device calls (both engines): the new prompts among the taken rows prefilled
  together per bucket, at most prefill_rows_cap rows a call (padded to a power of two times the
  divisor), then one insert per prefill the rows come from."""
  new = sorted({r // samples for r in taken} - prefilled)
  by_bucket: dict[int, int] = {}
  for p in new:
    by_bucket[int(buckets[p * samples])] = by_bucket.get(int(buckets[p * samples]), 0) + 1
  calls = 0
  for b, count in by_bucket.items():
    cap = (1 << (max(1, max_prefill_tokens // b).bit_length() - 1)) * d
    for start in range(0, count, cap):
      part = min(cap, count - start)
      run.prefills.append((min(max(d, -(-pow2_at_least(part) // d) * d), cap), b))
      calls += 1
  prefilled.update(new)
  run.inserts += max(calls, 1)


def continuous_run(lengths: Sequence[int], buckets: Sequence[int], slots: int, *, cache_length: int, chunk: int = 8,
                   batch_divisor: int = 1, samples: int = 1, shrink_floor: int = 4,
                   max_prefill_tokens: int = 2048) -> ContinuousRun:
  """ContinuousEngine.generate's schedule for rows of `lengths` tokens (token 0 from the prefill, so
  L - 1 decode steps) whose prompts pad to `buckets` (one per row; rows k*samples .. are one prompt's
  samples), arrival order, refill_threshold 1:
  * admission fills every free slot from the queue; the new prompts among the admitted rows are
    prefilled together, per bucket, at most prefill_rows_cap rows a call (padded to a power of two
    times the divisor), then one insert per prefill the rows come from;
  * a chunk runs up to `chunk` steps, ending once a slot frees while rows wait;
  * its window is the smallest of windows(cache_length) holding every live row's bucket + tokens so
    far + the chunk;
  * once no row waits, the slots shrink to divisor x the power of two holding the live rows (at least
    shrink_floor per batch device; the engine counts the fullest shard, taken here as an even split).
  """
  if slots < 1 or chunk < 1:
    raise ValueError(f"slots={slots}, chunk={chunk}: both must be at least 1")
  lengths = [int(x) for x in lengths]
  if len(buckets) != len(lengths):
    raise ValueError(f"{len(buckets)} buckets for {len(lengths)} rows")
  wins = windows(cache_length)
  d = batch_divisor
  run = ContinuousRun()
  rem = np.zeros(0, np.int64)      # decode steps left per live row
  filled = np.zeros(0, np.int64)   # columns a live row has filled: bucket + tokens so far
  queue, q = list(range(len(lengths))), 0
  prefilled: set[int] = set()
  while True:
    free = slots - len(rem)
    while free > 0 and q < len(queue):
      taken = queue[q:q + free]
      q += len(taken)
      _admission_calls(run, taken, buckets, samples, prefilled, d, max_prefill_tokens)
      keep = [r for r in taken if lengths[r] > 1]
      if len(keep) < len(taken):  # a row of one token ends at its insert: its slot frees after a 0-step chunk
        run.chunks += 1
      rem = np.concatenate([rem, np.asarray([lengths[r] - 1 for r in keep], np.int64)])
      filled = np.concatenate([filled, np.asarray([int(buckets[r]) + 1 for r in keep], np.int64)])
      free = slots - len(rem)
    if not len(rem):
      if q >= len(queue):
        return run
      continue
    waiting = q < len(queue)
    if not waiting:
      slots = _drain_shrink(run, slots, len(rem), d, shrink_floor)
    n = int(min(chunk, rem.min() if waiting else rem.max()))
    reach = int(filled.max()) + chunk
    window = min(w for w in wins if w >= min(reach, cache_length))
    key = (slots, window)
    run.shape_steps[key] = run.shape_steps.get(key, 0) + n
    run.steps += n
    run.chunks += 1
    run.slot_window_entries += n * slots * window
    # Entries over the filled columns: a live row's k-th step of the chunk reads filled + k columns.
    live_steps = np.minimum(rem, n)
    run.filled_entries += int(np.sum(live_steps * filled + live_steps * (live_steps - 1) // 2))
    run.useful_slot_steps += int(live_steps.sum())
    rem = rem - n
    filled = filled + n
    alive = rem > 0
    rem, filled = rem[alive], filled[alive]


def paged_run(lengths: Sequence[int], buckets: Sequence[int], slots: int, *, pages_per_shard: int, page_size: int,
              chunk: int = 8, batch_divisor: int = 1, samples: int = 1, shrink_floor: int = 4,
              max_prefill_tokens: int = 2048) -> ContinuousRun:
  """The paged engine's schedule (ContinuousEngine._generate_paged) for rows as continuous_run's:
  * a row holds the pages of the columns it reaches through its next chunk (prompt bucket + tokens +
    chunk), from its shard's pool (pages_per_shard - 1 usable; the shards taken as an even split of
    the slots and pages, as continuous_run splits the drain);
  * admission takes the next row while a free slot's shard has pages for it; before each chunk the
    live rows grow oldest first and, when pages run short, the youngest is preempted: its pages
    return, it restarts from its prompt later (its steps so far lost);
  * a decode step reads each live row's held pages (the gather and the kernels read pages, not a
    window): paged_steps {(slots, columns read on the fullest device): steps};
  * the drain shrinks the slots as continuous_run's does.
  Prompt pages shared by a prompt's samples are counted once per sample (an upper bound on pages)."""
  if slots < 1 or chunk < 1:
    raise ValueError(f"slots={slots}, chunk={chunk}: both must be at least 1")
  lengths = [int(x) for x in lengths]
  if len(buckets) != len(lengths):
    raise ValueError(f"{len(buckets)} buckets for {len(lengths)} rows")
  d = batch_divisor
  pool = d * (pages_per_shard - 1)
  pages_of = lambda cols: -(-int(cols) // page_size)
  run = ContinuousRun(table_width=pages_of(max(int(b) for b in buckets) + max(lengths)))
  live: list[list[int]] = []  # [row, steps left, columns filled] in admission order (oldest first)
  queue, q = list(range(len(lengths))), 0
  requeued: list[int] = []
  prefilled: set[int] = set()
  # A row of L tokens after a prompt of P columns, k tokens drawn: f = P + k; it has written f - 1
  # columns and holds the pages of min(f + chunk, P + L) - 1 (ContinuousEngine._generate_paged's reach).
  reach = lambda r, f, n: pages_of(min(f + n, int(buckets[r]) + lengths[r]) - 1)
  held = lambda: sum(reach(r, f, chunk) for r, _, f in live)
  while True:
    # Grow the live rows for this chunk; preempt the youngest while short.
    used = held()
    while live and used > pool:
      r, left, _ = live.pop()
      run.preempted += 1
      run.lost_steps += lengths[r] - 1 - left
      run.useful_slot_steps -= lengths[r] - 1 - left
      requeued.append(r)
      used = held()
    admitted = False
    while True:  # as continuous_run: slots of rows that end at their insert (one token) are refilled
      free, taken = slots - len(live), []
      while free > 0 and (requeued or q < len(queue)):
        r = requeued[-1] if requeued else queue[q]
        want = reach(r, int(buckets[r]) + 1, chunk)
        if used + want > pool:
          break
        used += want
        if requeued:
          requeued.pop()
        else:
          q += 1
        taken.append(r)
        free -= 1
      if not taken:
        break
      admitted = True
      _admission_calls(run, taken, buckets, samples, prefilled, d, max_prefill_tokens)
      live += [[r, lengths[r] - 1, int(buckets[r]) + 1] for r in taken if lengths[r] > 1]
      if all(lengths[r] > 1 for r in taken):
        break
      run.chunks += 1  # the one-token rows end at their insert: their slots free after a 0-step chunk
      used -= sum(reach(r, int(buckets[r]) + 1, chunk) for r in taken if lengths[r] <= 1)
    if not live:
      if q >= len(queue) and not requeued:
        return run
      if not admitted:
        raise ValueError(f"no row fits a pool of {pool} pages of {page_size}")
      continue
    waiting = q < len(queue) or bool(requeued)
    if not waiting:
      slots = _drain_shrink(run, slots, len(live), d, shrink_floor)
    lefts = [left for _, left, _ in live]
    n = int(min(chunk, min(lefts) if waiting else max(lefts)))
    # Columns read per step on the fullest device: the live rows' pages split evenly over the shards.
    columns = -(-sum(reach(r, f, n) for r, _, f in live) // d) * page_size
    key = (slots, columns)
    run.paged_steps[key] = run.paged_steps.get(key, 0) + n
    run.steps += n
    run.chunks += 1
    steps = [min(left, n) for _, left, _ in live]
    run.useful_slot_steps += sum(steps)
    run.filled_entries += sum(k * f + k * (k - 1) // 2 for k, (_, _, f) in zip(steps, live))
    live = [[r, left - k, f + k] for (r, left, f), k in zip(live, steps) if left - k > 0]


@dataclasses.dataclass(frozen=True)
class Mesh:
  """The devices one generate call runs on (one host's block across processes) and how they split
  it: slots over batch_divisor (data x fsdp), KV heads over tensor."""
  devices: int
  batch_divisor: int
  tensor: int


def sampler_mesh(devices: int, batch_divisor: int, tensor: int, hosts: int) -> Mesh:
  """The sampler mesh of a (data x fsdp = batch_divisor, tensor) mesh over `devices` chips on `hosts`
  processes (sharding.host_meshes: the outer axes split between hosts, tensor inside one): one
  process keeps the mesh; across processes each host samples on devices / hosts chips, its batch
  axes divided by the hosts, with a whole weight copy."""
  if devices % hosts or batch_divisor % hosts and hosts > 1:
    raise ValueError(f"{devices} devices (batch {batch_divisor}) do not split into {hosts} host blocks")
  if hosts == 1:
    return Mesh(devices, batch_divisor, tensor)
  return Mesh(devices // hosts, batch_divisor // hosts, tensor)


def sampler_weight_bytes(cfg, mesh: Mesh, itemsize: int = 2) -> float:
  """Weight bytes each chip of the sampler mesh holds and reads every decode step: the compute-dtype
  copy (Engine.sampler_params) split over that mesh's chips (per host across processes)."""
  return param_count(cfg) * itemsize / mesh.devices


def kv_entry_bytes(cfg, mesh: Mesh, itemsize: int = 2) -> int:
  """Bytes of one cache column of one slot on one device (K and V, all layers; KV heads split over
  tensor where they divide it, as batching.bytes_per_slot)."""
  kv = cfg.num_key_value_heads
  kv = kv // mesh.tensor if mesh.tensor > 1 and kv % mesh.tensor == 0 else kv
  return 2 * cfg.num_hidden_layers * kv * cfg.head_dim * itemsize


def decode_step_figures(cfg, mesh: Mesh, slots: int, window: int, *, weight_itemsize: int = 2,
                        cache_itemsize: int = 2) -> tuple[float, float, float]:
  """(FLOPs, HBM bytes, link bytes) per device of one decode step of `slots` slots attending over
  `window` cache columns: matmuls 2 x matmul_params per row and q.k + p.v 4 x heads x head_dim per
  column and layer, split over the mesh; the weight copy read once plus each local slot's `window`
  columns; the tensor axis's two all-reduces per layer of the local rows' hidden states (bf16, ring
  2(t-1)/t)."""
  flops = (2 * matmul_params(cfg) * slots
           + 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers * window * slots) / mesh.devices
  local = slots / mesh.batch_divisor
  hbm = sampler_weight_bytes(cfg, mesh, weight_itemsize) + local * window * kv_entry_bytes(cfg, mesh, cache_itemsize)
  t = mesh.tensor
  link = 2 * cfg.num_hidden_layers * local * cfg.hidden_size * 2 * 2 * (t - 1) / t if t > 1 else 0.0
  return flops, hbm, link


def paged_step_figures(cfg, mesh: Mesh, slots: int, columns: int, *, weight_itemsize: int = 2,
                       cache_itemsize: int = 2, kv_read_factor: float = 1.0) -> tuple[float, float, float]:
  """(FLOPs, HBM bytes, link bytes) per device of one paged decode step whose fullest device's rows
  hold `columns` cache columns in pages: the matmuls of `slots` rows as decode_step_figures, the
  attention over those columns only (per device, not a window per slot). kv_read_factor: the KV bytes
  read per held byte (1: each page read once, as the Pallas kernels do; XLA:CPU's cost analysis of
  the gather path counts ~4: experiments/bench_paged_bytes.py --analytic)."""
  f, b, link = decode_step_figures(cfg, mesh, slots, 0, weight_itemsize=weight_itemsize,
                                   cache_itemsize=cache_itemsize)
  t = mesh.tensor if mesh.tensor > 1 and cfg.num_attention_heads % mesh.tensor == 0 else 1
  attn = 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers * columns / t
  return f + attn, b + kv_read_factor * columns * kv_entry_bytes(cfg, mesh, cache_itemsize), link


def forward_flops(cfg, rows: int, length: int, *, causal: bool = True) -> float:
  """FLOPs of one forward over rows x length tokens: 2 x matmul_params a token, attention q.k and p.v
  over the causal half (a fused kernel skips the masked blocks) or the whole square."""
  attention = 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers * length * length
  return rows * (2 * matmul_params(cfg) * length + (attention / 2 if causal else attention))


@dataclasses.dataclass(frozen=True)
class FixedCosts:
  """Per-event costs no FLOP or byte count holds (seconds; each a stated assumption, see `source`)."""
  collective_latency_s: float  # one small all-reduce over the tensor axis
  step_launch_s: float         # per decode step: kernel launches the compiled loop cannot hide
  chunk_sync_s: float          # per decode chunk: dispatch, device->host read of (slots, chunk+1) tokens, host loop
  call_s: float                # per prefill / insert / compact call: dispatch and its host side
  source: str = ""

  def decode_step(self, cfg) -> float:
    """Fixed seconds of one decode step: two tensor all-reduces per layer (not overlapped) + launches."""
    return 2 * cfg.num_hidden_layers * self.collective_latency_s + self.step_launch_s


def run_seconds(run: ContinuousRun, cfg, mesh: Mesh, hw: "Hardware", eff: "Efficiency", fixed: FixedCosts, *,
                tensor_collectives: bool = True, paged_kv_read_factor: float = 1.0) -> dict:
  """Seconds of a simulated call by part: decode (the steps at their slot counts and windows),
  decode_fixed (per-step latencies), sync (per chunk), prefill (compute and per call), plus
  'filled' (the decode seconds had attention read only each row's filled columns: a paged kernel)."""
  decode = 0.0
  for (slots, window), steps in run.shape_steps.items():
    f, b, link = decode_step_figures(cfg, mesh, slots, window)
    decode += steps * seconds(f, b, link, hw, eff)
  for (slots, columns), steps in run.paged_steps.items():  # paged: each device reads its rows' pages
    f, b, link = paged_step_figures(cfg, mesh, slots, columns, kv_read_factor=paged_kv_read_factor)
    decode += steps * seconds(f, b, link, hw, eff)
  # The same steps with attention over the filled columns: cache bytes and attention FLOPs scaled.
  filled_share = run.filled_entries / run.slot_window_entries if run.slot_window_entries else 1.0
  filled = decode if run.paged_steps else 0.0  # a paged run reads held pages only: its decode is the floor
  for (slots, window), steps in run.shape_steps.items():
    f, b, link = decode_step_figures(cfg, mesh, slots, window)
    w0 = sampler_weight_bytes(cfg, mesh)
    f0 = 2 * matmul_params(cfg) * slots / mesh.devices
    filled += steps * seconds(f0 + (f - f0) * filled_share, w0 + (b - w0) * filled_share, link, hw, eff)
  prefill = sum(seconds(forward_flops(cfg, rows, bucket) / mesh.devices,
                        sampler_weight_bytes(cfg, mesh), 0.0, hw, eff) for rows, bucket in run.prefills)
  per_step = fixed.decode_step(cfg) if tensor_collectives and mesh.tensor > 1 else fixed.step_launch_s
  calls = len(run.prefills) + run.inserts + len(run.compacts)
  return {"decode": decode, "decode_fixed": run.steps * per_step, "sync": run.chunks * fixed.chunk_sync_s,
          "prefill": prefill + calls * fixed.call_s, "filled_decode": filled}


def rollout_programs(runs: Sequence[tuple[int, ContinuousRun]]) -> dict[str, int]:
  """Distinct programs the runs compile (jit caches per shape): decode_chunk per (cache length,
  slots, window), prefill and insert per (cache length, rows, bucket), compact per (from, to);
  runs: (cache length, run) pairs."""
  decode, prefill, compact = set(), set(), set()
  for length, run in runs:
    decode.update((length, s, w) for s, w in run.shape_steps)
    # paged (the kernels on GPU / TPU): one table width per call, so one decode program per slot count
    decode.update((length, s, run.table_width) for s, _ in run.paged_steps)
    prefill.update((length, r, b) for r, b in run.prefills)
    compact.update((length,) + c for c in run.compacts)
  return {"decode": len(decode), "prefill": len(prefill), "insert": len(prefill), "compact": len(compact)}


def checkpoint_seconds(state_bytes: float, every_steps: int, *, async_save: bool, write_bytes_s: float,
                       host_copy_bytes_s: float, hosts: int = 1) -> float:
  """Loop seconds per step that saving costs: a synchronous save writes the whole state (each host its
  share at write_bytes_s); an async one (Orbax) blocks only for the device->host copy of the host's
  share, the write going on in the background during the next steps. Every `every_steps` steps."""
  if every_steps <= 0:
    return 0.0
  share = state_bytes / hosts
  blocked = share / host_copy_bytes_s if async_save else share / write_bytes_s
  return blocked / every_steps


def evaluation_steps(steps: int, every: int, dense_every: int, dense_from: int, at_start: bool) -> list[int]:
  """The steps after which the loop evaluates (evals/harness.due for steps 0..steps)."""
  out = []
  for step in range(steps + 1):
    if step == 0:
      ok = at_start and bool(every or dense_every)
    else:
      ok = bool(every and step % every == 0) or bool(dense_every and step >= dense_from and step % dense_every == 0)
    if ok:
      out.append(step)
  return out


def greedy_lengths(n: int, mean: float, sigma: float, budget: int, runaway: float,
                   rng: np.random.Generator) -> np.ndarray:
  """Greedy completion lengths: a log-normal of `mean` capped at `budget`, and a `runaway` fraction of
  rows that never end (greedy repetition loops) and run to the budget."""
  lengths = lognormal_lengths(n, mean, sigma, budget, rng)
  lengths[rng.random(n) < runaway] = budget
  return lengths
