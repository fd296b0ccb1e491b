"""Ahead-of-time memory report: per-device bytes of the train and reward steps on a given mesh.

`report` compiles the train step and one combined reward step (g_ref + cosines); `report_functions`
compiles each device function of the paper step on its own (sampler prefill and decode, g_ref,
cosines of N candidates, train step) and says whether each fits the device, else which knob to turn.

Every function compiled is the run's own: `workload_engine` builds the engine.Engine a run would
build for the workload, and each row lowers that engine's jitted function (`Engine.train_step_jit`,
`reference_gradient_jit`, `cosines_jit`, `ShardedSampler.prefill_jit` / `decode_jit`) with its
in/out shardings and donation. Nothing is allocated: parameters, optimizer state, the reference
gradient and the batch are ShapeDtypeStructs carrying their shardings, and each step is lowered and
compiled for the mesh (`jitted.lower(...).compile().memory_analysis()`). Parameter, optimizer-state and
reference-gradient bytes are exact (sum of each leaf's shard); "temp" is XLA's own figure for the
compiled program on the backend that compiled it (CPU figures approximate GPU/TPU ones: fusion and
layout choices differ).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from compassplay_jax.infra import sharding as sharding_lib
from compassplay_jax.models.config import ModelConfig

GIB = 1024 ** 3

# The paper's two 7B models (shapes only; nothing is downloaded).
PAPER_MODELS = {
    "qwen2.5-coder-7b": ModelConfig(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, attention_bias=True, rope_theta=1e6,
        max_position_embeddings=32768, tie_word_embeddings=False),
    "deepseek-prover-v2-7b": ModelConfig(
        model_type="llama", vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=65536, tie_word_embeddings=False),
}


@dataclasses.dataclass(frozen=True)
class Workload:
  """Batch shapes of one training setting. Lengths are the paper's caps (prompt + completion)."""
  model: str
  train_batch: int  # sequences per optimizer update
  train_micro_batch: int  # rows per forward/backward inside the update
  seq_len: int
  reward_candidates: int  # candidates whose gradient cosine is computed in one reward call
  reward_micro_batch: int
  reference_size: int  # sequences in the reference set (g_ref)
  # The sampler (per-function report): rows decoded together (config.sampling.micro_batch_size),
  # prompt bucket and new tokens (the KV cache holds prompt_len + max_new_tokens slots). 0 = split
  # seq_len in halves.
  sampler_rows: int = 32
  prompt_len: int = 0
  max_new_tokens: int = 0

  @property
  def sampler_prompt_len(self) -> int:
    return self.prompt_len or self.seq_len // 2

  @property
  def sampler_new_tokens(self) -> int:
    return self.max_new_tokens or self.seq_len - self.sampler_prompt_len


# AZR coding: 64 per (task, role) x 6 = 384 sequences per step, prompt 6144 + response 8096 tokens
# (docs/paper_settings.md §5.4). SGS Lean: batch 32, max length 8192 (docs/paper_settings.md §1.3).
PAPER_WORKLOADS = {
    "azr-coding": Workload("qwen2.5-coder-7b", train_batch=384, train_micro_batch=8, seq_len=6144 + 8096,
                           reward_candidates=64, reward_micro_batch=8, reference_size=32,
                           sampler_rows=32, prompt_len=6144, max_new_tokens=8096),
    "sgs-lean": Workload("deepseek-prover-v2-7b", train_batch=32, train_micro_batch=8, seq_len=8192,
                         reward_candidates=32, reward_micro_batch=8, reference_size=32,
                         sampler_rows=32, prompt_len=2048, max_new_tokens=8192),
}


def tiny_workload(model: ModelConfig | None = None) -> tuple[ModelConfig, Workload]:
  """A seconds-to-compile setting for the test suite."""
  cfg = model or ModelConfig(model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                             attention_bias=True)
  return cfg, Workload("tiny", train_batch=16, train_micro_batch=8, seq_len=32, reward_candidates=8,
                       reward_micro_batch=8, reference_size=8, sampler_rows=8, prompt_len=16, max_new_tokens=16)


