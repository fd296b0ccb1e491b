"""Device mesh, partition rules and the shardings handed to jit.

The mesh has three axes, outermost first: `data` (pure data parallelism: replicas hold whole
parameters), `fsdp` (data parallelism with parameters, gradients and optimizer state sharded, ZeRO-3
style) and `tensor` (Megatron tensor parallelism inside a layer). The batch is split over
(data, fsdp); parameters follow PARAM_RULES. Everything is GSPMD (`jax.jit` with shardings): the model
code carries no sharding annotations and the partitioner inserts the collectives.

The rules match the *end* of a dotted leaf path, so the same table shards parameters, gradients, the
reference gradient and optimizer moments (".../mu/layers.0.mlp.up_proj.kernel").
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compassplay_jax.core.errors import UserError
from compassplay_jax.models.layout import BATCH_AXES  # the batch dimension is split over both data-parallel axes
from compassplay_jax.models.tree_paths import path_str  # noqa: F401  (re-exported: sh.path_str)

AXES = ("data", "fsdp", "tensor")

# Parameter path pattern (regex, matched at the end of the path) -> PartitionSpec.
# Dense kernels are (d_in, d_out). Column-parallel layers (q/k/v, gate/up, lm_head) split d_out over
# `tensor`; row-parallel ones (o, down) split d_in over `tensor`, so each pair needs one all-reduce.
# The other dimension is split over `fsdp`. Norm scales are tiny and replicated.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens", P("tensor", "fsdp")),  # (V, d): vocab-parallel (also the tied head)
    (r"self_attn\.(q|k|v)_proj\.kernel", P("fsdp", "tensor")),  # (d, heads*hd)
    (r"self_attn\.(q|k|v)_proj\.bias", P("tensor")),
    (r"self_attn\.o_proj\.kernel", P("tensor", "fsdp")),  # (heads*hd, d)
    (r"mlp\.(gate|up)_proj\.kernel", P("fsdp", "tensor")),  # (d, ffn)
    (r"mlp\.(gate|up)_proj\.bias", P("tensor")),
    (r"mlp\.down_proj\.kernel", P("tensor", "fsdp")),  # (ffn, d)
    (r"mlp\.down_proj\.bias", P()),
    (r"(input|post_attention)_layernorm\.scale", P()),
    (r"norm\.scale", P()),
    (r"lm_head\.kernel", P("fsdp", "tensor")),  # (d, V)
)
# Attention dims split over `tensor` are split in whole heads: a device never holds part of a head.
# When the head count (e.g. 4 kv heads on tensor=8) is not divisible, that dimension is replicated
# over `tensor` (the usual replicate-kv-heads choice), see fit_spec.
_HEAD_ALIGNED = re.compile(r"self_attn\.(q|k|v|o)_proj\.(kernel|bias)$")

# Logical activation axes -> mesh axes (None: not split).
ACTIVATION_RULES: Mapping[str, Any] = {
    "batch": BATCH_AXES,
    "length": None,
    "embed": None,
    "heads": "tensor",
    "mlp": "tensor",
    "vocab": "tensor",
}

_COMPILED = tuple((re.compile(r"(^|\.)" + pattern + r"$"), spec) for pattern, spec in PARAM_RULES)


class ShardingError(UserError, ValueError):
  """A mesh or partition rule that cannot be applied."""


# ---- mesh -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Axis sizes; one of them may be -1 for "all remaining devices"."""
  data: int = 1
  fsdp: int = -1
  tensor: int = 1

  @classmethod
  def from_any(cls, value: "MeshConfig | Mapping[str, int] | Sequence[int] | str | None") -> "MeshConfig":
    """From a MeshConfig, {"data": 2, ...} or a ConfigDict, (2, 2, 2), "2,2,2" or "data=2,tensor=4"."""
    if value is None:
      return cls()
    if isinstance(value, MeshConfig):
      return value
    if hasattr(value, "to_dict"):  # ml_collections.ConfigDict (config.mesh)
      value = value.to_dict()
    if isinstance(value, str):
      if "=" in value:
        value = {k.strip(): int(v) for k, v in (item.split("=") for item in value.split(",") if item.strip())}
      else:
        value = [int(v) for v in value.split(",")]
    if isinstance(value, Mapping):
      unknown = set(value) - set(AXES)
      if unknown:
        raise ShardingError(f"unknown mesh axis {sorted(unknown)[0]!r} (axes are {AXES})")
      defaults = {"data": 1, "fsdp": 1, "tensor": 1} if -1 in value.values() else {}
      return cls(**{**defaults, **value})
    sizes = tuple(int(v) for v in value)
    if len(sizes) != len(AXES):
      raise ShardingError(f"mesh shape {sizes} needs {len(AXES)} sizes for axes {AXES}")
    return cls(*sizes)

  def resolve(self, num_devices: int) -> tuple[int, int, int]:
    """Concrete sizes for `num_devices` devices, -1 replaced by what is left."""
    sizes = (self.data, self.fsdp, self.tensor)
    if sum(s == -1 for s in sizes) > 1:
      raise ShardingError(f"mesh {sizes}: at most one axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
      raise ShardingError(f"mesh {sizes}: sizes must be positive or -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ShardingError(f"mesh {sizes}: {num_devices} devices are not divisible by {known}")
      sizes = tuple(num_devices // known if s == -1 else s for s in sizes)
    if math.prod(sizes) != num_devices:
      raise ShardingError(f"mesh {sizes} needs {math.prod(sizes)} devices, have {num_devices}")
    return sizes


def make_mesh(config=None, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over `devices` (default: all devices of every process).

  jax.make_mesh orders devices so that the innermost axis (tensor) stays on the fastest links (within
  a host / ICI neighbourhood) and the outermost (data) spans hosts. Axes are Auto: GSPMD propagates.
  """
  devices = list(devices) if devices is not None else jax.devices()
  sizes = MeshConfig.from_any(config).resolve(len(devices))
  return jax.make_mesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def host_meshes(mesh: Mesh) -> tuple[Mesh, Mesh]:
  """(transfer mesh, this process's local mesh) for per-host rollouts on a multi-process mesh.

  The transfer mesh is `mesh`'s devices in the same order with a leading "host" axis (one entry per
  process); the local mesh is this process's block of it, with mesh's axis names. A value laid out
  on the transfer mesh by a spec without "host" is whole on every host, split inside the host as
  the spec says, so its shards form arrays on the local mesh (Engine.sampler_params). Needs each
  process's devices to be one contiguous block of the mesh's device order (jax.make_mesh's order:
  the tensor axis inside a host)."""
  processes = jax.process_count()
  devices = np.asarray(mesh.devices).reshape(-1)
  owners = [d.process_index for d in devices]
  per = len(devices) // processes
  if owners != sorted(owners) or any(owners.count(p) != per for p in range(processes)):
    raise ShardingError(f"mesh {mesh_summary(mesh)}: each process's devices must form one block of the mesh "
                        "(the tensor axis inside a host) for per-host rollouts")
  local_shape = tuple(mesh.devices.shape)
  outer = processes
  for i, size in enumerate(local_shape):  # split the outer axes between hosts and the local block
    take = math.gcd(size, outer)
    local_shape = local_shape[:i] + (size // take,) + local_shape[i + 1:]
    outer //= take
    if outer == 1:
      break
  if outer != 1:
    raise ShardingError(f"mesh {mesh_summary(mesh)} cannot be split into {processes} host blocks")
  grid = devices.reshape((processes,) + local_shape)
  types = (AxisType.Auto,) * (len(AXES) + 1)
  transfer = Mesh(grid, ("host",) + AXES, axis_types=types)
  local = Mesh(grid[jax.process_index()], AXES, axis_types=types[1:])
  return transfer, local


def mesh_summary(mesh: Mesh) -> str:
  return ", ".join(f"{name}={size}" for name, size in mesh.shape.items())


# ---- parameter rules ------------------------------------------------------------------------------

def rule_for(path: str) -> P | None:
  """The PartitionSpec PARAM_RULES names for a dotted path, or None when no rule matches."""
  for regex, spec in _COMPILED:
    if regex.search(path):
      return spec
  return None


def _axis_size(mesh: Mesh, axes) -> int:
  names = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(mesh.shape[a] for a in names)


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh, unit: Sequence[int] | None = None) -> P:
  """Drops mesh axes from dimensions they do not divide (in multiples of `unit`), so any shape loads.

  Such a dimension is replicated over the dropped axis. With the shipped configs and power-of-two
  meshes only kv-head projections (4 kv heads on tensor=8) and odd vocabularies ever hit this.
  """
  if len(spec) > len(shape):
    raise ShardingError(f"spec {spec} has more entries than shape {tuple(shape)}")
  unit = unit or (1,) * len(shape)
  out = []
  for dim, axes in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
    if axes is None:
      out.append(None)
      continue
    names = axes if isinstance(axes, tuple) else (axes,)
    kept, size = [], 1
    for name in names:
      if (shape[dim] // unit[dim]) % (size * mesh.shape[name]) == 0 and shape[dim] % unit[dim] == 0:
        kept.append(name)
        size *= mesh.shape[name]
    out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  while out and out[-1] is None:
    out.pop()
  return P(*out)


def param_spec(path: str, shape: Sequence[int], mesh: Mesh, head_dim: int | None = None) -> P:
  """The PartitionSpec a parameter (or a same-shaped gradient / moment) gets on `mesh`."""
  spec = rule_for(path)
  if spec is None:
    raise ShardingError(f"no partition rule for parameter {path!r}")
  unit = None
  if head_dim and _HEAD_ALIGNED.search(path):
    tensor_dim = [i for i, axes in enumerate(spec) if axes == "tensor"]
    unit = [head_dim if i in tensor_dim else 1 for i in range(len(shape))]
  return fit_spec(spec, shape, mesh, unit)


def tree_shardings(tree, mesh: Mesh, head_dim: int | None = None, strict: bool = True):
  """A NamedSharding for every array leaf of `tree` (params, grads, optimizer state, ...).

  Leaves whose path ends in a parameter path get that parameter's rule. Other leaves (step counts,
  scalars) are replicated; with strict=True any non-scalar leaf without a rule is an error instead.
  """
  def one(key_path, leaf):
    path = path_str(key_path)
    shape = tuple(getattr(leaf, "shape", ()))
    spec = rule_for(path)
    if spec is None or len(spec) > len(shape):
      if strict and len(shape) > 0:
        raise ShardingError(f"no partition rule for parameter {path!r} of shape {shape}")
      return NamedSharding(mesh, P())
    return NamedSharding(mesh, param_spec(path, shape, mesh, head_dim))
  return jax.tree_util.tree_map_with_path(one, tree)


def loader_shardings(mesh: Mesh, head_dim: int | None = None) -> Callable[[str, tuple[int, ...]], NamedSharding]:
  """The `shardings(path, shape)` callable models.loading / hf_io.load_params take."""
  return lambda path, shape: NamedSharding(mesh, param_spec(path, shape, mesh, head_dim))


def shard_params(params, mesh: Mesh, head_dim: int | None = None):
  """Moves an (unsharded or differently sharded) param tree onto `mesh` by the rules.

  Params this process holds whole (every process built the same ones) enter through put_global, so
  this also works when the mesh spans processes."""
  shardings = tree_shardings(params, mesh, head_dim)
  if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(params)):
    return put_global(params, shardings)
  return jax.device_put(params, shardings)


def init_params_sharded(cfg, mesh: Mesh, seed: int = 0):
  """(graphdef, params) of a randomly initialised Decoder, created directly in its sharded layout."""
  from flax import nnx
  from compassplay_jax.models import hf_io
  from compassplay_jax.models.decoder import Decoder
  graphdef, abstract = hf_io.abstract_model(cfg)
  shardings = tree_shardings(abstract, mesh, cfg.head_dim)
  params = jax.jit(lambda: nnx.split(Decoder(cfg, rngs=nnx.Rngs(params=seed)))[1], out_shardings=shardings)()
  return graphdef, params


def abstract_sharded(tree, shardings):
  """ShapeDtypeStructs carrying shardings: for AOT lowering and for orbax restore targets."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


# ---- activations and batches ----------------------------------------------------------------------

def logical_spec(*names: str | None) -> P:
  """PartitionSpec for an activation given its logical axes, e.g. ("batch", "length", "vocab")."""
  for name in names:
    if name is not None and name not in ACTIVATION_RULES:
      raise ShardingError(f"unknown logical axis {name!r} (known: {sorted(ACTIVATION_RULES)})")
  return P(*(None if n is None else ACTIVATION_RULES[n] for n in names))


def jit(fn: Callable, **jit_kwargs) -> Callable:
  """jax.jit(fn, **jit_kwargs), with fn traced on the mesh its in/out shardings name (JAX's abstract
  mesh in context), so the model's activations keep their rows on the batch axes (models/layout.py).
  With no NamedSharding among them, or a one-device mesh, plain jax.jit."""
  mesh = next((s.mesh for key in ("in_shardings", "out_shardings")
               for s in jax.tree.leaves(jit_kwargs.get(key)) if isinstance(s, NamedSharding)), None)
  if mesh is None or mesh.size == 1:
    return jax.jit(fn, **jit_kwargs)

  @functools.wraps(fn)  # the program keeps fn's name in compile logs and profiles
  def on_mesh(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)
  return jax.jit(on_mesh, **jit_kwargs)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading (example) dimension split over (data, fsdp); the rest whole."""
  return NamedSharding(mesh, logical_spec("batch", *(["length"] * (ndim - 1))))


def batch_tree_shardings(batch, mesh: Mesh):
  """batch_sharding for every array of a batch pytree (scalars replicated)."""
  return jax.tree.map(lambda x: batch_sharding(mesh, x.ndim) if getattr(x, "ndim", 0) else replicated(mesh), batch)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh) -> int:
  """Global batch sizes must be multiples of this (the data x fsdp device count)."""
  return _axis_size(mesh, BATCH_AXES)


def round_to_mesh(n: int, mesh: Mesh) -> int:
  """n rounded up to a multiple of the batch divisor: a micro-batch every data shard gets rows of.

  Used for sizes whose value changes no result, only how rows are grouped (padding rows carry no
  loss tokens): train micro-batches under token_mean aggregation, g_ref and cosine micro-batches,
  sampler micro-batches."""
  d = batch_divisor(mesh)
  return max(d, -(-int(n) // d) * d)


def local_row_unit(mesh: Mesh) -> int:
  """Rows one process holds per row of every batch device it owns: a process's share of a global
  batch must be a multiple of this (its devices along (data, fsdp))."""
  return max(1, batch_divisor(mesh) // jax.process_count())


def put_local_rows(local_batch, mesh: Mesh, rows_per_process: int):
  """Global arrays, leading dim over (data, fsdp), from THIS process's rows: each process hands over
  its own rows (padded with zeros to rows_per_process, the same count on every process), so no
  process holds the others' data. Global row order: process 0's rows, then process 1's, ..."""
  unit = local_row_unit(mesh)
  if rows_per_process % unit:
    raise ShardingError(f"rows_per_process={rows_per_process} is not a multiple of this process's batch devices ({unit})")

  def one(x):
    x = np.asarray(x)
    if x.shape[0] > rows_per_process:
      raise ShardingError(f"{x.shape[0]} local rows do not fit rows_per_process={rows_per_process}")
    x = np.pad(x, [(0, rows_per_process - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
    shape = (rows_per_process * jax.process_count(),) + x.shape[1:]
    return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim), x, shape)
  return jax.tree.map(one, local_batch)


def shard_batch(batch, mesh: Mesh):
  """Places a host-global batch (same on every process) with its leading dim over (data, fsdp)."""
  for leaf in jax.tree.leaves(batch):
    if getattr(leaf, "ndim", 0) and leaf.shape[0] % batch_divisor(mesh):
      raise ShardingError(f"batch dimension {leaf.shape[0]} is not divisible by data*fsdp={batch_divisor(mesh)}")
  return put_global(batch, batch_tree_shardings(batch, mesh))


def put_global(host_tree, shardings):
  """Global arrays from host values that every process holds whole (the same on each).

  Each process hands over only the slices its own devices hold (jax.make_array_from_callback), so
  this works on one process and across hosts alike; device_put of host data onto devices of other
  processes is refused by multi-process JAX.
  """
  def one(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
  return jax.tree.map(one, host_tree, shardings)


def decode_state_shardings(mesh: Mesh, state, head_dim: int | None = None):
  """Sampler state: rows over (data, fsdp); KV caches (B, S, kv_heads, hd) also split kv heads over
  `tensor` when they divide it (matching the k/v projections); step counters replicated."""
  del head_dim  # the cache's head axis is explicit, so whole-head splits need no unit

  def one(leaf):
    shape = tuple(leaf.shape)
    if not shape:
      return replicated(mesh)
    spec = P(BATCH_AXES, None, "tensor") if len(shape) == 4 else P(BATCH_AXES)
    return NamedSharding(mesh, fit_spec(spec, shape, mesh))
  return jax.tree.map(one, state)


def jnp_shape(x) -> tuple[int, ...]:
  return tuple(getattr(x, "shape", ()))
