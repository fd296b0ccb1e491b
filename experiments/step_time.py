"""Step time of the paper configs on 8 accelerators (TPU v5p chips, H100 SXM), per phase of a step.

For configs/coding.py (one coding step) and configs/lean.py (one Lean iteration):
  1. what the step calls, counted from the config (step_time_model.coding_step_plan /
     lean_iteration_plan) with the outcome rates no config holds as stated assumptions (flags);
  2. FLOPs, HBM bytes and collective bytes per device of each device function the step runs, from
     XLA's ahead-of-time cost analysis of the run's own engine functions at the config's mesh and
     dtypes (memory_report.lower_function; 8 simulated CPU devices, or with `--topology v5p:2x2x2`
     and libtpu on PYTHONPATH the TPU compiler), cached per function as JSON in --cache;
  3. decode steps for response lengths drawn from a stated log-normal: the static schedule (what the
     sampler does), continuous batching with as many slots, and continuous batching with more slots
     whose attention reads only the filled part of each row's cache (step_time_model);
  4. seconds = max(FLOPs / (peak x eff), bytes / (HBM x eff), collective bytes / (link x eff)) per call,
     where a decode step's bytes are the weights and KV cache a device holds, read once
     (`decode_figures`: XLA counts the in-place cache update as whole-cache traffic).

XLA's cost analysis counts a loop body once, whatever its trip count (the train step over 2
micro-batches and over 1 report the same FLOPs; tests/test_step_time.py), so each function is
compiled as a loop-free "unit" of the run's program and multiplied by how often a step runs it:
blocks unrolled (scan_layers off), plain attention (attention_query_chunk 0: the same FLOPs; the
paper configs' chunked attention also recomputes each query block's scores in the backward pass,
not counted), one micro-batch per call (g_ref, cosines, train). The decode loop's body is one
decode step, so the decode function's figures are per step. Figures are per device: XLA reports the
SPMD-partitioned program (the tiny model's train step on 8 devices costs 1/7.6 of one device's).

  python3 experiments/step_time.py --program             # the program that runs (below): ~30 s, no compile
  python3 experiments/step_time.py                       # both settings, XLA:CPU; compiles what is not cached
  PYTHONPATH=/tmp/libtpu python3 experiments/step_time.py --topology v5p:2x2x2   # the TPU compiler's figures
  python3 experiments/step_time.py --setting coding --no-compile   # tables from the cache only
  python3 experiments/step_time.py --tiny --cache /tmp/st          # the tiny model, seconds (tests)
`--program` prices the coding step as the loop runs it today, evaluation included, on 8 x H100 (one
host) and v5p-8 (two hosts of 4 chips, each sampling on its own chips with a whole bf16 weight copy):
the continuous engine's slot count from its memory budget, its chunks, power-of-two attention windows
and drain simulated call by call (step_time_model.continuous_run), decode steps priced from analytic
FLOPs and bytes (step_time_model.decode_step_figures), the fixed costs per decode step, chunk and call,
the compiled programs, checkpoints, and evaluation as one greedy queue through the same engine at the
config's cadence; reward and update passes as compute-bound with fused attention (docs/sharding.md,
"Step time of the program that runs").
A 7B unit compiles in 0.5-6 minutes on XLA:CPU and 0.5-26 on the TPU compiler (2 busy cores, up to 9
GB of memory): run one process at a time (libtpu also allows only one).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
import sys
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = {"coding": ("configs/coding.py", "azr-coding"), "lean": ("configs/lean.py", "sgs-lean")}
# The paper's budget (issue 25): 200 coding steps ~ 109 GPU-hours on 8 GPUs.
PAPER_BUDGET = {"coding": 109 * 3600 / 200 / 8}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--setting", action="append", choices=sorted(SETTINGS), help="repeatable; default both")
  p.add_argument("--coding-config", default="configs/coding.py", help="config file[:variant]")
  p.add_argument("--lean-config", default="configs/lean.py", help="config file[:variant]")
  p.add_argument("--tiny", action="store_true", help="the :tiny configs and memory_report's tiny model (tests)")
  p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (the mesh is the config's)")
  p.add_argument("--topology", help="compile for a TPU slice with libtpu, e.g. v5p:2x2x2 (else XLA:CPU)")
  p.add_argument("--cache", default=str(REPO / "runs" / "step_time"), help="per-function JSON figures")
  p.add_argument("--no-compile", action="store_true", help="use cached figures only; stop if one is missing")
  # Length distributions (step_time_model.lognormal_lengths), capped at sampling.max_new_tokens.
  p.add_argument("--coding-mean-tokens", type=float, default=1000.0,
                 help="mean response tokens (issue 25's estimate: ~2M tokens over ~1.9k sequences)")
  p.add_argument("--lean-mean-tokens", type=float, default=750.0,
                 help="mean response tokens (SGS: >6B generated tokens over ~8M generations)")
  p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of response lengths")
  p.add_argument("--coding-prompt-bucket", type=int, default=2048,
                 help="prompt bucket the sampler pads to (AZR proposer prompts ~2000 tokens, solver ~400-750)")
  p.add_argument("--lean-prompt-bucket", type=int, default=512, help="prompt bucket (statements: median 194 chars)")
  p.add_argument("--slots", type=int, help="continuous-batching slots (default: sampling.micro_batch_size)")
  p.add_argument("--coding-wide-slots", type=int, default=256, help="a second, larger slot count (coding)")
  p.add_argument("--lean-wide-slots", type=int, default=64,
                 help="a second, larger slot count (Lean: 32 KV heads, ~0.5 MB of cache per token)")
  p.add_argument("--trials", type=int, default=20, help="length draws averaged")
  p.add_argument("--seed", type=int, default=0)
  # Outcome rates (step_time_model.LeanOutcomes and the coding plan).
  p.add_argument("--valid-fraction", type=float, default=1.0, help="coding: valid proposals (1 = the upper bound)")
  p.add_argument("--lean-targets", type=int, help="targets (default: the config's target file, else D3k's 3323)")
  p.add_argument("--lean-solved-fraction", type=float, default=0.5)
  p.add_argument("--lean-valid-fraction", type=float, default=0.515)
  p.add_argument("--lean-eligible-fraction", type=float, default=0.3)
  p.add_argument("--lean-solver-row-fraction", type=float, default=0.1)
  # Verifiers.
  p.add_argument("--host-workers", type=int, default=64, help="sandbox workers when sandbox.num_workers is 0")
  p.add_argument("--sandbox-job-s", type=float, default=0.0132,
                 help="CPU seconds per sandbox job (docs/sandbox.md: 151 programs/s on 2 workers)")
  p.add_argument("--lean-proof-s", type=float, default=13.9,
                 help="CPU seconds per Lean proof (kimina-lean-server: 1000 proofs in 3:51 on 60 CPUs)")
  p.add_argument("--timeout-fraction", type=float, default=0.01, help="jobs that run into the verifier timeout")
  # Efficiencies.
  p.add_argument("--flops-eff", type=float, default=0.4, help="fraction of peak FLOP/s")
  p.add_argument("--hbm-eff", type=float, default=0.65, help="fraction of HBM bandwidth")
  p.add_argument("--link-eff", type=float, default=0.5, help="fraction of inter-chip bandwidth")
  # The program that runs (--program): analytic figures, the engine's schedule simulated; no compile.
  g = p.add_argument_group("--program: the coding step as the loop runs it, evaluation included")
  g.add_argument("--program", action="store_true",
                 help="print the table of the program that runs (configs/coding.py, 8 x H100 and v5p-8)")
  g.add_argument("--program-trials", type=int, default=3, help="length draws per call (and per evaluation)")
  g.add_argument("--kv-layout", choices=("config", "paged", "dense"), default="config",
                 help="the engine's KV layout: the config's sampling.kv_layout ('auto' is paged), or either")
  g.add_argument("--page-size", type=int, default=16, help="paged layout: columns a page (the engine's default)")
  g.add_argument("--paged-read-factor", type=float, default=1.0,
                 help="paged layout: KV bytes read per held byte (1: the kernels read each page once; XLA:CPU's "
                      "cost analysis of the gather counts ~4: bench_paged_bytes.py --analytic)")
  g.add_argument("--proposal-bucket", type=int, default=2048, help="proposer prompts' bucket (AZR: ~2,000 tokens)")
  g.add_argument("--solver-bucket", type=int, default=768, help="solver prompts' bucket (AZR: 400-750 tokens)")
  g.add_argument("--h100-mem-fraction", type=float, default=0.75,
                 help="JAX's GPU pool: XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75)")
  g.add_argument("--h100-collective-us", type=float, default=10.0,
                 help="latency of one small tensor-axis all-reduce over NVLink (assumed)")
  g.add_argument("--v5p-collective-us", type=float, default=5.0, help="the same over ICI (assumed)")
  g.add_argument("--h100-launch-ms", type=float, default=0.3,
                 help="kernel launches per decode step a GPU while-loop body cannot hide (assumed)")
  g.add_argument("--v5p-launch-ms", type=float, default=0.0, help="the same on TPU (one program per chunk)")
  g.add_argument("--chunk-sync-ms", type=float, default=2.0,
                 help="per decode chunk: dispatch, device->host read, the host loop over the slots (assumed)")
  g.add_argument("--call-ms", type=float, default=1.0, help="per prefill / insert / compact call (assumed)")
  g.add_argument("--compile-s", type=float, default=30.0, help="compile seconds per rollout program (assumed)")
  g.add_argument("--compile-train-s", type=float, default=120.0,
                 help="compile seconds per update / reward program (assumed)")
  g.add_argument("--write-gb-s", type=float, default=0.4,
                 help="checkpoint write GB/s (docs/training.md: 1.62 GB in 3.6-4.5 s, 2 CPU cores)")
  g.add_argument("--host-copy-gb-s", type=float, default=10.0,
                 help="device->host copy GB/s per host, what an async save blocks on (assumed)")
  g.add_argument("--host-other-s", type=float, default=10.0,
                 help="other host seconds per step: tokenizing, packing, gathers, metrics (assumed)")
  g.add_argument("--eval-code-mean", type=float, default=700.0, help="greedy tokens, code benchmarks (assumed)")
  g.add_argument("--eval-math-mean", type=float, default=1000.0, help="greedy tokens, math benchmarks (assumed)")
  g.add_argument("--eval-runaway", type=float, default=0.03,
                 help="greedy rows that never end and run to their budget (assumed)")
  g.add_argument("--no-eval-sensitivity", dest="eval_sensitivity", action="store_false",
                 help="skip the evaluation sensitivity table")
  g.add_argument("--chars-per-token", type=float, default=3.5, help="prompt chars per token (assumed)")
  g.add_argument("--math-check-s", type=float, default=0.02, help="CPU seconds per math answer check (assumed)")
  return p.parse_args(argv)


# ---- what is compiled -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Unit:
  """One loop-free program of the step: `function` of memory_report.lower_function at `work`'s shapes."""
  key: str
  function: str
  work: object
  shapes: str
  length: int = 0  # tokens per row of a full-sequence pass


