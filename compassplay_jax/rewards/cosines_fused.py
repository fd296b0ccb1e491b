"""The fused method: per-example <g_i, g_ref> and ||g_i||^2 from one forward and one backward pass.

Every parametric op of the model (dense, embedding, tied head, RMSNorm scale) is replaced, through
the model's `LayerOps` seam, by a `jax.custom_vjp` "probe" op. Each takes an extra zero input
`probe` of shape (N, 2); its backward rule gets the layer input a (N, T, d_in) and the output
gradient delta (N, T, d_out) of every example, reduces them at once to (||G_i||^2, <G_i, G_ref>)
for the layer's slice of the parameters, and returns that as the probe's cotangent. We
differentiate sum_i L_i with respect to the probes only, so no weight gradient (per-example or
batched) is ever built. Being a custom VJP, the reduction runs inside the backward pass, so it
composes with remat (the block is recomputed, then reduced).

Per-layer formulas, for one example with inputs A (T x d_in), output gradients D (T x d_out):
  dense kernel W:   G = A^T D.  direct: materialise G, ||G||^2, <G, G_ref>;
                    gram: ||G||^2 = sum_ts (a_t.a_s)(d_t.d_s), <G, G_ref> = <A G_ref, D>.
  bias b:           G = sum_t d_t (a vector: ||sum_t d_t||^2, not sum_t ||d_t||^2).
  RMSNorm scale:    G = sum_t d_t * x_hat_t (elementwise).
  embedding E:      ||G||^2 = sum_ts [x_t = x_s](d_t.d_s), <G, G_ref> = sum_t d_t . G_ref[x_t].
  tied head E^T:    a dense layer with a = h, D = dz (logit gradients), plus the cross term
                    2 <G_emb, G_head^T> = 2 sum_t d_t . C_t with C_t = sum_s dz_s[x_t] h_s.
                    C flows from the head's backward rule to the embedding's through a zero
                    "channel" output of the embedding that the head takes as an input.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from compassplay_jax.infra import microbatch
from compassplay_jax.models.decoder import model_config
from compassplay_jax.models.tree_paths import path_str
from compassplay_jax.models.ops import LayerOps
from compassplay_jax.rewards.losses import per_sequence_loss

_F32 = jnp.float32
_LEAF_KINDS = ("kernel", "bias", "scale")
_UNEMBED = "@unembed"  # probe key suffix of a tied head, next to its embedding's probe


@dataclasses.dataclass(frozen=True)
class FusedConfig:
  """Static knobs of the per-layer reductions (hashable: a custom_vjp non-diff argument).

  norm_mode: "direct" materialises each example's G (fewest FLOPs: its cost is exactly the
    weight-gradient matmul of a training step); "gram" uses T x T Grams (memory N T^2 instead of
    chunk d_in d_out, but 2 T^2 (d_in + d_out) extra FLOPs per example); "auto" picks gram for a
    layer only when those extra FLOPs are at most a quarter of its weight-gradient FLOPs,
    i.e. 4 T (d_in + d_out) <= d_in d_out (in practice: a large-vocabulary head at short T).
  chunk_size: examples reduced together in one step (None: all at once). Bounds the transient
    per-layer buffer (chunk x d_in x d_out in direct mode).
  """
  norm_mode: str = "auto"
  chunk_size: int | None = 8

  def __post_init__(self):
    if self.norm_mode not in ("auto", "direct", "gram"):
      raise ValueError(f"norm_mode must be 'auto', 'direct' or 'gram', got {self.norm_mode!r}")

  def use_gram(self, t: int, d_in: int, d_out: int) -> bool:
    if self.norm_mode == "auto":
      return 4 * t * (d_in + d_out) <= d_in * d_out
    return self.norm_mode == "gram"


# ---- chunked per-example reductions ---------------------------------------------------------------

def _chunked(fn, arrays, chunk_size):
  """fn over the leading (example) axis of `arrays`, `chunk_size` examples at a time -> (N, ...).

  Chunks are strided (microbatch.map_rows), so a batch sharded along its first axis stays evenly
  sharded in every chunk. The chunk is the largest divisor of N not above chunk_size, so nothing
  is padded.
  """
  n = arrays[0].shape[0]
  chunk = n if chunk_size is None else max(d for d in range(1, min(int(chunk_size), n) + 1) if n % d == 0)
  return microbatch.map_rows(fn, arrays, chunk)


def _gram_sq(a, d):
  """sum_ts (a_t.a_s)(d_t.d_s) per example, clamped at 0 against round-off."""
  ga = jnp.einsum("nti,nsi->nts", a, a)
  gd = jnp.einsum("nto,nso->nts", d, d)
  return jnp.maximum(jnp.sum(ga * gd, axis=(1, 2)), 0.0)


def _sq_and_ip(g, g_ref):
  """(sum(g * g), sum(g * g_ref)) over all but the leading axis, as ONE variadic reduction.

  g is the chunk's materialised per-example gradient (chunk x d_in x d_out); one reduction with two
  accumulators reads it once. As two ops (a sum of squares and an einsum against g_ref, which XLA
  compiles as a separate dot) each re-read g from memory: 3 N P floats of traffic instead of 2 N P,
  the largest term the fused pass adds to a training step's bytes (docs/rewards.md, "Where the fused
  pass's time goes").
  """
  g_ref = jnp.broadcast_to(g_ref, g.shape)
  dims = tuple(range(1, g.ndim))
  zero = jnp.zeros((), g.dtype)
  return jax.lax.reduce((g * g, g * g_ref), (zero, zero), lambda x, y: (x[0] + y[0], x[1] + y[1]), dims)


def _dense_stats(cfg, a, d, g_kernel, g_bias):
  """(N, 2) [||G_i||^2, <G_i, G_ref>] of a dense layer (kernel + optional bias)."""
  a, d, g_kernel = a.astype(_F32), d.astype(_F32), g_kernel.astype(_F32)
  n, t, d_in = a.shape
  gram = cfg.use_gram(t, d_in, d.shape[-1])

  def kernel_stats(a, d):
    if gram:
      ip = jnp.einsum("nto,nto->n", jnp.einsum("nti,io->nto", a, g_kernel), d)
      return jnp.stack([_gram_sq(a, d), ip], -1)
    g = jnp.einsum("nti,nto->nio", a, d)
    return jnp.stack(_sq_and_ip(g, g_kernel), -1)

  stats = _chunked(kernel_stats, (a, d), cfg.chunk_size)
  if g_bias is not None:
    gb = jnp.sum(d, axis=1)
    stats = stats + jnp.stack([jnp.sum(gb * gb, -1), gb @ g_bias.astype(_F32)], -1)
  return stats


# ---- probe ops --------------------------------------------------------------------------------------

def _zero_cotangent(x):
  """The cotangent of an input we never differentiate (float0 for integer inputs)."""
  if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
    return jnp.zeros(x.shape, jax.dtypes.float0)
  return jnp.zeros_like(x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense_probe(cfg, x, kernel, bias, g_kernel, g_bias, probe):
  del cfg, g_kernel, g_bias, probe
  y = jnp.einsum("...i,io->...o", x, kernel)
  return y if bias is None else y + bias


def _dense_fwd(cfg, x, kernel, bias, g_kernel, g_bias, probe):
  return _dense_probe(cfg, x, kernel, bias, g_kernel, g_bias, probe), (x, kernel, bias, g_kernel, g_bias, probe)


def _dense_bwd(cfg, res, dy):
  x, kernel, bias, g_kernel, g_bias, probe = res
  dx = jnp.einsum("...o,io->...i", dy, kernel).astype(x.dtype)
  stats = _dense_stats(cfg, x, dy, g_kernel, g_bias).astype(probe.dtype)
  zero = lambda v: None if v is None else _zero_cotangent(v)
  return dx, zero(kernel), zero(bias), zero(g_kernel), zero(g_bias), stats


_dense_probe.defvjp(_dense_fwd, _dense_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scale_probe(cfg, x_hat, gamma, g_gamma, probe):
  del cfg, g_gamma, probe
  return x_hat * gamma


def _scale_fwd(cfg, x_hat, gamma, g_gamma, probe):
  return x_hat * gamma, (x_hat, gamma, g_gamma, probe)


def _scale_bwd(cfg, res, dy):
  del cfg
  x_hat, gamma, g_gamma, probe = res
  g = jnp.einsum("ntd,ntd->nd", dy.astype(_F32), x_hat.astype(_F32))
  stats = jnp.stack([jnp.sum(g * g, -1), g @ g_gamma.astype(_F32)], -1).astype(probe.dtype)
  return (dy * gamma).astype(x_hat.dtype), _zero_cotangent(gamma), _zero_cotangent(g_gamma), stats


_scale_probe.defvjp(_scale_fwd, _scale_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _embed_probe(cfg, ids, table, g_table, probe):
  """(rows, channel): the channel is a zero (N, T, d) output whose cotangent is the tied cross term C."""
  del cfg, g_table, probe
  return jnp.take(table, ids, axis=0), jnp.zeros(ids.shape + table.shape[1:], _F32)


def _embed_fwd(cfg, ids, table, g_table, probe):
  return _embed_probe(cfg, ids, table, g_table, probe), (ids, table, g_table, probe)


def _embed_bwd(cfg, res, cotangents):
  ids, table, g_table, probe = res
  d, c = cotangents
  d = d.astype(_F32)

  def stats(ids, d, c):
    same = ids[:, :, None] == ids[:, None, :]
    sq = jnp.sum(jnp.where(same, jnp.einsum("ntd,nsd->nts", d, d), 0.0), axis=(1, 2))
    ip = jnp.einsum("ntd,ntd->n", d, jnp.take(g_table, ids, axis=0).astype(_F32))
    cross = 2.0 * jnp.einsum("ntd,ntd->n", d, c.astype(_F32))
    return jnp.stack([jnp.maximum(sq, 0.0) + cross, ip], -1)

  out = _chunked(stats, (ids, d, c), cfg.chunk_size).astype(probe.dtype)
  return _zero_cotangent(ids), _zero_cotangent(table), _zero_cotangent(g_table), out


_embed_probe.defvjp(_embed_fwd, _embed_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _unembed_probe(cfg, h, table, g_table, probe, channel, ids):
  del cfg, g_table, probe, channel, ids
  return jnp.einsum("...d,vd->...v", h, table)


def _unembed_fwd(cfg, h, table, g_table, probe, channel, ids):
  return _unembed_probe(cfg, h, table, g_table, probe, channel, ids), (h, table, g_table, probe, channel, ids)


def _unembed_bwd(cfg, res, dz):
  h, table, g_table, probe, channel, ids = res
  dh = jnp.einsum("...v,vd->...d", dz, table).astype(h.dtype)
  # The head is a dense layer with kernel table^T: a = h, delta = dz.
  stats = _dense_stats(cfg, h, dz, g_table.T, None).astype(probe.dtype)

  # C_t = sum_s dz_s[x_t] h_s: the head's per-example gradient rows at the input tokens (N T^2 memory).
  picked = jnp.take_along_axis(dz, jnp.broadcast_to(ids[:, None, :], ids.shape[:1] + ids.shape[1:] * 2), axis=2)
  c = jnp.einsum("nst,nsd->ntd", picked.astype(_F32), h.astype(_F32)).astype(channel.dtype)
  return dh, _zero_cotangent(table), _zero_cotangent(g_table), stats, c, _zero_cotangent(ids)


_unembed_probe.defvjp(_unembed_fwd, _unembed_bwd)


class ProbeOps(LayerOps):
  """LayerOps whose backward rules write per-example layer statistics into `probes[key]`."""

  def __init__(self, ref: dict, probes: dict, cfg: FusedConfig):
    self.ref, self.probes, self.cfg = ref, probes, cfg
    self._embedded = {}  # name -> (ids, channel) for a tied head's cross term

  def dense(self, name, x, kernel, bias):
    r = self.ref[name]
    g_bias = None if bias is None else r["bias"]
    return _dense_probe(self.cfg, x, kernel, bias, r["kernel"], g_bias, self.probes[name])

  def scale(self, name, x_hat, gamma):
    return _scale_probe(self.cfg, x_hat, gamma, self.ref[name]["scale"], self.probes[name])

  def embed(self, name, ids, table):
    rows, channel = _embed_probe(self.cfg, ids, table, self.ref[name]["table"], self.probes[name])
    self._embedded[name] = (ids, channel)
    return rows

  def unembed(self, name, h, table):
    ids, channel = self._embedded[name]  # the decoder always embeds before its tied head
    return _unembed_probe(self.cfg, h, table, self.ref[name]["table"], self.probes[name + _UNEMBED], channel, ids)


class _RecordingOps(LayerOps):
  """Plain ops that record which probe keys a forward pass uses."""

  def __init__(self):
    self.keys = []

  def dense(self, name, x, kernel, bias):
    self.keys.append(name)
    return super().dense(name, x, kernel, bias)

  def scale(self, name, x_hat, gamma):
    self.keys.append(name)
    return super().scale(name, x_hat, gamma)

  def embed(self, name, ids, table):
    self.keys.append(name)
    return super().embed(name, ids, table)

  def unembed(self, name, h, table):
    self.keys.append(name + _UNEMBED)
    return super().unembed(name, h, table)


def _probe_keys(graphdef, params, tokens, attention_mask) -> list[str]:
  """The probe keys of one forward pass, found by abstract evaluation (no FLOPs)."""
  rec = _RecordingOps()
  abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
  jax.eval_shape(lambda p, t, m: nnx.merge(graphdef, p)(t, attention_mask=m, ops=rec),
                 jax.tree.map(abstract, params), abstract(tokens), abstract(attention_mask))
  return list(dict.fromkeys(rec.keys))


def reference_by_name(g_ref) -> dict:
  """{op name: {"kernel"|"bias"|"scale"|"table": array}} from a params-shaped g_ref."""
  out = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(g_ref):
    path = path_str(key_path)
    prefix, _, last = path.rpartition(".")
    name, kind = (prefix, last) if last in _LEAF_KINDS else (path, "table")
    out.setdefault(name, {})[kind] = leaf
  return out


def fused_layer_stats(graphdef, params, g_ref, tokens, loss_mask, attention_mask, cfg: FusedConfig = FusedConfig()):
  """{probe key: (N, 2) [||G_i^l||^2 (+ tied cross term), <G_i^l, G_ref^l>]} for every op.

  Keys are op names ("layers.0.mlp.up_proj", "norm", "embed_tokens", and "embed_tokens@unembed" for
  a tied head). Summed over keys they give ||g_i||^2 and <g_i, g_ref> exactly; a tied table's
  cross term is booked under its embedding key. One forward and one backward pass.
  """
  ref = reference_by_name(g_ref)
  keys = _probe_keys(graphdef, params, tokens, attention_mask)
  probes = {k: jnp.zeros((tokens.shape[0], 2), _F32) for k in keys}

  def total_loss(probes, params):
    # The sum of per-example means: each example's delta is the gradient of its own L_i.
    ops = ProbeOps(ref, probes, cfg)
    return jnp.sum(per_sequence_loss(graphdef, params, tokens, loss_mask, attention_mask, ops=ops))

  # flax 0.12.8's nnx.remat raises TraceContextError when the params are not differentiated too,
  # so with remat we also ask for the params' cotangent. The probe ops return zeros for it and the
  # result is dropped, so under jit XLA removes it: no weight gradient is built either way.
  argnums = (0, 1) if _uses_remat(graphdef, params) else 0
  grads = jax.grad(total_loss, argnums=argnums)(probes, params)
  return grads[0] if isinstance(argnums, tuple) else grads


def _uses_remat(graphdef, params) -> bool:
  return bool(model_config(graphdef, params).remat)


def fused_stats(graphdef, params, g_ref, tokens, loss_mask, attention_mask, cfg: FusedConfig = FusedConfig()):
  """(inner_products (N,), sq_norms (N,)) summed over all layers."""
  stats = sum(fused_layer_stats(graphdef, params, g_ref, tokens, loss_mask, attention_mask, cfg).values())
  return stats[:, 1], jnp.maximum(stats[:, 0], 0.0)