# A collective of a compiled SPMD module's text: its result type (one array or a tuple) and the op.
_COLLECTIVE = re.compile(r"=\s*(\([^=]*\)|\w+\[[^\]]*\])\S*\s+(all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute)\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


def hlo_collectives(hlo_text: str) -> list[tuple[str, list[tuple[str, tuple[int, ...]]], str]]:
  """(op, [(dtype, per-device shape) of each array of its result], its line) of every collective in a
  compiled (partitioned) module's text: what experiments/step_time.py prices and the 8-device tests
  read."""
  found = []
  for line in hlo_text.splitlines():
    m = _COLLECTIVE.search(line)
    if m:
      arrays = [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in _ARRAY.findall(m.group(1))]
      found.append((m.group(2), arrays, line))
  return found


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs / arrays (the largest device)."""
  totals: dict[Any, int] = {}
  for leaf in jax.tree.leaves(tree):
    itemsize = np.dtype(leaf.dtype).itemsize
    for device, index in leaf.sharding.devices_indices_map(tuple(leaf.shape)).items():
      shard = math.prod(len(range(*s.indices(n))) for s, n in zip(index, leaf.shape))
      totals[device] = totals.get(device, 0) + shard * itemsize
  return max(totals.values()) if totals else 0


def _compiled_memory(compiled) -> dict[str, int]:
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  names = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
  out = {name.replace("_size_in_bytes", ""): int(getattr(stats, name, 0) or 0) for name in names}
  # Live bytes = args + outputs - donated + temps. TPU also reports its own peak (its temp figure can
  # read 0); CPU's peak_memory_in_bytes leaves temps out, so take the larger of the two.
  out["peak"] = max(int(getattr(stats, "peak_memory_in_bytes", 0) or 0),
                    out["argument"] + out["output"] - out["alias"] + out["temp"])
  return out


def workload_engine(cfg: ModelConfig, mesh, work: Workload, train_cfg=None, reward_method: str = "fused"):
  """(the run's engine.Engine for `work` on `mesh`, the model's abstract params): built from shapes
  only, nothing allocated. Every function below lowers this engine's own jitted functions (its
  `*_jit` builders and its ShardedSampler's), so a report row is the program a run compiles.

  Settings: `train_cfg` with the workload's train micro-batch, the workload's reward micro-batch (both
  fitted to the mesh as a run fits them), cosine chunk = reward micro-batch (the fused pass chunks
  within a micro-batch, so any config.reward.chunk_size at or above it, as in every shipped config,
  compiles the same program).
  """
  from compassplay_jax.runtime import engine as engine_lib
  from compassplay_jax.models import hf_io
  from compassplay_jax.rl import train_step as train_lib
  train_cfg = (train_cfg or train_lib.TrainConfig()).replace(micro_batch_size=work.train_micro_batch)
  settings = engine_lib.EngineSettings(train=train_cfg, reward_method=reward_method,
                                       reward_chunk_size=work.reward_micro_batch,
                                       reward_micro_batch=work.reward_micro_batch)
  graphdef, params = hf_io.abstract_model(cfg)
  return engine_lib.Engine.build(graphdef, params, mesh, settings), params


def _sharded_params(engine, params):
  """The model's params (cfg.param_dtype) as ShapeDtypeStructs with the engine's shardings; g_ref has
  the same layout."""
  return sharding_lib.abstract_sharded(params, engine.param_shardings(params))


def _abstract_batch(mesh, rows: int, seq_len: int, per_token_float: tuple[str, ...] = ()):
  bs2, bs1 = sharding_lib.batch_sharding(mesh, 2), sharding_lib.batch_sharding(mesh, 1)
  batch = {
      "tokens": jax.ShapeDtypeStruct((rows, seq_len), jnp.int32, sharding=bs2),
      "attention_mask": jax.ShapeDtypeStruct((rows, seq_len), jnp.int32, sharding=bs2),
      "loss_mask": jax.ShapeDtypeStruct((rows, seq_len), jnp.int32, sharding=bs2),
  }
  for name in per_token_float:
    batch[name] = jax.ShapeDtypeStruct((rows, seq_len), jnp.float32, sharding=bs2)
  return batch, bs1


def _columns(batch):
  return batch["tokens"], batch["loss_mask"], batch["attention_mask"]


def lower_train_step(cfg: ModelConfig, mesh, work: Workload, train_cfg=None):
  """The lowered train step (Engine.train_step's jit) for `work`'s batch, and its abstract (params, opt_state)."""
  engine, params = workload_engine(cfg, mesh, work, train_cfg)
  params, opt_state = engine.abstract_train_state(params)
  batch, bs1 = _abstract_batch(mesh, work.train_batch, work.seq_len, ("old_logprobs",))
  batch["advantages"] = jax.ShapeDtypeStruct((work.train_batch,), jnp.float32, sharding=bs1)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding_lib.replicated(mesh))
  step = engine.train_step_jit(params, opt_state)
  return step.lower(params, opt_state, batch, key), (params, opt_state)


def lower_reward_step(cfg: ModelConfig, mesh, work: Workload, method: str = "fused"):
  """The lowered reward step: Engine's g_ref over the reference set, then its cosines of the
  candidates, in one program (the run calls the two separately: report_functions compiles each)."""
  engine, params = workload_engine(cfg, mesh, work, reward_method=method)
  params = _sharded_params(engine, params)
  p_sh = jax.tree.map(lambda x: x.sharding, params)
  ref_batch, _ = _abstract_batch(mesh, work.reference_size, work.seq_len)
  cand_batch, bs1 = _abstract_batch(mesh, work.reward_candidates, work.seq_len)
  g_ref_fn = engine.reference_gradient_jit(params, work.reference_size)
  cosines_fn = engine.cosines_jit(params, work.reward_candidates)

  def reward_step(p, ref, cand):
    g_ref = g_ref_fn(p, *_columns(ref))
    return cosines_fn(p, g_ref, *_columns(cand)).cosines, g_ref

  jitted = jax.jit(reward_step, in_shardings=(p_sh, sharding_lib.batch_tree_shardings(ref_batch, mesh),
                                              sharding_lib.batch_tree_shardings(cand_batch, mesh)),
                   out_shardings=(bs1, p_sh))
  return jitted.lower(params, ref_batch, cand_batch), params


def _compile_or_oom(lower_fn):
  """(the compiled step's figures, its abstract inputs) from `lower_fn() -> (lowered, inputs)`; a
  compiler out-of-memory verdict is a result too.

  The TPU compiler refuses programs that cannot fit its HBM; we record that as {"oom": message}.
  """
  try:
    lowered, inputs = lower_fn()
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return {"oom": str(e).split("RESOURCE_EXHAUSTED:")[-1].strip()}, None
  return _compiled_memory(compiled), inputs


def report(cfg: ModelConfig, mesh, work: Workload, reward_method: str = "fused", train_cfg=None) -> dict[str, Any]:
  """Per-device bytes: params, optimizer state, reference gradient, and each step's XLA figures."""
  train, _ = _compile_or_oom(lambda: lower_train_step(cfg, mesh, work, train_cfg))
  reward, _ = _compile_or_oom(lambda: lower_reward_step(cfg, mesh, work, reward_method))
  engine, model_params = workload_engine(cfg, mesh, work, train_cfg, reward_method)
  params, opt_state = engine.abstract_train_state(model_params)
  reward_params = _sharded_params(engine, model_params)
  return {
      "model": work.model,
      "mesh": sharding_lib.mesh_summary(mesh),
      "devices": mesh.size,
      "params": per_device_bytes(params),
      "opt_state": per_device_bytes(opt_state),
      # g_ref has the reward params' shapes, dtype and shardings (it is their gradient).
      "ref_grad": per_device_bytes(reward_params),
      "train": train,
      "reward": reward,
  }


def _size(n: int) -> str:
  if n >= GIB / 10:
    return f"{n / GIB:.2f} GiB"
  return f"{n / 1024 ** 2:.2f} MiB"


def format_table(rows: list[dict[str, Any]]) -> str:
  """A markdown table of `report` results, bytes per device."""
  header = ("| model | mesh | params | opt state | ref grad | train temp | train peak | reward temp "
            "| reward peak |\n|---|---|---|---|---|---|---|---|---|")
  lines = [header]
  for r in rows:
    cells = [_size(r["params"]), _size(r["opt_state"]), _size(r["ref_grad"])]
    for step in ("train", "reward"):
      if "oom" in r[step]:
        cells += ["does not fit", "compiler: out of memory"]
      else:
        cells += [_size(r[step]["temp"]), _size(r[step]["peak"])]
    lines.append(f"| {r['model']} | {r['mesh']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


# ---- per-function report ------------------------------------------------------------------------------

# Each device function the paper step runs, compiled on its own: the sampler's prefill and decode loop
# (sampling/decode.py, engine.ShardedSampler's jits), g_ref over the reference set, fused
# cosines of 64 and of 256 candidates, and the train step.
FUNCTIONS = ("prefill", "decode", "g_ref", "cos64", "cos256", "train")
FUNCTION_ALIASES = {"sampler": ("prefill", "decode"), "cosines": ("cos64", "cos256"), "all": FUNCTIONS}

# HBM per chip of TPU generations (what the TPU compiler checks against; v5p measured: 95.74 GiB).
TPU_HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5litepod": 16.0, "v5p": 95.74, "v6e": 32.0}


def parse_functions(spec: str | None) -> tuple[str, ...]:
  """"sampler,g_ref,cos64" -> ("prefill", "decode", "g_ref", "cos64"); aliases: sampler, cosines, all.
  cosN for any N (e.g. cos128) is accepted."""
  out: list[str] = []
  for name in (spec or "all").split(","):
    name = name.strip()
    names = FUNCTION_ALIASES.get(name, (name,))
    for n in names:
      if n not in FUNCTIONS and not (n.startswith("cos") and n[3:].isdigit()):
        raise ValueError(f"unknown function {n!r} (known: {', '.join(FUNCTIONS)}, cosN, "
                         f"{', '.join(FUNCTION_ALIASES)})")
      if n not in out:
        out.append(n)
  return tuple(out)


def device_memory_bytes(topology: str | None = None, gib: float | None = None) -> int:
  """The memory one device has: `gib` if given, else a TPU topology's HBM, else 80 GiB (A100/H100)."""
  if gib:
    return int(gib * GIB)
  if topology:
    generation = topology.split(":")[0].lower()
    if generation not in TPU_HBM_GIB:
      raise ValueError(f"HBM of {generation!r} unknown; pass --device-memory-gib")
    return int(TPU_HBM_GIB[generation] * GIB)
  return 80 * GIB


def _sampler_static(work: Workload):
  from compassplay_jax.sampling.config import SamplerParams
  return dict(n_samples=1, max_new_tokens=work.sampler_new_tokens, sampler=SamplerParams(1.0, 1.0, 0),
              eos_ids=(0,), pad_id=0)


def _sampler_prefill(cfg: ModelConfig, mesh, work: Workload):
  """(engine, the sampler's jitted prefill, its abstract args) as a run's engine.ShardedSampler builds it."""
  engine, params = workload_engine(cfg, mesh, work)
  rows, length = work.sampler_rows, work.sampler_prompt_len
  shapes = [((rows, length), jnp.int32), ((rows, length), jnp.int32), ((rows,), jnp.int32), ((rows,), jnp.bool_)]
  args = (params, *(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes),
          jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
  jitted, in_sh = engine.sampler.prefill_jit(engine.graphdef, *args, **_sampler_static(work))
  return engine, jitted, sharding_lib.abstract_sharded(args, in_sh)


def lower_prefill(cfg: ModelConfig, mesh, work: Workload):
  """The sampler's prefill of `work.sampler_rows` prompts of the prompt bucket."""
  _, jitted, args = _sampler_prefill(cfg, mesh, work)
  return jitted.lower(*args), args


def lower_decode(cfg: ModelConfig, mesh, work: Workload):
  """The decode loop (lax.while_loop over max_new_tokens steps, the state donated) at the full cache."""
  engine, prefill, prefill_args = _sampler_prefill(cfg, mesh, work)
  static = {k: v for k, v in _sampler_static(work).items() if k in ("sampler", "eos_ids", "pad_id")}
  state = jax.eval_shape(prefill, *prefill_args)
  args = (prefill_args[0], state, jax.ShapeDtypeStruct((), jnp.int32),
          jax.ShapeDtypeStruct((work.sampler_rows,), jnp.bool_))
  jitted, in_sh = engine.sampler.decode_jit(engine.graphdef, *args, **static)
  args = sharding_lib.abstract_sharded(args, in_sh)
  return jitted.lower(*args), args


def lower_reference_gradient(cfg: ModelConfig, mesh, work: Workload):
  """g_ref over the reference set: Engine.reference_gradient's jit."""
  engine, params = workload_engine(cfg, mesh, work)
  params = _sharded_params(engine, params)
  batch, _ = _abstract_batch(mesh, work.reference_size, work.seq_len)
  jitted = engine.reference_gradient_jit(params, work.reference_size)
  return jitted.lower(params, *_columns(batch)), params


def lower_cosines(cfg: ModelConfig, mesh, work: Workload, n: int, method: str = "fused"):
  """Cosines of n candidates with g_ref (params-shaped, like the params): Engine.cosines' jit."""
  engine, params = workload_engine(cfg, mesh, work, reward_method=method)
  params = _sharded_params(engine, params)
  batch, _ = _abstract_batch(mesh, n, work.seq_len)
  jitted = engine.cosines_jit(params, n)
  return jitted.lower(params, params, *_columns(batch)), params


def function_shapes(name: str, work: Workload) -> str:
  """The shapes a function is compiled at, for the table."""
  if name in ("prefill", "decode"):
    return f"{work.sampler_rows} rows, cache {work.sampler_prompt_len}+{work.sampler_new_tokens}"
  if name == "g_ref":
    return f"{work.reference_size} x {work.seq_len}, mb {work.reward_micro_batch}"
  if name == "train":
    return f"{work.train_batch} x {work.seq_len}, mb {work.train_micro_batch}"
  return f"{name[3:]} x {work.seq_len}, mb {work.reward_micro_batch}"


# The functions whose blocks ModelConfig.scan_layers runs as one scan: plain ops and no KV cache (the
# fused cosines' ops address layers by name; the sampler has a cache; the direct cosines also scan).
SCANNED_FUNCTIONS = ("g_ref", "train")


def runs_scanned(name: str, cfg: ModelConfig, reward_method: str = "fused") -> bool:
  """Whether function `name` runs its blocks as one scan under `cfg`."""
  plain_ops = name in SCANNED_FUNCTIONS or (name.startswith("cos") and reward_method == "direct")
  return bool(cfg.scan_layers) and plain_ops


def suggest_knob(name: str, cfg: ModelConfig, mesh, work: Workload) -> str:
  """The first knob to turn when `name` does not fit, in the order that costs least."""
  full_sequence = name != "decode"
  if full_sequence and not cfg.attention_query_chunk:
    return "attention_query_chunk (--attention-chunk)"
  if name in ("g_ref", "train") or name.startswith("cos"):
    if not cfg.remat:
      return "remat (--remat)"
    if name in SCANNED_FUNCTIONS and not cfg.scan_layers:
      return "scan_layers (--scan-layers)"
    mb = work.train_micro_batch if name == "train" else work.reward_micro_batch
    if mb > sharding_lib.batch_divisor(mesh):
      return "smaller micro-batch (--micro-batch)"
  if name in ("prefill", "decode") and work.sampler_rows > sharding_lib.batch_divisor(mesh):
    return "fewer sampler rows (--sampler-rows; config.sampling.micro_batch_size)"
  if mesh.shape.get("tensor", 1) == 1:
    return "tensor axis (--mesh d,f,t with t > 1)"
  return "more devices"


def lower_function(name: str, cfg: ModelConfig, mesh, work: Workload, train_cfg=None,
                   reward_method: str = "fused"):
  """(function `name` of the run's engine lowered at `work`'s shapes, its abstract inputs)."""
  if name == "prefill":
    return lower_prefill(cfg, mesh, work)
  if name == "decode":
    return lower_decode(cfg, mesh, work)
  if name == "g_ref":
    return lower_reference_gradient(cfg, mesh, work)
  if name == "train":
    return lower_train_step(cfg, mesh, work, train_cfg)
  if name.startswith("cos"):
    return lower_cosines(cfg, mesh, work, int(name[3:]), reward_method)
  raise ValueError(f"unknown function {name!r}")


def report_functions(cfg: ModelConfig, mesh, work: Workload, functions=FUNCTIONS, *, device_bytes: int = 80 * GIB,
                     train_cfg=None, reward_method: str = "fused", on_row=None) -> list[dict[str, Any]]:
  """One row per function: XLA's per-device argument / output / temp / peak bytes and whether the
  peak fits `device_bytes` (else the knob to turn: `suggest_knob`). A TPU compiler out-of-memory
  verdict is a row that does not fit. `on_row(row)` is called as each row is done (progress).
  Micro-batches are shown (and knobs suggested) as the engine fits them to the mesh."""
  import time
  settings = workload_engine(cfg, mesh, work, train_cfg, reward_method)[0].settings
  work = dataclasses.replace(work, train_micro_batch=settings.train.micro_batch_size,
                             reward_micro_batch=settings.reward_micro_batch)
  rows = []
  for name in functions:
    start = time.time()
    figures, _ = _compile_or_oom(lambda: lower_function(name, cfg, mesh, work, train_cfg, reward_method))
    fits = "oom" not in figures and figures.get("peak", 0) <= device_bytes
    row = {"model": work.model, "mesh": sharding_lib.mesh_summary(mesh), "function": name,
           "shapes": function_shapes(name, work), **figures, "device_bytes": device_bytes,
           "fits": "yes" if fits else "no: " + suggest_knob(name, cfg, mesh, work),
           "attention_query_chunk": cfg.attention_query_chunk, "remat": cfg.remat,
           "scan_layers": runs_scanned(name, cfg, reward_method),
           "compile_s": round(time.time() - start, 1)}
    rows.append(row)
    if on_row is not None:
      on_row(row)
  return rows


def format_function_table(rows: list[dict[str, Any]]) -> str:
  """A markdown table of `report_functions` rows, bytes per device (with the backend and the compile
  seconds where the rows carry them: experiments/memory_report.py adds both)."""
  lines = ["| backend | model | mesh | function | shapes | argument | output | temp | peak | fits | compile s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "oom" in r:
      cells = ["-", "-", "-", "compiler: out of memory"]
    else:
      cells = [_size(r["argument"]), _size(r["output"]), _size(r["temp"]), _size(r["peak"])]
    function = r["function"] + (" (scan)" if r.get("scan_layers") else "")
    lines.append(f"| {r.get('backend', '-')} | {r['model']} | {r['mesh']} | {function} | {r['shapes']} | "
                 + " | ".join(cells) + f" | {r['fits']} | {r.get('compile_s', '-')} |")
  return "\n".join(lines)


# ---- the update with the rollout engine alive ---------------------------------------------------

def update_with_engine(train_row: dict[str, Any], cfg: ModelConfig, *, params_bytes: int, opt_bytes: int,
                       sampler_devices: int, compute_dtype: str = "bfloat16", cache_fraction: float = 0.5
                       ) -> dict[str, Any]:
  """Per-device peak of the update (a `report_functions` "train" row) beside what the rollout engine
  holds between rollouts if it is not released (Engine.release_rollout_memory; the loop releases it):

  - its KV cache: with sampling.memory_budget_gb 0 the engine takes `cache_fraction` of what is free
    once the params and optimizer state are placed (batching.device_memory_budget);
  - its compute-dtype weight copy: whole on each host's sampler mesh, so split over the
    `sampler_devices` devices of one host (8 on 8 x H100, 4 per host on a v5p-8 of 2 hosts).

  params_bytes / opt_bytes: per device, as placed for the update."""
  weights = _param_count(cfg)
  copy = weights * np.dtype(jnp.dtype(compute_dtype)).itemsize // max(sampler_devices, 1)
  device_bytes = train_row["device_bytes"]
  cache = int(cache_fraction * max(device_bytes - params_bytes - opt_bytes, 0))
  released, alive = train_row["peak"], train_row["peak"] + cache + copy
  return {"model": train_row["model"], "mesh": train_row["mesh"], "device_bytes": device_bytes,
          "update_peak": released, "engine_cache": cache, "engine_weights": copy, "engine_alive_peak": alive,
          "fits_released": released <= device_bytes, "fits_alive": alive <= device_bytes}


def engine_rows(train_rows: list[dict[str, Any]], cfg: ModelConfig, mesh, work: Workload, *, sampler_devices: int,
                train_cfg=None, compute_dtype: str = "bfloat16") -> list[dict[str, Any]]:
  """update_with_engine for each "train" row, with the params' and optimizer state's per-device bytes
  as the run's engine places them (workload_engine, abstract_train_state)."""
  engine, params = workload_engine(cfg, mesh, work, train_cfg)
  placed_params, opt_state = engine.abstract_train_state(params)
  return [update_with_engine(row, cfg, params_bytes=per_device_bytes(placed_params),
                             opt_bytes=per_device_bytes(opt_state), sampler_devices=sampler_devices,
                             compute_dtype=compute_dtype)
          for row in train_rows if row["function"] == "train" and "peak" in row]


def _param_count(cfg: ModelConfig) -> int:
  """Weights of a decoder of `cfg`'s shape (embeddings, attention with its biases, MLP, norms, head)."""
  h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
  q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
  attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if cfg.attention_bias else 0)
  per_layer = attention + 3 * h * f + 2 * h
  head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
  return cfg.vocab_size * h + layers * per_layer + h + head


def format_engine_table(rows: list[dict[str, Any]]) -> str:
  """A markdown table of `update_with_engine` rows, bytes per device."""
  lines = ["| model | mesh | device | update peak (engine released) | + KV cache | + weight copy | "
           "update peak (engine alive) | fits released / alive |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    fits = f"{'yes' if r['fits_released'] else 'no'} / {'yes' if r['fits_alive'] else 'no'}"
    lines.append(f"| {r['model']} | {r['mesh']} | {_size(r['device_bytes'])} | {_size(r['update_peak'])} | "
                 f"{_size(r['engine_cache'])} | {_size(r['engine_weights'])} | {_size(r['engine_alive_peak'])} | "
                 f"{fits} |")
  return "\n".join(lines)