def plan_units(plan, work0, config, prompt_bucket: int, rows: int, mean_tokens: float) -> dict[str, Unit]:
  """The step's device functions as loop-free units. Lengths: the sampler's cache is the prompt bucket
  + max_new_tokens (what it allocates); a reward pass is the prompt bucket + the bucket of a mean
  completion (its rows are packed to their own length buckets, at most reward.max_completion_tokens);
  a train micro-batch is the prompt bucket + max_new_tokens (the update pads every row to the batch's
  longest, and a batch of hundreds of rows reaches the cap)."""
  from compassplay_jax.runtime import config_base
  from compassplay_jax.selfplay.sequences import TRAIN_BUCKETS, bucket
  s = config.sampling
  new = s.max_new_tokens
  completion = min(config.reward.max_completion_tokens or new, bucket(int(math.ceil(mean_tokens)), TRAIN_BUCKETS))
  reward_len = min(config_base.reward_sequence_len(config), prompt_bucket + completion)
  train_len = min(config_base.train_sequence_len(config), prompt_bucket + new)
  base = dataclasses.replace(work0, sampler_rows=rows, prompt_len=prompt_bucket, max_new_tokens=new)
  units = {
      "prefill": Unit("prefill", "prefill", base, f"{rows} x {prompt_bucket}"),
      "decode": Unit("decode", "decode", base, f"{rows} rows, cache {prompt_bucket}+{new}"),
      "train": Unit("train", "train", dataclasses.replace(base, train_batch=plan.train_rows,
                                                          train_micro_batch=plan.train_rows, seq_len=train_len),
                    f"{plan.train_rows} x {train_len}", train_len),
  }
  if plan.g_ref_passes:
    units["g_ref"] = Unit("g_ref", "g_ref", dataclasses.replace(
        base, reference_size=plan.g_ref_rows, reward_micro_batch=plan.g_ref_rows, seq_len=reward_len),
        f"{plan.g_ref_rows} x {reward_len}", reward_len)
  if plan.cosine_passes:
    units["cosines"] = Unit("cosines", f"cos{plan.cosine_rows}", dataclasses.replace(
        base, reward_micro_batch=plan.cosine_rows, seq_len=reward_len), f"{plan.cosine_rows} x {reward_len}", reward_len)
  return units


_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}


def _group_size(line: str, default: int) -> int:
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
  if iota:
    return int(iota.group(2))
  listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
  if listed:
    return len(listed.group(1).split(","))
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
  if mesh:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", mesh.group(2)))
  return default


def collective_bytes(hlo_text: str, devices: int) -> tuple[float, dict]:
  """Bytes one device sends over the links in a compiled SPMD program (each op once, loops as
  XLA's cost analysis counts them): ring all-gather (n-1)/n x output, all-reduce 2(n-1)/n x size,
  reduce-scatter (n-1) x output, all-to-all (n-1)/n, collective-permute its output."""
  from compassplay_jax.costs import memory_report as mr  # here: jax is imported after the device flags are set
  total, counts = 0.0, {}
  for op, arrays, line in mr.hlo_collectives(hlo_text):
    size = sum(_BYTES.get(t, 4) * math.prod(dims) for t, dims in arrays)
    n = max(_group_size(line, devices), 1)
    factor = {"all-gather": (n - 1) / n, "all-reduce": 2 * (n - 1) / n, "reduce-scatter": n - 1,
              "all-to-all": (n - 1) / n, "collective-permute": 1.0}[op]
    total += factor * size
    counts[op] = counts.get(op, 0) + 1
  return total, counts


def unit_figures(unit: Unit, cfg, mesh, train_cfg, backend: str, cache: pathlib.Path, compile_ok: bool) -> dict:
  """The unit's per-device FLOPs / bytes / collective bytes: from the cache, else compiled (and cached)."""
  import jax
  from compassplay_jax.costs import memory_report as mr
  from compassplay_jax.infra import sharding as sh
  ident = {"backend": backend, "function": unit.function, "mesh": sh.mesh_summary(mesh),
           "work": dataclasses.asdict(unit.work), "model": dataclasses.asdict(cfg),
           "train": dataclasses.asdict(train_cfg), "jax": jax.__version__}
  digest = hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
  path = cache / f"{backend.replace(':', '_').replace(' ', '')}_{unit.work.model}_{unit.key}_{digest}.json"
  if path.is_file():
    row = json.loads(path.read_text())
    if unit.function == "decode" and "cache_bytes" not in row:  # written before these were recorded
      _, args = mr.lower_function(unit.function, cfg, mesh, unit.work, train_cfg)
      row.update(param_bytes=mr.per_device_bytes(args[0]), cache_bytes=mr.per_device_bytes(args[1].cache))
      _write(path, row)
    return row
  if not compile_ok:
    sys.exit(f"step_time: no cached figures for {unit.key} ({unit.shapes}) at {path}; run without --no-compile")
  print(f"# compiling {unit.work.model} {unit.key} ({unit.shapes}) on {sh.mesh_summary(mesh)} ...", file=sys.stderr,
        flush=True)
  start = time.time()
  lowered, args = mr.lower_function(unit.function, cfg, mesh, unit.work, train_cfg)
  compiled = lowered.compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  link, ops = collective_bytes(compiled.as_text(), mesh.size)
  row = {**ident, "key": unit.key, "shapes": unit.shapes, "flops": float(cost["flops"]),
         "bytes": float(cost["bytes accessed"]), "link_bytes": link, "collectives": ops,
         "compile_s": round(time.time() - start, 1)}
  if unit.function in ("prefill", "decode"):
    row["param_bytes"] = mr.per_device_bytes(args[0])  # the weights one device holds
  if unit.function == "decode":
    row["cache_bytes"] = mr.per_device_bytes(args[1].cache)  # the KV cache one device holds
  _write(path, row)
  print(f"#   {row['compile_s']} s: {row['flops']:.3e} FLOPs, {row['bytes']:.3e} bytes, "
        f"{link:.3e} link bytes per device", file=sys.stderr, flush=True)
  return row


