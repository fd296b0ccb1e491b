"""Gradient-alignment cosines r_cos(x_i) = <g_i, g_ref> / (||g_i|| ||g_ref||), over all parameters.

g_i is the gradient of candidate i's token-mean cross-entropy over its solution tokens
(`losses.per_sequence_loss`: loss_mask aligned with tokens, padding never counts); g_ref is a
params-shaped gradient (`reference.reference_gradient`). Two exact methods, selected by `method`:
  "direct": chunked vmap(grad) reduced per chunk (cosines_direct.py; memory chunk_size x P);
  "fused":  one forward + one backward pass with custom-VJP probe ops (cosines_fused.py; memory of
            a training step, no P-sized buffer at all);
  "auto":   whichever of the two costs less by its compiled program (`choose_method`, AOT: FLOPs,
            bytes accessed and peak memory against the device's memory; no timing), once per shape.
Either runs over `micro_batch` candidates at a time (strided micro-batches under `lax.map`, the
layout g_ref and the train step use), so activation memory is that of micro_batch rows, not of all
N: each candidate's statistics depend on its own row only, so the grouping changes no result.
A candidate with no loss tokens has g_i = 0: its inner product and squared norm are 0, its cosine is
defined as 0 and `has_loss_tokens` is False for it (no NaN). A zero g_ref likewise gives cosine 0.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp

from compassplay_jax.infra import microbatch
from compassplay_jax.rewards.cosines_direct import direct_stats, tree_vdot
from compassplay_jax.rewards.cosines_fused import FusedConfig, fused_stats
from compassplay_jax.rewards.losses import token_counts

METHODS = ("fused", "direct", "auto")
CONCRETE_METHODS = ("fused", "direct")
# Arguments that `jax.jit` must treat as static (hashable Python values).
COSINE_STATIC_ARGNAMES = ("graphdef", "method", "chunk_size", "norm_mode", "micro_batch")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CosineResult:
  """Per-candidate alignment with g_ref (a pytree, so jitted functions can return it).

  cosines: (N,) in [-1, 1]; 0 where has_loss_tokens is False or g_ref = 0.
  inner_products: (N,) <g_i, g_ref>, with g_i the gradient of the token-mean loss.
  sq_norms: (N,) ||g_i||^2.
  ref_sq_norm: () ||g_ref||^2.
  has_loss_tokens: (N,) bool; False flags a candidate with no solution token to score.
  """
  cosines: jnp.ndarray
  inner_products: jnp.ndarray
  sq_norms: jnp.ndarray
  ref_sq_norm: jnp.ndarray
  has_loss_tokens: jnp.ndarray


def cosines_from_stats(inner_products, sq_norms, ref_sq_norm, has_loss_tokens) -> CosineResult:
  """Cosines from raw statistics, with 0 for empty candidates and a zero g_ref (no NaN)."""
  denom = jnp.sqrt(jnp.maximum(sq_norms, 0.0)) * jnp.sqrt(jnp.maximum(ref_sq_norm, 0.0))
  ok = has_loss_tokens & (denom > 0)
  cos = jnp.where(ok, inner_products / jnp.where(ok, denom, 1.0), 0.0)
  return CosineResult(jnp.clip(cos, -1.0, 1.0), inner_products, sq_norms, ref_sq_norm, has_loss_tokens)


def gradient_cosines(graphdef, params, g_ref, tokens, loss_mask, attention_mask=None, method: str = "fused",
                     chunk_size: int | None = 8, norm_mode: str = "auto",
                     micro_batch: int | None = None) -> CosineResult:
  """Cosines of N candidates' loss gradients with g_ref, by the method a config switch selects.

  Args:
    graphdef, params: `nnx.split(model)` (params: the solver's current parameters).
    g_ref: params-shaped reference gradient.
    tokens, loss_mask, attention_mask: (N, T) candidates; see `losses.per_sequence_loss` for which
      tokens count (loss_mask[t] = 1: token t is a solution target; prompt and padding are 0).
    method: "fused" (default) or "direct" (static). "auto" is resolved by the caller, who compiles
      both (`AutoMethod`, the engine); here it means "fused".
    chunk_size: direct: candidates per vmap(grad) chunk (its peak is ~chunk_size x P). fused:
      examples per step of each per-layer reduction (None: all at once). Static.
    norm_mode: fused only: "auto", "direct" or "gram" per-layer norm form (cosines_fused.FusedConfig).
    micro_batch: candidates per forward/backward pass (static; None: all N in one pass). N need not
      be a multiple of it: the last micro-batch is padded with rows that have no loss tokens.

  Returns:
    CosineResult; a no-loss-token candidate gets cosine 0 and has_loss_tokens False.
  """
  tokens = jnp.asarray(tokens)
  loss_mask = jnp.asarray(loss_mask)
  attention_mask = jnp.ones(tokens.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  method = "fused" if method == "auto" else method

  def stats(tok, lm, am):
    if method == "direct":
      return direct_stats(graphdef, params, g_ref, tok, lm, am, chunk_size or tok.shape[0])
    return fused_stats(graphdef, params, g_ref, tok, lm, am, FusedConfig(norm_mode=norm_mode, chunk_size=chunk_size))

  n = tokens.shape[0]
  mb = n if micro_batch is None else max(1, int(micro_batch))
  ip, sq = microbatch.map_rows(stats, (tokens, loss_mask, attention_mask), mb, pad=True)
  has_loss = token_counts(loss_mask, attention_mask) > 0
  zero = jnp.zeros_like(ip)
  return cosines_from_stats(jnp.where(has_loss, ip, zero), jnp.where(has_loss, sq, zero),
                            tree_vdot(g_ref, g_ref), has_loss)


gradient_cosines_jit = jax.jit(gradient_cosines, static_argnames=COSINE_STATIC_ARGNAMES)


# ---- method="auto": the cheaper method by compiled cost ----------------------------------------------

# Seconds per FLOP and per byte accessed of each backend, for `choose_method`'s estimate
# flops / FLOPS + bytes / BANDWIDTH. Only the ratio matters when both fit in memory; the figures are
# round peak numbers (CPU: 2 cores, ~100 GFLOP/s fp32, ~10 GB/s; GPU: H100/H200 bf16 dense, HBM3e;
# TPU: v5p), not fitted to a benchmark.
BACKEND_SPEEDS = {"cpu": (1e11, 1e10), "gpu": (9.9e14, 4.8e12), "tpu": (4.6e14, 2.8e12)}
# Estimates within this fraction of each other are a tie, and a tie goes to the smaller peak: on
# 2 CPU cores the one-pass fused program (peak ~ a training step's) ran 1.5-2x slower than chunked
# vmap(grad) (peak ~ 8 candidates') at equal compiled bytes and FLOPs (docs/rewards.md, "method=auto").
AUTO_TIE = 0.05


@dataclasses.dataclass(frozen=True)
class CompiledCost:
  """A compiled program's cost: dot FLOPs and bytes accessed with every while loop's body counted
  as many times as it runs (XLA's cost_analysis counts a body once), and peak bytes
  (arguments + outputs + temporaries - aliased, XLA's buffer assignment)."""
  flops: float
  bytes_accessed: float
  peak_bytes: int


def choose_method(fused_cost: CompiledCost, direct_cost: CompiledCost, memory_budget: float | None = None,
                  backend: str = "cpu") -> str:
  """"fused" or "direct" from the two methods' compiled costs at the same shapes. Pure.

  1. Memory: a method whose peak exceeds `memory_budget` (bytes per device; None = no limit) is out.
     If only one fits it is chosen; if neither does, the smaller peak is (the caller then fails or
     reports, as it would have with that method).
  2. Both fit: the smaller estimate flops / FLOPS + bytes / BANDWIDTH (`BACKEND_SPEEDS[backend]`)
     when it is smaller by more than `AUTO_TIE`;
  3. otherwise the smaller peak (and on equal peaks, "fused").
  """
  costs = {"fused": fused_cost, "direct": direct_cost}
  if memory_budget is not None and memory_budget > 0:
    fits = [m for m, c in costs.items() if c.peak_bytes <= memory_budget]
    if len(fits) == 1:
      return fits[0]
    if not fits:
      return min(costs, key=lambda m: (costs[m].peak_bytes, m != "fused"))
  flops_per_s, bytes_per_s = BACKEND_SPEEDS.get(backend, BACKEND_SPEEDS["cpu"])
  est = {m: c.flops / flops_per_s + c.bytes_accessed / bytes_per_s for m, c in costs.items()}
  if est["direct"] < est["fused"] * (1.0 - AUTO_TIE):
    return "direct"
  if est["fused"] < est["direct"] * (1.0 - AUTO_TIE):
    return "fused"
  return "direct" if direct_cost.peak_bytes < fused_cost.peak_bytes else "fused"


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][a-z\-]*)\((.*)$")
_FREE = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def _elements(dims: str) -> int:
  n = 1
  for d in dims.split(","):
    if d:
      n *= int(d)
  return n


def _shape_bytes(shape: str) -> int:
  return sum(_DTYPE_BYTES[dt] * _elements(dims) for dt, dims in _ARRAY.findall(shape))


def hlo_cost(hlo_text: str) -> tuple[float, float]:
  """(dot FLOPs, bytes accessed) of a compiled module's text, while bodies times their trip count.

  Bytes: each top-level instruction (a fusion, a dot, a copy, ...) reads its operands and writes its
  output (a dynamic slice reads what it writes, a dynamic-update-slice, or a fusion
  rooted in one, writes its update in place);
  FLOPs: 2 x output elements x contracted elements of
  every dot, inside fusions too. A loop without a known trip count counts once.
  """
  comps: dict[str, list[str]] = {}
  entry, cur = None, None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      head = line.split(" ", 2)
      is_entry = head[0] == "ENTRY"
      cur = (head[1] if is_entry else head[0]).lstrip("%")
      comps[cur] = []
      entry = cur if is_entry else entry
    elif cur is not None and " = " in line:
      comps[cur].append(line)
  shapes = {}
  parsed = {}
  roots = {}  # computation -> the op of its ROOT instruction
  for name, lines in comps.items():
    parsed[name] = [m.groups() for m in map(_INSTR.match, lines) if m]
    for line in lines:
      m = _INSTR.match(line)
      if m and line.lstrip().startswith("ROOT "):
        roots[name] = m.group(3)
    for inst, shape, _, _ in parsed[name]:
      shapes[inst] = shape

  def dot_flops(shape, rest):
    lhs = re.match(r"\s*%?([\w.\-]+)", rest)
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
    lhs_dims = _ARRAY.search(shapes.get(lhs.group(1), "")) if lhs else None
    if not (lhs_dims and contracting):
      return 0.0
    dims = [int(d) for d in lhs_dims.group(2).split(",") if d]
    k = 1
    for i in contracting.group(1).split(","):
      if i:
        k *= dims[int(i)]
    out = _ARRAY.search(shape)
    return 2.0 * (_elements(out.group(2)) if out else 0) * k

  def flops_in(comp, mult, seen=()):
    total = 0.0
    for _, shape, op, rest in parsed.get(comp, []):
      if op in ("dot", "convolution"):
        total += mult * dot_flops(shape, rest)
      for called in re.findall(r"(?:calls|to_apply|body)=%?([\w.\-]+)", rest):
        if called not in seen:
          trip = _trip_count(rest) if op == "while" else 1
          total += flops_in(called, mult * trip, seen + (called,))
    return total

  def bytes_in(comp, mult):
    total = 0.0
    for _, shape, op, rest in parsed.get(comp, []):
      if op in _FREE:
        continue
      if op == "while":
        total += bytes_in(re.search(r"body=%?([\w.\-]+)", rest).group(1), mult * _trip_count(rest))
        continue
      if op in ("call", "conditional"):
        for called in re.findall(r"(?:to_apply=|calls=|branch_computations=\{)%?([\w.\-]+)", rest):
          total += bytes_in(called, mult)
        continue
      out = _shape_bytes(shape)
      if op == "dynamic-slice" or re.search(r'op_name="[^"]*dynamic_slice"', rest):
        total += mult * 2 * out  # a slice reads what it writes, not its whole operand
        continue
      operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
      called = re.search(r"calls=%?([\w.\-]+)", rest)
      if op == "dynamic-update-slice" or (op == "fusion" and called and roots.get(called.group(1)) == "dynamic-update-slice"):
        # In place: the buffer it updates (an operand of the output's shape) is neither read nor
        # written whole; the update and the indices are read and the update written.
        read = sum(_shape_bytes(shapes.get(a, "")) for a in operands) - out
        total += mult * 2 * max(read, 0)
        continue
      total += mult * (out + sum(_shape_bytes(shapes.get(a, "")) for a in operands))
    return total

  return flops_in(entry, 1), bytes_in(entry, 1)


def _trip_count(rest: str) -> int:
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
  return int(m.group(1)) if m else 1


def compiled_cost(compiled) -> CompiledCost:
  """The CompiledCost of a `jax.stages.Compiled` (its HLO text and XLA's memory analysis)."""
  flops, nbytes = hlo_cost(compiled.as_text())
  m = compiled.memory_analysis()
  peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  return CompiledCost(flops=flops, bytes_accessed=nbytes, peak_bytes=int(peak))


def device_memory_budget(device=None) -> float | None:
  """Bytes a program may use on `device` (its allocator's limit), or None where jax reports none (CPU)."""
  device = device or jax.devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # backends without memory stats
    return None
  return float(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _abstract(x):
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  sharding = None if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
  return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x), sharding=sharding)


class AutoMethod:
  """method="auto" for a jitted cosine pass: `build(method)` gives the jitted
  (params, g_ref, tokens, loss_mask, attention_mask) -> CosineResult of "fused" or "direct"; on the
  first call (or `lower`) at a new candidate shape, both are compiled ahead of time, `choose_method`
  picks one from their CompiledCost, and that compiled program serves every later call at that shape.
  No timing: the choice is a function of the two programs and the budget. `choices` records them.
  """

  def __init__(self, build: Callable[[str], Any], memory_budget: float | None = None, backend: str | None = None):
    self.build = build
    self.memory_budget = memory_budget
    self.backend = backend or jax.default_backend()
    self.choices: dict[tuple, str] = {}
    self.costs: dict[tuple, dict[str, CompiledCost]] = {}
    self._compiled: dict[tuple, Any] = {}
    self.__name__ = "gradient_cosines_auto"

  @staticmethod
  def _key(args) -> tuple:
    return tuple((tuple(jnp.shape(a)), str(jnp.result_type(a))) for a in args[2:])

  def resolve(self, *args) -> str:
    """The method for these arguments' shapes (compiles both methods the first time)."""
    key = self._key(args)
    if key not in self.choices:
      abstract = jax.tree.map(_abstract, args)
      compiled = {m: self.build(m).lower(*abstract).compile() for m in CONCRETE_METHODS}
      costs = {m: compiled_cost(c) for m, c in compiled.items()}
      choice = choose_method(costs["fused"], costs["direct"], self.memory_budget, self.backend)
      self.costs[key], self.choices[key] = costs, choice
      self._compiled[key] = compiled[choice]
    return self.choices[key]

  def lower(self, *args):
    return self.build(self.resolve(*args)).lower(*args)

  def __call__(self, *args):
    method = self.resolve(*args)
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
      return self.build(method)(*args)  # inside another trace: the jitted function, not the executable
    return self._compiled[self._key(args)](*args)


def method_costs(graphdef, params, g_ref, tokens, loss_mask, attention_mask, chunk_size: int | None = 8,
                 norm_mode: str = "auto", micro_batch: int | None = None) -> dict[str, CompiledCost]:
  """{"fused": CompiledCost, "direct": CompiledCost} of `gradient_cosines_jit` at these arguments
  (arrays or ShapeDtypeStructs), compiled ahead of time; nothing runs."""
  args = jax.tree.map(_abstract, (params, g_ref, tokens, loss_mask, attention_mask))
  return {m: compiled_cost(gradient_cosines_jit.lower(graphdef, *args, method=m, chunk_size=chunk_size,
                                                      norm_mode=norm_mode, micro_batch=micro_batch).compile())
          for m in CONCRETE_METHODS}
