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
import math
import re
from typing import Any, Callable, Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both data-parallel axes

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


class ShardingError(ValueError):
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


def path_str(key_path) -> str:
  """'layers.0.self_attn.q_proj.kernel' (or '0.mu.layers.0...' inside optimizer state)."""
  from compassplay_jax.models.hf_io import _path_str
  return _path_str(key_path)


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
  """Moves an (unsharded or differently sharded) param tree onto `mesh` by the rules."""
  return jax.device_put(params, tree_shardings(params, mesh, head_dim))


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


def shard_batch(batch, mesh: Mesh):
  """Places a host-global batch (same on every process) with its leading dim over (data, fsdp)."""
  for leaf in jax.tree.leaves(batch):
    if getattr(leaf, "ndim", 0) and leaf.shape[0] % batch_divisor(mesh):
      raise ShardingError(f"batch dimension {leaf.shape[0]} is not divisible by data*fsdp={batch_divisor(mesh)}")
  return jax.device_put(batch, batch_tree_shardings(batch, mesh))


# ---- jitted steps with explicit shardings ---------------------------------------------------------
# Params, gradients, the reference gradient and optimizer moments all follow PARAM_RULES; batches and
# per-example outputs are split over (data, fsdp); scalars are replicated.

def jit_train_step(graphdef, train_cfg, mesh: Mesh, params, opt_state, batch, optimizer=None):
  """rl.train_step.make_train_step with in/out shardings from the rules (params, opt_state donated).

  `params`, `opt_state` and `batch` may be arrays or ShapeDtypeStructs; only shapes and paths are read.
  """
  from compassplay_jax.rl import train_step as train_lib
  head_dim = _head_dim(graphdef, params)
  p_sh = tree_shardings(params, mesh, head_dim)
  o_sh = tree_shardings(opt_state, mesh, head_dim, strict=False)
  repl = replicated(mesh)
  return train_lib.make_train_step(
      graphdef, train_cfg, optimizer=optimizer, donate=True,
      in_shardings=(p_sh, o_sh, batch_tree_shardings(batch, mesh), repl), out_shardings=(p_sh, o_sh, repl))


def jit_reference_gradient(graphdef, mesh: Mesh, params, micro_batch: int = 8):
  """`(params, tokens, loss_mask, attention_mask) -> g_ref`, g_ref stored with the params' shardings."""
  from compassplay_jax.rewards import reference
  p_sh = tree_shardings(params, mesh, _head_dim(graphdef, params))
  fn = lambda p, tokens, loss_mask, attention_mask: reference.reference_gradient(
      graphdef, p, tokens, loss_mask, attention_mask, micro_batch=micro_batch)
  b2 = batch_sharding(mesh, 2)
  return jax.jit(fn, in_shardings=(p_sh, b2, b2, b2), out_shardings=p_sh)


def jit_gradient_cosines(graphdef, mesh: Mesh, params, method: str = "fused", chunk_size: int | None = 8,
                         norm_mode: str = "auto"):
  """`(params, g_ref, tokens, loss_mask, attention_mask) -> CosineResult`, per-example outputs split
  over (data, fsdp). Nothing is donated: the outputs are (N,) vectors, so no input buffer could be
  reused for them, and params / g_ref live on."""
  from compassplay_jax.rewards import cosines
  p_sh = tree_shardings(params, mesh, _head_dim(graphdef, params))
  b1, b2, repl = batch_sharding(mesh, 1), batch_sharding(mesh, 2), replicated(mesh)
  fn = lambda p, g_ref, tokens, loss_mask, attention_mask: cosines.gradient_cosines(
      graphdef, p, g_ref, tokens, loss_mask, attention_mask, method=method, chunk_size=chunk_size,
      norm_mode=norm_mode)
  out = cosines.CosineResult(cosines=b1, inner_products=b1, sq_norms=b1, ref_sq_norm=repl, has_loss_tokens=b1)
  return jax.jit(fn, in_shardings=(p_sh, p_sh, b2, b2, b2), out_shardings=out)


def _head_dim(graphdef, params) -> int | None:
  """head_dim of a split Decoder (for whole-head tensor splits); works on abstract params too."""
  from flax import nnx
  cfg = getattr(nnx.merge(graphdef, params), "config", None)
  return getattr(cfg, "head_dim", None)


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


class ShardedSampler:
  """sampling.decode's prefill and decode, jitted with explicit in/out shardings on `mesh`.

  Same call signatures as `decode.prefill` / `decode.decode` (graphdef first, sampler knobs as
  keywords). One jit per (static knobs, input shapes); the decode state is donated call to call so
  the KV cache is updated in place.
  """

  def __init__(self, mesh: Mesh):
    from compassplay_jax.sampling import decode
    self.mesh = mesh
    self._cache = {}
    # The undecorated functions, so this works even where decode.prefill/decode are swapped for ours.
    self._prefill, self._decode = decode.prefill.__wrapped__, decode.decode.__wrapped__

  def _rows(self, shape):
    return NamedSharding(self.mesh, fit_spec(P(BATCH_AXES), shape, self.mesh))

  def prefill(self, graphdef, params, input_ids, prompt_mask, prompt_index, row_live, key, **static):
    args = (params, input_ids, prompt_mask, prompt_index, row_live, key)
    sig = ("prefill", graphdef, tuple(sorted(static.items())),
           tuple(jnp_shape(x) for x in jax.tree.leaves(args[1:])))
    if sig not in self._cache:
      fn = lambda p, *rest: self._prefill(graphdef, p, *rest, **static)
      p_sh = tree_shardings(params, self.mesh, _head_dim(graphdef, params))
      state = jax.eval_shape(fn, *args)
      in_sh = (p_sh,) + tuple(self._rows(jnp_shape(x)) for x in args[1:5]) + (replicated(self.mesh),)
      self._cache[sig] = jax.jit(fn, in_shardings=in_sh, out_shardings=decode_state_shardings(self.mesh, state))
    return self._cache[sig](*args)

  def decode(self, graphdef, params, state, stop_at, host_done, **static):
    sig = ("decode", graphdef, tuple(sorted(static.items())),
           tuple(jnp_shape(x) for x in jax.tree.leaves((state, host_done))))
    if sig not in self._cache:
      fn = lambda p, st, stop, done: self._decode(graphdef, p, st, stop, done, **static)
      p_sh = tree_shardings(params, self.mesh, _head_dim(graphdef, params))
      s_sh = decode_state_shardings(self.mesh, state)
      in_sh = (p_sh, s_sh, replicated(self.mesh), self._rows(jnp_shape(host_done)))
      self._cache[sig] = jax.jit(fn, in_shardings=in_sh, out_shardings=s_sh, donate_argnums=(1,))
    return self._cache[sig](params, state, stop_at, host_done)


def jnp_shape(x) -> tuple[int, ...]:
  return tuple(getattr(x, "shape", ()))