def _write(path: pathlib.Path, row: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(row, indent=1, default=str))
  tmp.replace(path)


# ---- the schedule ----------------------------------------------------------------------------------

def decode_schedule(plan, mean: float, sigma: float, cap: int, rows: int, slot_counts, trials: int, seed: int,
                    prompt: int):
  """Per generate call, averaged over `trials` length draws: mean tokens per row, decode steps of the
  static schedule ("static") and of continuous batching with each slot count (its number), and the
  cache entries attention over the filled cache would read ("kv_tokens")."""
  import numpy as np
  from compassplay_jax.costs import step_time_model as stm
  rng = np.random.default_rng(seed)
  out = []
  for call in plan.generate:
    tokens, kv, steps = [], [], {"static": [], **{s: [] for s in slot_counts}}
    for _ in range(trials):
      lengths = stm.lognormal_lengths(call.rows, mean, sigma, cap, rng)
      tokens.append(lengths.mean())
      kv.append(stm.kv_token_reads(lengths, prompt))
      steps["static"].append(stm.static_decode_steps(lengths, rows))
      for s in slot_counts:
        steps[s].append(stm.continuous_decode_steps(lengths, s))
    out.append({"call": call, "mean_tokens": float(np.mean(tokens)), "kv_tokens": float(np.mean(kv)),
                **{k: float(np.mean(v)) for k, v in steps.items()}})
  return out


def packed_update_share(plan, config, divisor: int, train_len: int, prompt_bucket: int, mean: float, sigma: float,
                        cap: int, trials: int, seed: int) -> float | None:
  """Tokens of the packed update (train.micro_batch_tokens > 0; step_time_model.packed_update_tokens)
  over those of its padded micro-batches (plan.train_micro_batches of plan.train_rows x train_len),
  averaged over `trials` draws of the rows' completion lengths (prompts at the bucket); None when the
  config pads every row to one shape. Not capped at 1: a packing worse than padding shows as such."""
  import numpy as np
  from compassplay_jax.runtime import config_base
  from compassplay_jax.costs import step_time_model as stm
  budget = config.train.micro_batch_tokens
  if budget <= 0 or not plan.update_chunks:
    return None
  rng = np.random.default_rng(seed + 1)
  padded = plan.train_micro_batches * plan.train_rows * train_len
  shares = []
  for _ in range(trials):
    chunks = [[(prompt_bucket, int(c)) for c in stm.lognormal_lengths(n, mean, sigma, cap, rng)]
              for n in plan.update_chunks]
    shares.append(stm.packed_update_tokens(chunks, budget, config_base.train_sequence_len(config), divisor) / padded)
  return float(np.mean(shares))


# ---- tables -------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Row:
  phase: str
  name: str
  shapes: str
  calls: float
  figures: dict | None
  seconds: dict      # hardware -> seconds per step
  bounds: dict       # hardware -> what decides them
  schedule: str = ""  # decode rows: the schedule they belong to (one counts per total)


def _fmt_s(x: float) -> str:
  return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def _fmt_n(x: float) -> str:
  return f"{x:,.0f}" if float(x).is_integer() or x >= 100 else f"{x:.1f}"


def decode_figures(f: dict, weight_scale: float = 1.0) -> dict:
  """A decode step's per-device figures with HBM bytes = the weights and the KV cache the device holds,
  each read once (the step's floor). XLA's own count treats the in-place cache update as a read and a
  write of the whole cache and counts attention's passes over it separately (tiny model: 12.6 x the
  cache's bytes per step), which no accelerator's in-place update does. weight_scale: e.g. 0.5 for a
  bf16 copy of fp32 weights."""
  return {**f, "bytes": f["param_bytes"] * weight_scale + f["cache_bytes"], "xla_bytes": f["bytes"]}


def setting_rows(plan, units, figures, sched, checks, hardware, eff, rows, schedules,
                 attention_flops_per_entry: float, continuous_weight_scale: float = 1.0,
                 update_share: float | None = None) -> list[Row]:
  """The per-phase rows of one setting (decode: one row per schedule, alternatives).
  attention_flops_per_entry: per device, a decode step's attention FLOPs per cache entry it reads.
  update_share: the packed update's tokens over those of its padded micro-batches (packed_update_share;
  None: rows padded); its train and log-prob passes count as that share of the padded ones."""
  from compassplay_jax.costs import step_time_model as stm
  out = []

  def device_row(phase, name, f, calls, shapes, schedule=""):
    secs = {h: calls * stm.seconds(f["flops"], f["bytes"], f["link_bytes"], hw, eff) for h, hw in hardware.items()}
    bounds = {h: stm.bound(f["flops"], f["bytes"], f["link_bytes"], hw, eff) for h, hw in hardware.items()}
    out.append(Row(phase, name, shapes, calls, f, secs, bounds, schedule))

  device_row("generate", "prefill", figures["prefill"], sum(c.prompts for c in plan.generate) / rows,
             units["prefill"].shapes)
  for schedule, label, key, filled in schedules:
    steps = sum(s[schedule] for s in sched)
    # The continuous engine decodes from a compute-dtype copy cast once per update (update_params):
    # with fp32 master weights and bf16 compute it reads half the weight bytes the static sampler does.
    scale = 1.0 if schedule == "static" else continuous_weight_scale
    f = decode_figures(figures[key], scale)
    if filled:  # attention over the filled cache only: the step's mean cache traffic and attention FLOPs
      work = units[key].work
      entries = work.sampler_rows * (work.sampler_prompt_len + work.sampler_new_tokens)  # the compiled step's
      read = sum(s["kv_tokens"] for s in sched) / steps  # entries read per step, on average
      f = {**f, "bytes": f["param_bytes"] * scale + f["cache_bytes"] * read / entries,
           "flops": f["flops"] - attention_flops_per_entry * (entries - read)}
    device_row("generate", f"decode step, {label}", f, steps, units[key].shapes, schedule)
  for batch, secs in checks:
    out.append(Row("verify", f"{batch.label}: {batch.jobs:,} jobs, {batch.workers} workers", "host CPU", batch.groups,
                   None, {h: secs for h in hardware}, {h: "host" for h in hardware}))
  if plan.g_ref_passes:
    device_row("reward", "g_ref micro-batch (fwd+bwd)", figures["g_ref"], plan.g_ref_passes, units["g_ref"].shapes)
  if plan.cosine_passes:
    device_row("reward", "fused cosines micro-batch", figures["cosines"], plan.cosine_passes, units["cosines"].shapes)
  share = 1.0 if update_share is None else update_share
  if plan.logprob_passes:  # a forward pass: a quarter of the remat train micro-batch (forward, recompute, 2x backward)
    quarter = {k: figures["train"][k] / 4 for k in ("flops", "bytes", "link_bytes")}
    device_row("update", "old log-probs, forward (1/4 of a train micro-batch)", quarter,
               plan.logprob_passes * share, units["train"].shapes)
  packed = "" if update_share is None else f"; rows packed by length: {share:.2f} of the padded tokens"
  device_row("update", f"train micro-batch ({plan.optimizer_steps} optimizer step"
             f"{'s' if plan.optimizer_steps != 1 else ''}{packed})", figures["train"],
             plan.train_micro_batches * share, units["train"].shapes)
  return out


def totals(rows_out: list[Row], hardware, schedules) -> dict:
  """{hardware: {"phases": {phase: s without decode}, schedule: total s, "decode": {schedule: s}}}."""
  out = {}
  for h in hardware:
    phases = {}
    for r in rows_out:
      if not r.schedule:
        phases[r.phase] = phases.get(r.phase, 0.0) + r.seconds[h]
    decode = {r.schedule: r.seconds[h] for r in rows_out if r.schedule}
    out[h] = {"phases": phases, "decode": decode, **{s: sum(phases.values()) + decode[s] for s, *_ in schedules}}
  return out


def print_setting(name, spec, plan, sched, rows_out, hardware, backend, notes, schedules):
  print(f"\n## {name}: {spec}\n")
  for n in notes + list(plan.notes):
    print(f"* {n}")
  print("\nGenerate calls (rows = prompts x samples; decode steps averaged over the length draws):\n")
  print("| call | prompts | samples | rows | mean tokens | " +
        " | ".join(f"decode steps, {label}" for _, label, *_ in schedules) + " |")
  print("|---|---|---|---|---|" + "---|" * len(schedules))
  for s in sched:
    c = s["call"]
    print(f"| {c.label} | {c.prompts} | {c.samples} | {c.rows} | {s['mean_tokens']:.0f} | "
          + " | ".join(f"{s[k]:,.0f}" for k, *_ in schedules) + " |")
  names = [hw.name for hw in hardware.values()]
  print(f"\nPer phase (figures per device and call from {backend} cost analysis; seconds per step on 8 x "
        + " / 8 x ".join(names) + "; decode rows are alternatives):\n")
  print("| phase | function | unit shape | calls | GFLOP/call | GB HBM/call | GB link/call | "
        + " | ".join(f"s, {n}" for n in names) + " |")
  print("|---|---|---|---|---|---|---|" + "---|" * len(names))
  for r in rows_out:
    f = r.figures
    cells = ["-", "-", "-"] if f is None else [f"{f['flops'] / 1e9:,.1f}", f"{f['bytes'] / 1e9:.2f}",
                                                f"{f['link_bytes'] / 1e9:.3f}"]
    times = [f"{_fmt_s(r.seconds[h])} ({r.bounds[h]})" for h in hardware]
    print(f"| {r.phase} | {r.name} | {r.shapes} | {_fmt_n(r.calls)} | " + " | ".join(cells + times) + " |")


def print_totals(tot, hardware, schedules, budget):
  print("\nTotals, minutes per step (generate includes the decode of the schedule named):\n")
  print("| hardware | schedule | generate | verify | reward | update | total | vs paper budget |")
  print("|---|---|---|---|---|---|---|---|")
  for h, hw in hardware.items():
    t = tot[h]
    for key, label, *_ in schedules:
      ph = t["phases"]
      ratio = f"{t[key] / budget:.1f}x of {budget / 60:.1f} min" if budget else "-"
      print(f"| 8 x {hw.name} | {label} | {(ph.get('generate', 0.0) + t['decode'][key]) / 60:.1f} | "
            f"{ph.get('verify', 0.0) / 60:.1f} | {ph.get('reward', 0.0) / 60:.1f} | {ph.get('update', 0.0) / 60:.1f} | "
            f"{t[key] / 60:.1f} | {ratio} |")


def obstacles(plan, units, rows_out, tot, hardware, eff, config, checks, check_model, prompt_bucket, mean, budget,
              schedules):
  """What stands between the estimate and the budget: each lever with the minutes it saves per step,
  applied in order from the static schedule, and what is left after all of them."""
  lines = []
  (static, *_), (cont, cont_label, *_), (wide, wide_label, *_) = schedules
  for h, hw in hardware.items():
    t = tot[h]
    left = {"decode": t["decode"][static], "prefill": t["phases"].get("generate", 0.0),
            "verify": t["phases"].get("verify", 0.0), "reward": t["phases"].get("reward", 0.0),
            "update": t["phases"].get("update", 0.0)}
    items = []

    def lever(text, part, saved):
      items.append((text, saved))
      left[part] -= saved

    lever(f"static schedule (each micro-batch waits for its longest row) -> {cont_label}", "decode",
          t["decode"][static] - t["decode"][cont])
    lever(f"{cont_label} -> {wide_label}", "decode", t["decode"][cont] - t["decode"][wide])
    train_len = units["train"].length
    real = min(train_len, prompt_bucket + mean)
    if not config.train.micro_batch_tokens:  # else the update rows above are packed already
      lever(f"update rows padded to the batch's longest row ({train_len} tokens, mean row ~{real:.0f}): rows packed "
            "by length (train.micro_batch_tokens), FLOPs taken as proportional to length",
            "update", left["update"] * (1 - real / train_len))
    if plan.setting == "lean":
      pooled = sum(secs for _, secs in checks)
      many = dataclasses.replace(plan.checks[0], groups=1, jobs_per_group=plan.checks[0].jobs, workers=4224)
      lever(f"lean.num_workers {plan.checks[0].workers} -> 4224 checking CPUs (SGS: 128 jobs x 33 threads)", "verify",
            pooled - check_model(many))
      lever(f"reward: a g_ref and a cosine call per seed, each 1 row padded to {plan.g_ref_rows} -> seeds batched",
            "reward", left["reward"] * (1 - 1 / plan.g_ref_rows))
    best = sum(left.values())
    head = f"**8 x {hw.name}**: {t[static] / 60:.1f} min per step with the static schedule"
    if budget:
      head += f", {t[static] / budget:.1f}x the paper's {budget / 60:.1f} min"
    lines.append(head + f"; {best / 60:.1f} min after every lever below"
                 + (f" ({best / budget:.1f}x)" if budget else "") + ":")
    for text, secs in items:
      lines.append(f"  - {text}: -{secs / 60:.1f} min")
    lines.append("  - left: " + ", ".join(f"{part} {secs / 60:.1f}" for part, secs in left.items()) + " min")
  return lines


def main(argv=None):
  args = parse_args(argv)
  if args.program:
    return main_program(args)
  settings = args.setting or sorted(SETTINGS)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={args.devices}").strip()
  from compassplay_jax.costs import memory_report as mr
  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.costs import step_time_model as stm
  from compassplay_jax.runtime.engine import EngineSettings
  from compassplay_jax.cli.sweep import load_config

  devices = None
  if args.topology:
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(topology_name=args.topology, platform="tpu").devices
  backend = args.topology or f"cpu x{args.devices}"
  hardware = {"v5p": stm.HARDWARE["v5p"], "h100": stm.HARDWARE["h100"]}
  eff = stm.Efficiency(args.flops_eff, args.hbm_eff, args.link_eff)
  cache = pathlib.Path(args.cache)
  print(f"# Step time of the paper configs ({backend} cost analysis)\n")
  print("Hardware: " + "; ".join(f"{hw.name}: {hw.source}" for hw in hardware.values()) + ".")
  print(f"Efficiency: {eff.flops:.0%} of peak FLOP/s, {eff.hbm:.0%} of HBM bandwidth, {eff.link:.0%} of link "
        "bandwidth; a call takes the slowest of the three.")
  for name in settings:
    spec = args.coding_config if name == "coding" else args.lean_config
    if args.tiny and ":" not in spec:
      spec += ":tiny"
    config = load_config(spec if pathlib.Path(spec.split(":")[0]).is_absolute() else str(REPO / spec))
    if args.tiny:  # short reward sequences: the tiny run compiles in seconds
      config.reward.max_completion_tokens = 16
    work0 = mr.PAPER_WORKLOADS[SETTINGS[name][1]]
    model_cfg = mr.PAPER_MODELS[work0.model]
    if args.tiny:
      model_cfg, work0 = mr.tiny_workload()
    # The run's model knobs, as loop-free programs (module docstring).
    cfg = model_cfg.replace(dtype=config.model.dtype, param_dtype=config.model.param_dtype, remat=config.model.remat,
                            scan_layers=False, attention_query_chunk=0)
    mesh = sh.make_mesh(config.mesh, devices=devices)
    divisor = sh.batch_divisor(mesh)
    rows = sh.round_to_mesh(config.sampling.micro_batch_size, mesh)
    slots = args.slots or config.sampling.micro_batch_size
    wide = sh.round_to_mesh((args.coding_wide_slots if name == "coding" else args.lean_wide_slots), mesh)
    notes = [f"mesh {sh.mesh_summary(mesh)}; model {work0.model} ({config.model.dtype} compute, "
             f"{config.model.param_dtype} params); sampler micro-batch {rows} rows"]
    if name == "coding":
      plan = stm.coding_step_plan(config, divisor, valid_fraction=args.valid_fraction, host_workers=args.host_workers)
      mean, bucket = args.coding_mean_tokens, args.coding_prompt_bucket
      job_s, timeout_s = args.sandbox_job_s, config.sandbox.timeout_s
    else:
      targets, source = lean_targets(config, args.lean_targets)
      notes.append(f"targets: {targets} ({source})")
      outcomes = stm.LeanOutcomes(targets=targets, solved_fraction=args.lean_solved_fraction,
                                  valid_fraction=args.lean_valid_fraction,
                                  eligible_fraction=args.lean_eligible_fraction,
                                  solver_row_fraction=args.lean_solver_row_fraction)
      plan = stm.lean_iteration_plan(config, divisor, outcomes)
      mean, bucket = args.lean_mean_tokens, args.lean_prompt_bucket
      job_s, timeout_s = args.lean_proof_s, config.lean.timeout_s
    bucket = min(bucket, config.sampling.max_prompt_tokens)
    cap = config.sampling.max_new_tokens
    notes.append(f"response lengths: log-normal, mean {mean:.0f} tokens, sigma {args.sigma}, capped at {cap}; "
                 f"prompt bucket {bucket}; {args.trials} draws (seed {args.seed})")
    notes.append(f"verifier: {job_s} CPU-s per job, {args.timeout_fraction:.1%} of jobs run into the "
                 f"{timeout_s:.0f} s timeout")
    units = plan_units(plan, work0, config, bucket, rows, mean)
    units["decode_wide"] = Unit("decode_wide", "decode", dataclasses.replace(units["decode"].work, sampler_rows=wide),
                                f"{wide} rows, cache {bucket}+{cap}")
    train_cfg = EngineSettings.from_config(config).train
    figures = {k: unit_figures(u, cfg, mesh, train_cfg, backend, cache, not args.no_compile) for k, u in units.items()}
    # (key, label, decode unit, attention over the filled cache only)
    schedules = (("static", f"static, {rows}-row micro-batches", "decode", False),
                 (slots, f"continuous, {slots} slots", "decode" if slots == rows else "decode_slots", False),
                 (wide, f"continuous, {wide} slots, attention over the filled cache", "decode_wide", True))
    if slots != rows:
      units["decode_slots"] = Unit("decode_slots", "decode", dataclasses.replace(
          units["decode"].work, sampler_rows=slots), f"{slots} rows, cache {bucket}+{cap}")
      figures["decode_slots"] = unit_figures(units["decode_slots"], cfg, mesh, train_cfg, backend, cache,
                                             not args.no_compile)
    sched = decode_schedule(plan, mean, args.sigma, cap, rows, (slots, wide), args.trials, args.seed, bucket)
    check_model = lambda b: stm.check_seconds(b, job_s, args.timeout_fraction, timeout_s)  # noqa: E731
    checks = [(b, check_model(b)) for b in plan.checks]
    # q.k and p.v: 2 x 2 x heads x head_dim FLOPs per cache entry and layer, split over the mesh
    per_entry = 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers / mesh.size
    halved = config.model.param_dtype == "float32" and config.model.dtype == "bfloat16"
    share = packed_update_share(plan, config, divisor, units["train"].length, bucket, mean, args.sigma, cap,
                                args.trials, args.seed)
    if share is not None:
      notes.append(f"update: rows packed by length into micro-batches of at most train.micro_batch_tokens = "
                   f"{config.train.micro_batch_tokens} tokens (prompts at the bucket, completions drawn as above): "
                   f"{share:.2f} of the tokens of {plan.train_micro_batches} padded micro-batches of "
                   f"{units['train'].shapes}, each pass's figures taken as proportional to its tokens")
    rows_out = setting_rows(plan, units, figures, sched, checks, hardware, eff, rows, schedules, per_entry,
                            0.5 if halved else 1.0, share)
    print_setting(name, spec, plan, sched, rows_out, hardware, backend, notes, schedules)
    tot = totals(rows_out, hardware, schedules)
    budget = PAPER_BUDGET.get(name) if not args.tiny else None
    print_totals(tot, hardware, schedules, budget)
    print("\nWhat stands in the way (minutes per step each lever is worth, applied in this order):\n")
    for line in obstacles(plan, units, rows_out, tot, hardware, eff, config, checks, check_model, bucket, mean, budget,
                          schedules):
      print(line if line.startswith("  ") else f"* {line}")
    for key in ("decode", "decode_wide"):
      d = figures[key]
      print(f"\nDecode step, {units[key].shapes}, per device: {d['flops'] / 1e9:.1f} GFLOP; HBM: weights "
            f"{d['param_bytes'] / 1e9:.2f} GB + KV cache {d['cache_bytes'] / 1e9:.2f} GB read once (XLA counts "
            f"{d['bytes'] / 1e9:.2f} GB); {d['link_bytes'] / 1e9:.3f} GB over the links.")


# ---- the program that runs (--program) -------------------------------------------------------------

GIB = 2 ** 30
# Per benchmark of configs/coding.py's eval.benchmarks: (items, mean prompt chars, longest prompt chars)
# of harness prompts (evals/prompts.build_prompt, the config's prompt_style), measured 2026-12-04 on
# /work/shared/data; LCB-Execution's file is not there: its 479 items (posed as AZR poses them, input
# prediction) are priced with CRUXEval-I's prompts.
EVAL_PROMPTS = {"cruxeval_i": (800, 1142, 1277), "cruxeval_o": (800, 1110, 1240),
                "livecodebench_execution": (479, 1142, 1277), "math500": (500, 613, 2150),
                "amc23": (40, 686, 1105), "gsm8k": (1319, 657, 1265), "minerva_math": (272, 838, 1415),
                "olympiadbench": (675, 730, 4832)}
EVAL_KINDS = {"cruxeval_i": "cruxeval_i", "cruxeval_o": "cruxeval_o", "livecodebench_execution": "cruxeval_i"}


@dataclasses.dataclass(frozen=True)
class Topology:
  key: str
  label: str
  hosts: int
  limit_bytes: float   # the allocator's limit per device (what device_memory_budget reads)
  limit_source: str
  fixed: object        # step_time_model.FixedCosts


def program_topologies(args):
  from compassplay_jax.costs import step_time_model as stm
  return (
      Topology("h100", "8 x H100 SXM (1 host)", 1, 80 * GIB * args.h100_mem_fraction,
               f"80 GiB x {args.h100_mem_fraction} (JAX's GPU allocator preallocates XLA_PYTHON_CLIENT_MEM_FRACTION "
               "of memory, default 0.75; bytes_limit is that pool)",
               stm.FixedCosts(args.h100_collective_us * 1e-6, args.h100_launch_ms * 1e-3, args.chunk_sync_ms * 1e-3,
                              args.call_ms * 1e-3)),
      Topology("v5p", "v5p-8 (2 hosts x 4 chips)", 2, 95.74 * GIB,
               "95.74 GiB per chip (the memory tables above)",
               stm.FixedCosts(args.v5p_collective_us * 1e-6, args.v5p_launch_ms * 1e-3, args.chunk_sync_ms * 1e-3,
                              args.call_ms * 1e-3)))


def _host_shares(n: int, hosts: int) -> list[tuple[int, int]]:
  """distributed.Shares: contiguous blocks of ceil(n / hosts)."""
  size = -(-n // hosts)
  return [(min(h * size, n), min((h + 1) * size, n)) for h in range(hosts)]


def simulate_call(cfg, topo, mesh, budget, lengths, buckets, samples, max_new, chunk, round_to: int = 0,
                  page_size: int = 0):
  """One generate call on one host's engine: cache length (paged: the longest row's need), slots, and
  the simulated run. round_to: the dense cache length as the longest (bucket + budget) rounded up to
  this many columns instead of the engine's next power of two (a what-if). page_size > 0: the paged
  engine (ContinuousEngine.paged_layout's slots and pool from the budget, stm.paged_run)."""
  from compassplay_jax.costs import step_time_model as stm
  need = max(b + m for b, m in zip(buckets, max_new))
  if page_size:
    d = mesh.batch_divisor
    slots, per_shard = stm.paged_engine_layout(cfg, budget, page_size, max(buckets), max(max_new), tensor=mesh.tensor,
                                               batch_divisor=d, rows=len(lengths))
    run = stm.paged_run(lengths, buckets, slots, pages_per_shard=per_shard, page_size=page_size, chunk=chunk,
                        batch_divisor=d, samples=samples)
    return need, slots, run
  length = -(-need // round_to) * round_to if round_to else stm.pow2_at_least(need)
  most = stm.engine_slots(cfg, length, budget, max(buckets), tensor=mesh.tensor, batch_divisor=mesh.batch_divisor)
  slots = stm.call_slots(most, len(lengths), mesh.batch_divisor)
  run = stm.continuous_run(lengths, buckets, slots, cache_length=length, chunk=chunk,
                           batch_divisor=mesh.batch_divisor, samples=samples)
  return length, slots, run


def program_setting(args, config, cfg, topo, hw, eff, plan, rng_seed: int) -> dict:
  """Seconds per part of one coding step, one evaluation, and the run's amortized costs, on `topo`."""
  import numpy as np
  from compassplay_jax.runtime import config_base
  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.costs import step_time_model as stm
  from compassplay_jax.evals import harness
  from compassplay_jax.sampling import batching
  from compassplay_jax.selfplay.sequences import length_groups
  devices = 8
  m = sh.MeshConfig.from_any(config.mesh)
  tensor = m.tensor
  batch = devices // tensor
  mesh = stm.sampler_mesh(devices, batch, tensor, topo.hosts)
  n_params = stm.param_count(cfg)
  free = stm.free_device_bytes(topo.limit_bytes, n_params, devices)
  budget = 0.5 * free if not config.sampling.memory_budget_gb else config.sampling.memory_budget_gb * GIB
  chunk = config.sampling.chunk_tokens
  cap = config.sampling.max_new_tokens
  out = {"mesh": mesh, "free": free, "budget": budget, "calls": [], "eval": []}
  rng = np.random.default_rng(rng_seed)
  runs = []  # (cache length, run) for the compile count

  def priced(run):
    return stm.run_seconds(run, cfg, mesh, hw, eff, topo.fixed, paged_kv_read_factor=args.paged_read_factor)

  layout = args.kv_layout if args.kv_layout != "config" else config.sampling.get("kv_layout", "auto")
  page_size = args.page_size if layout in ("paged", "auto") else 0
  out["layout"] = "paged" if page_size else "dense"

  def filled_share(run):  # what attention over the filled columns reads, over what the layout reads
    return 1.0 if run.paged_steps else run.filled_entries / max(run.slot_window_entries, 1)

  # Rollouts: each generate call of the step, each host its contiguous share of the prompts; the
  # hosts meet when the call's rows are gathered, so a call takes its slowest host's time.
  parts = {"decode": 0.0, "decode_fixed": 0.0, "sync": 0.0, "prefill": 0.0, "filled_decode": 0.0}
  for call in plan.generate:
    bucket = args.proposal_bucket if call.label.startswith("proposals") else args.solver_bucket
    worst = None
    for start, end in _host_shares(call.prompts, topo.hosts):
      rows = (end - start) * call.samples
      if not rows:
        continue
      secs = []
      for _ in range(args.program_trials):
        lengths = stm.lognormal_lengths(rows, args.coding_mean_tokens, args.sigma, cap, rng)
        length, slots, run = simulate_call(cfg, topo, mesh, budget, lengths, [bucket] * rows, call.samples,
                                           [cap] * rows, chunk, page_size=page_size)
        runs.append((length, run))
        secs.append((priced(run), run, slots, length))
      mean = {k: float(np.mean([s[0][k] for s in secs])) for k in parts}
      if worst is None or sum(mean[k] for k in parts if k != "filled_decode") > \
          sum(worst[0][k] for k in parts if k != "filled_decode"):
        worst = (mean, secs[0][1], secs[0][2], secs[0][3], rows)
    mean, run, slots, length, rows = worst
    for k in parts:
      parts[k] += mean[k]
    out["calls"].append({"label": call.label, "rows": rows, "slots": slots, "cache": length, "bucket": bucket,
                         "steps": run.steps, "chunks": run.chunks, "windows": sorted({w for _, w in run.shape_steps}),
                         "preempted": run.preempted, "filled_share": filled_share(run), **mean})
  out["rollout"] = parts

  # Verification on the host (as the XLA tables: after decoding, an upper bound).
  workers = config.sandbox.num_workers or args.host_workers
  out["verify"] = sum(stm.check_seconds(b, args.sandbox_job_s, args.timeout_fraction, config.sandbox.timeout_s)
                      for b in plan.checks)

  # Reward and update: compute-bound with fused attention (no score temporaries in HBM; causal half).
  peak = hw.peak_flops * eff.flops * devices
  r = config.reward
  completion = min(r.max_completion_tokens or cap, 1 << int(math.ceil(math.log2(args.coding_mean_tokens))))
  reward_len = min(config_base.reward_sequence_len(config), args.proposal_bucket + completion)
  out["reward"] = (plan.g_ref_passes * 4 * stm.forward_flops(cfg, plan.g_ref_rows, reward_len)
                   + plan.cosine_passes * 4 * stm.forward_flops(cfg, plan.cosine_rows, reward_len)) / peak
  out["reward_shape"] = f"{plan.g_ref_passes} + {plan.cosine_passes} passes of {plan.g_ref_rows} x {reward_len}"
  budget_tokens = config.train.micro_batch_tokens
  proposals = sum(c.prompts for c in plan.generate if c.label.startswith("proposals") and "input" not in c.label)
  rollouts = plan.generate[-1].rows
  flops, shapes = [], set()
  for _ in range(args.program_trials):
    total = 0.0
    for chunk_rows in plan.update_chunks:
      prompts = [args.proposal_bucket] * proposals + [args.solver_bucket] * rollouts
      prompts = (prompts * (1 + chunk_rows // max(len(prompts), 1)))[:chunk_rows]
      lengths = [(p, int(c)) for p, c in zip(prompts, stm.lognormal_lengths(chunk_rows, args.coding_mean_tokens,
                                                                            args.sigma, cap, rng))]
      for _, rows, (p, c) in length_groups(lengths, budget_tokens, max_len=config_base.train_sequence_len(config)):
        rows = -(-rows // batch) * batch
        shapes.add((rows, p + c))
        total += 4 * stm.forward_flops(cfg, rows, p + c)
    flops.append(total)
  adam = 28 * n_params / devices / (hw.hbm_bytes_s * eff.hbm)  # read params, grads, m, v; write params, m, v
  out["update"] = float(np.mean(flops)) / peak + len(plan.update_chunks) * adam
  out["update_programs"] = len(shapes)

  # Evaluation: every prompt in one queue of the engine (Engine.greedy_queue), each host its share.
  names = [n.strip() for n in config.eval.benchmarks.split(",") if n.strip()]
  items = {n: [types.SimpleNamespace(kind=EVAL_KINDS.get(n, "math"))] * EVAL_PROMPTS[n][0] for n in names}
  budgets = harness.budgets_for(items, config.eval)
  prompt_tokens = []
  for n in names:
    count, mean_chars, max_chars = EVAL_PROMPTS[n]
    prompt_tokens += [int(max_chars / args.chars_per_token)] + [int(mean_chars / args.chars_per_token)] * (count - 1)
  ladder = batching.prompt_buckets(max(prompt_tokens))
  buckets = [batching.bucket_length(t, ladder) for t in prompt_tokens]
  kinds = [("math" if EVAL_KINDS.get(n, "math") == "math" else "code") for n in names for _ in range(EVAL_PROMPTS[n][0])]
  out["eval_prompts"] = len(budgets)

  def evaluation(code_mean, math_mean, runaway, trials, round_to=0):
    worst = None
    for start, end in _host_shares(len(budgets), topo.hosts):
      res = []
      for _ in range(trials):
        lengths = np.concatenate([
            stm.greedy_lengths(1, code_mean if kinds[i] == "code" else math_mean, args.sigma, budgets[i], runaway, rng)
            for i in range(start, end)])
        length, slots, run = simulate_call(cfg, topo, mesh, budget, lengths, buckets[start:end], 1,
                                           budgets[start:end], chunk, round_to, page_size=page_size)
        res.append((priced(run), run, slots, length))
      mean = {k: float(np.mean([s[0][k] for s in res])) for k in res[0][0]}
      total = sum(v for k, v in mean.items() if k != "filled_decode")
      if worst is None or total > worst[0]:
        worst = (total, mean, res[0][1], res[0][2], res[0][3], end - start)
    return worst

  total, mean, run, slots, length, rows = evaluation(args.eval_code_mean, args.eval_math_mean, args.eval_runaway,
                                                     args.program_trials)
  runs.append((length, run))
  code_items = sum(1 for k in kinds if k == "code")
  checks = (code_items * args.sandbox_job_s + (len(kinds) - code_items) * args.math_check_s) / workers / topo.hosts
  out["eval"] = {"rows": rows, "slots": slots, "cache": length, "steps": run.steps, "chunks": run.chunks,
                 "windows": sorted({w for _, w in run.shape_steps}), "parts": mean, "checks": checks,
                 "total": total + checks, "filled_share": filled_share(run), "preempted": run.preempted}
  t, _, _, exact_slots, exact_length, _ = evaluation(args.eval_code_mean, args.eval_math_mean, args.eval_runaway,
                                                     args.program_trials, round_to=1024)
  out["eval_exact"] = {"total": t + checks, "slots": exact_slots, "cache": exact_length}
  if args.eval_sensitivity:
    out["eval_sensitivity"] = {}
    for scale in (0.5, 1.0, 2.0):
      for runaway in (0.0, args.eval_runaway, 0.1):
        t, *_ = evaluation(args.eval_code_mean * scale, args.eval_math_mean * scale, runaway, 1)
        out["eval_sensitivity"][(scale, runaway)] = t + checks
  evals = stm.evaluation_steps(config.steps, config.eval.every_steps, config.eval.get("dense_every_steps", 0),
                               config.eval.get("dense_from_step", 0), config.eval.get("at_start", False))
  out["evaluations"] = len(evals)

  # The run's amortized costs: compiles (once per run) and checkpoints (every every_steps).
  programs = stm.rollout_programs(runs)
  out["programs"] = programs
  out["compile"] = (sum(programs.values()) * args.compile_s
                    + (out["update_programs"] + 2) * args.compile_train_s) / config.steps
  ck = config.checkpoint
  out["checkpoint"] = stm.checkpoint_seconds(12 * n_params, ck.every_steps, async_save=bool(ck.async_save),
                                             write_bytes_s=args.write_gb_s * 1e9,
                                             host_copy_bytes_s=args.host_copy_gb_s * 1e9, hosts=topo.hosts)
  out["host_other"] = args.host_other_s
  step = (sum(v for k, v in parts.items() if k != "filled_decode") + out["verify"] + out["reward"] + out["update"]
          + out["compile"] + out["checkpoint"] + out["host_other"])
  out["step"] = step
  out["eval_per_step"] = out["eval"]["total"] * out["evaluations"] / config.steps
  out["step_with_eval"] = step + out["eval_per_step"]
  out["steps"] = config.steps
  return out


def print_program(args, config, cfg, plan, results, topos, eff):
  """The table of the program that runs (docs/sharding.md, "Step time of the program that runs")."""
  from compassplay_jax.costs import step_time_model as stm
  budget = PAPER_BUDGET["coding"]
  mins = lambda s: f"{s / 60:.2f}"  # noqa: E731
  secs = lambda s: f"{s:,.1f}"  # noqa: E731
  n = stm.param_count(cfg)
  layout = results[topos[0].key]["layout"]
  print(f"# Step time of the program that runs: {args.coding_config}, {n / 1e9:.2f}B params, "
        + (f"paged KV cache (pages of {args.page_size})" if layout == "paged" else "dense KV cache") + "\n")
  print(f"Efficiency: {eff.flops:.0%} of peak FLOP/s, {eff.hbm:.0%} of HBM bandwidth, {eff.link:.0%} of link bandwidth; "
        "a call takes the slowest of the three, plus the fixed costs below.")
  print(f"Rollout lengths: log-normal, mean {args.coding_mean_tokens:.0f} tokens, sigma {args.sigma}, capped at "
        f"{config.sampling.max_new_tokens}; prompt buckets {args.proposal_bucket} (proposals) / {args.solver_bucket} "
        f"(solve-rate samples, solver rollouts); {args.program_trials} draws (seed {args.seed}).")
  print(f"Evaluation: {results[topos[0].key]['eval_prompts']:,} greedy prompts in one queue, budgets from eval.budgets "
        f"('{config.eval.budgets}', else {config.eval.max_new_tokens}); greedy lengths log-normal (sigma {args.sigma}) "
        f"of mean {args.eval_code_mean:.0f} (code) / {args.eval_math_mean:.0f} (math) tokens, "
        f"{args.eval_runaway:.0%} of rows running to the budget (assumptions, sensitivity below); prompt tokens = "
        f"chars / {args.chars_per_token}.\n")
  cols = [topo.label for topo in topos]
  print("| part | " + " | ".join(cols) + " |")
  print("|---|" + "---|" * len(cols))

  def row(name, fn):
    print(f"| {name} | " + " | ".join(fn(results[t.key], t) for t in topos) + " |")

  row("device limit / free after fp32 params + AdamW / slot budget (GB per chip)",
      lambda r, t: f"{t.limit_bytes / 1e9:.1f} / {r['free'] / 1e9:.1f} / {r['budget'] / 1e9:.1f}")
  row("sampler mesh (chips; slots over, KV heads over) and bf16 weights read per chip per decode step",
      lambda r, t: f"{r['mesh'].devices} ({r['mesh'].batch_divisor}, {r['mesh'].tensor}), "
                   f"{stm.sampler_weight_bytes(cfg, r['mesh']) / 1e9:.2f} GB")
  paged = results[topos[0].key]["layout"] == "paged"
  what = "slots, row need, decode steps, chunks, preempted rows per host" if paged else \
      "slots, cache, decode steps, chunks per host"

  def call_cell(c):
    return (f"{c['slots']} slots, {c['cache']}, {c['steps']:,} steps, {c['chunks']:,} chunks"
            + (f", {c['preempted']} preempted" if paged else ""))
  for i, call in enumerate(plan.generate):
    row(f"rollout: {call.label} ({call.rows} rows; {what})", lambda r, t, i=i: call_cell(r["calls"][i]))
  row("rollout decode, s (HBM/compute: " + ("each step reads its rows' held pages)" if paged else
                                             "over the windows used)"), lambda r, t: secs(r["rollout"]["decode"]))
  row("rollout decode fixed per step (2 tensor all-reduces x layers + launches), s",
      lambda r, t: secs(r["rollout"]["decode_fixed"]))
  row("rollout host syncs (one per chunk), s", lambda r, t: secs(r["rollout"]["sync"]))
  row("rollout prefill + insert + compact calls, s", lambda r, t: secs(r["rollout"]["prefill"]))
  row("verify (host: proposals one by one, then the pool; after decoding), s", lambda r, t: secs(r["verify"]))
  row(f"reward: g_ref + cosines ({results[topos[0].key]['reward_shape']}; fused attention), s",
      lambda r, t: secs(r["reward"]))
  row("update: packed passes (fused attention, compute-bound) + AdamW, s", lambda r, t: secs(r["update"]))
  row(f"checkpoint (every {config.checkpoint.every_steps}; async={bool(config.checkpoint.async_save)}: the "
      "device->host copy blocks), s per step", lambda r, t: secs(r["checkpoint"]))
  row("compiles per run / 200 steps (rollout: decode, prefill, insert, compact; update + reward), s per step",
      lambda r, t: f"{secs(r['compile'])} ({sum(r['programs'].values())} + {r['update_programs'] + 2} programs)")
  row("other host work (tokenize, pack, gather, metrics; assumed), s", lambda r, t: secs(r["host_other"]))
  row("**step without evaluation, min**", lambda r, t: f"**{mins(r['step'])}**")
  row(f"evaluation, one (per host: prompts, {what})",
      lambda r, t: f"{r['eval']['rows']:,} prompts, " + call_cell(r["eval"]))
  row("evaluation, one: decode / fixed / syncs / prefill / checks, min",
      lambda r, t: " / ".join(mins(r["eval"]["parts"][k]) for k in ("decode", "decode_fixed", "sync", "prefill"))
      + f" / {mins(r['eval']['checks'])}")
  row("evaluation, one, min", lambda r, t: mins(r["eval"]["total"]))
  row(f"evaluation per step ({results[topos[0].key]['evaluations']} evaluations / {config.steps} steps), min",
      lambda r, t: mins(r["eval_per_step"]))
  row("**step with evaluation, min**", lambda r, t: f"**{mins(r['step_with_eval'])}**")
  row(f"vs the paper's {budget / 60:.1f} min (without / with evaluation)",
      lambda r, t: f"{r['step'] / budget:.2f}x / {r['step_with_eval'] / budget:.2f}x")

  print("\nFixed costs and assumptions per topology:\n")
  for t in topos:
    f = t.fixed
    print(f"* {t.label}: device limit {t.limit_source}; tensor all-reduce latency {f.collective_latency_s * 1e6:.0f} us, "
          f"launch overhead {f.step_launch_s * 1e3:.2f} ms per decode step, host sync {f.chunk_sync_s * 1e3:.1f} ms per "
          f"chunk, {f.call_s * 1e3:.1f} ms per prefill/insert/compact call.")
  if any("eval_sensitivity" in results[t.key] for t in topos):
    print("\nOne evaluation's minutes against the greedy-length assumptions (one draw each; "
          "columns: mean lengths scaled, rows: fraction running to the budget):\n")
    for t in topos:
      sens = results[t.key].get("eval_sensitivity")
      if not sens:
        continue
      scales = sorted({s for s, _ in sens})
      print(f"| {t.label}: runaway | " + " | ".join(
          f"means x{s} ({args.eval_code_mean * s:.0f} / {args.eval_math_mean * s:.0f})" for s in scales) + " |")
      print("|---|" + "---|" * len(scales))
      for run in sorted({r for _, r in sens}):
        print(f"| {run:.0%} | " + " | ".join(f"{sens[(s, run)] / 60:.1f}" for s in scales) + " |")
      print()
  print("\nWhat stands in the way (minutes per step):\n")
  for line in program_blockers(results, topos, budget):
    print(line)


def program_blockers(results, topos, budget) -> list[str]:
  lines = []
  for t in topos:
    r = results[t.key]
    ro = r["rollout"]
    over = r["step_with_eval"] - budget
    head = (f"* **{t.label}**: {r['step_with_eval'] / 60:.2f} min with evaluation, {r['step'] / 60:.2f} without; "
            + (f"over the {budget / 60:.1f} min by {over / 60:.2f} min" if over > 0 else
               f"under the {budget / 60:.1f} min by {-over / 60:.2f} min"))
    lines.append(head + (":" if over > 0 else ""))
    if over <= 0:
      continue
    window = ro["decode"] - ro["filled_decode"]  # 0 for the paged layout: it reads held pages only
    parts = [
        (r["eval_per_step"], f"evaluation: {r['evaluations']} evaluations of {r['eval']['total'] / 60:.1f} min "
                             "each, spread over the run"),
        (window, "rollout attention over power-of-two windows sized by the longest live row instead of each "
                 f"row's filled columns (a paged or ragged kernel; windows read {1 / max(min(c['filled_share'] for c in r['calls']), 1e-9):.1f}x"
                 " the filled cache in the worst call)"),
        (ro["filled_decode"], "rollout decode at the filled-cache floor (weights + filled KV per step)"
                              + (": the paged engine's decode" if r["layout"] == "paged" else "")),
        (ro["decode_fixed"] + ro["sync"] + ro["prefill"], "rollout fixed costs: per-step all-reduce latency and "
                                                        "launches, per-chunk host syncs, prefill/insert calls"),
        (r["verify"], "verification on the host (overlaps decoding in the loop: an upper bound)"),
        (r["update"] + r["reward"], "update and reward passes"),
        (r["compile"] + r["checkpoint"] + r["host_other"], "compiles, checkpoints, other host work"),
    ]
    if r["layout"] == "paged":  # no window part: the paged step reads held pages
      del parts[1]
    for secs, text in sorted(parts, key=lambda x: -x[0]):
      lines.append(f"  - {secs / 60:.2f} min: {text}")
    ev, per = r["eval"], r["evaluations"] / r["steps"]
    exact = r["eval_exact"]
    levers = [
        ("verification wholly hidden behind decoding (proposals validated on the pool as their rows finish)",
         r["verify"]),
    ]
    if r["layout"] == "dense":
      levers[:0] = [
          ("rollouts and evaluation attend over each row's filled columns (a paged or ragged attention kernel)",
           window + (ev["parts"]["decode"] - ev["parts"]["filled_decode"]) * per),
          (f"the evaluation queue's cache at its longest bucket + budget rounded to 1,024 columns ({exact['cache']}) "
           f"instead of the next power of two ({ev['cache']}): {ev['slots']} -> {exact['slots']} slots",
           (ev["total"] - exact["total"]) * per)]
    if "one_mesh" in r:
      levers.append(("one sampler mesh over all 8 chips instead of a bf16 copy per host (weights read per chip "
                     "halved; across processes the engine has no such mesh today)", r["step_with_eval"] - r["one_mesh"]))
    left = r["step_with_eval"] - sum(max(x, 0.0) for _, x in levers)
    lines.append("  Levers, each's minutes per step (each priced alone; they overlap a little, so their sum is approximate):")
    for text, secs in levers:
      lines.append(f"  - {text}: -{max(secs, 0.0) / 60:.2f} min")
    lines.append(f"  - after all of them: {left / 60:.2f} min, "
                 + (f"still over by {(left - budget) / 60:.2f} min" if left > budget else
                    f"under by {(budget - left) / 60:.2f} min"))
  return lines


def main_program(args):
  from compassplay_jax.costs import memory_report as mr
  from compassplay_jax.costs import step_time_model as stm
  from compassplay_jax.cli.sweep import load_config
  spec = args.coding_config
  config = load_config(spec if pathlib.Path(spec.split(":")[0]).is_absolute() else str(REPO / spec))
  cfg = mr.PAPER_MODELS[mr.PAPER_WORKLOADS["azr-coding"].model].replace(dtype=config.model.dtype,
                                                                           param_dtype=config.model.param_dtype)
  eff = stm.Efficiency(args.flops_eff, args.hbm_eff, args.link_eff)
  topos = program_topologies(args)
  results = {}
  from compassplay_jax.infra.sharding import MeshConfig
  divisor = 8 // MeshConfig.from_any(config.mesh).tensor  # data x fsdp of the 8-chip mesh
  plan = stm.coding_step_plan(config, divisor, valid_fraction=args.valid_fraction, host_workers=args.host_workers)
  for i, t in enumerate(topos):
    results[t.key] = program_setting(args, config, cfg, t, stm.HARDWARE[t.key], eff, plan, args.seed + i)
    if t.hosts > 1:  # a what-if: one sampler mesh over every chip (weights split over 8, not 4)
      quiet = argparse.Namespace(**{**vars(args), "eval_sensitivity": False})
      one = program_setting(quiet, config, cfg, dataclasses.replace(t, hosts=1), stm.HARDWARE[t.key], eff, plan,
                            args.seed + i)
      results[t.key]["one_mesh"] = one["step_with_eval"]
  print_program(args, config, cfg, plan, results, topos, eff)
  return results


def lean_targets(config, override):
  """(number of targets, where it comes from): the flag, the config's target file, or D3k's documented size."""
  if override:
    return override, "--lean-targets"
  path = config.lean.targets_path
  if path:
    from compassplay_jax.domains.coding.reference_set import resolve_path
    from compassplay_jax.domains.lean.targets import load_targets
    try:
      resolved = resolve_path(path)
      if resolved.is_file():
        return len(load_targets(resolved)), str(path)
    except Exception:  # noqa: BLE001 - an unreadable file falls back to the documented size, said below
      pass
  return 3323, f"{path or 'no target file'} not found here: D3k's 3,323 statements (docs/paper_settings.md §1.2)"


if __name__ == "__main__":
  main()
