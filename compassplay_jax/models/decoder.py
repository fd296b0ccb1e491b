"""A Flax NNX causal decoder for the Llama and Qwen2 families.

Parameter names and layouts follow Hugging Face's (`model.layers.N.self_attn.q_proj` ...), with dense
kernels stored as (d_in, d_out) so loading a checkpoint is transposes only (see hf_io.PARAM_MAP).
The model is usable directly (`model(input_ids, attention_mask=mask)` -> logits) and as a pure function
of its parameter pytree through `nnx.split` / `nnx.merge` (see `functional.py`).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from compassplay_jax.models import attention_kernels, layout, rope
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.ops import DEFAULT_OPS, LayerOps

_INIT_STD = 0.02  # transformers' default initializer_range


class KVCache(NamedTuple):
  """One layer's cache: keys and values of shape (B, S, num_kv_heads, head_dim)."""
  k: jnp.ndarray
  v: jnp.ndarray


def _dtype(name: str):
  return jnp.dtype(name)


class Linear(nnx.Module):
  """A dense layer with its kernel in (d_in, d_out) layout."""

  def __init__(self, name: str, d_in: int, d_out: int, use_bias: bool, cfg: ModelConfig, rngs: nnx.Rngs):
    self.name = name
    param_dtype = _dtype(cfg.param_dtype)
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (d_in, d_out), param_dtype) * _INIT_STD)
    self.bias = nnx.Param(jnp.zeros((d_out,), param_dtype)) if use_bias else None

  def __call__(self, x: jnp.ndarray, ops: LayerOps) -> jnp.ndarray:
    bias = None if self.bias is None else self.bias[...].astype(x.dtype)
    return ops.dense(self.name, x, self.kernel[...].astype(x.dtype), bias)


class RMSNorm(nnx.Module):
  """RMSNorm computed in float32 and cast back, as transformers' LlamaRMSNorm does."""

  def __init__(self, name: str, dim: int, cfg: ModelConfig):
    self.name = name
    self.eps = cfg.rms_norm_eps
    self.scale = nnx.Param(jnp.ones((dim,), _dtype(cfg.param_dtype)))

  def __call__(self, x: jnp.ndarray, ops: LayerOps) -> jnp.ndarray:
    x32 = x.astype(jnp.float32)
    x_hat = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return ops.scale(self.name, x_hat.astype(x.dtype), self.scale[...].astype(x.dtype))


class Attention(nnx.Module):
  """Grouped-query attention (any heads/kv-heads ratio; MHA when equal) with RoPE and an optional cache."""

  def __init__(self, name: str, cfg: ModelConfig, rngs: nnx.Rngs):
    d, hd = cfg.hidden_size, cfg.head_dim
    self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
    self.q_proj = Linear(f"{name}.q_proj", d, self.num_heads * hd, cfg.attention_bias, cfg, rngs)
    self.k_proj = Linear(f"{name}.k_proj", d, self.num_kv_heads * hd, cfg.attention_bias, cfg, rngs)
    self.v_proj = Linear(f"{name}.v_proj", d, self.num_kv_heads * hd, cfg.attention_bias, cfg, rngs)
    self.o_proj = Linear(f"{name}.o_proj", self.num_heads * hd, d, False, cfg, rngs)

  def __call__(self, x, cos, sin, allowed, ops, cache: KVCache | None = None, cache_index=None,
               query_chunk: int = 0, attention_impl: str = "xla"):
    """attention_impl "cudnn" / "splash" (passes without a cache; attention_kernels.py): `allowed` is
    then the (B, 1, T) key mask, and the fused kernel replaces `attend` / `chunked_attention`."""
    b, t, _ = x.shape
    kv, hd = self.num_kv_heads, self.head_dim
    groups = self.num_heads // kv
    q = rope.apply_rope(self.q_proj(x, ops).reshape(b, t, self.num_heads, hd), cos, sin)
    k = rope.apply_rope(self.k_proj(x, ops).reshape(b, t, kv, hd), cos, sin)
    v = self.v_proj(x, ops).reshape(b, t, kv, hd)
    new_cache = None
    if cache is not None:
      k_all = write_cache(cache.k, k.astype(cache.k.dtype), cache_index)
      v_all = write_cache(cache.v, v.astype(cache.v.dtype), cache_index)
      new_cache = KVCache(k_all, v_all)
      k, v = k_all.astype(x.dtype), v_all.astype(x.dtype)
      if allowed.shape[-1] < k.shape[1]:  # the mask covers only the first slots: attend to those only
        k, v = k[:, :allowed.shape[-1]], v[:, :allowed.shape[-1]]
    q = q.reshape(b, t, kv, groups, hd)
    if attention_impl != "xla":
      out = attention_kernels.fused_attention(attention_impl, q, k, v, allowed[:, 0, :])
    elif 0 < query_chunk < t:
      out = chunked_attention(q, k, v, allowed, query_chunk)
    else:
      out = attend(q, k, v, allowed)
    return self.o_proj(out.reshape(b, t, self.num_heads * hd), ops), new_cache


def attend(q, k, v, allowed):
  """Plain attention. q (B, T, kv, groups, hd), k/v (B, S, kv, hd), allowed (B|1, T, S) -> (B, T, kv, groups, hd).

  Scores and softmax in float32; a query row with no allowed key gets a uniform softmax over all S
  slots (left-padding rows; their outputs are never used)."""
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32) * (q.shape[-1] ** -0.5)
  scores = jnp.where(allowed[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  return jnp.einsum("bkgts,bskd->btkgd", probs, v)


def chunked_attention(q, k, v, allowed, chunk: int):
  """`attend` in blocks of `chunk` queries (ModelConfig.attention_query_chunk).

  Each query row's softmax is over all S keys in both paths, so results equal `attend`'s (up to
  float summation order). The per-block body is checkpointed: the backward pass recomputes one
  block's (B, heads, chunk, S) scores at a time instead of keeping all T x S of them. T need not be
  a multiple of chunk: the last block is padded with query rows that attend nowhere, then dropped.
  """
  b, t = q.shape[:2]
  n = -(-t // chunk)
  pad = n * chunk - t
  if pad:
    q = jnp.pad(q, [(0, 0), (0, pad)] + [(0, 0)] * (q.ndim - 2))
    allowed = jnp.pad(allowed, [(0, 0), (0, pad), (0, 0)])
  # (n, B, chunk, ...): lax.map runs one block per iteration.
  q_blocks = jnp.moveaxis(q.reshape((b, n, chunk) + q.shape[2:]), 1, 0)
  a_blocks = jnp.moveaxis(allowed.reshape((allowed.shape[0], n, chunk, allowed.shape[-1])), 1, 0)
  body = jax.checkpoint(lambda qa: attend(qa[0], k, v, qa[1]))
  out = jax.lax.map(body, (q_blocks, a_blocks))  # (n, B, chunk, kv, groups, hd)
  out = jnp.moveaxis(out, 0, 1).reshape((b, n * chunk) + out.shape[3:])
  return out[:, :t]


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, name: str, cfg: ModelConfig, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = Linear(f"{name}.gate_proj", d, f, cfg.mlp_bias, cfg, rngs)
    self.up_proj = Linear(f"{name}.up_proj", d, f, cfg.mlp_bias, cfg, rngs)
    self.down_proj = Linear(f"{name}.down_proj", f, d, cfg.mlp_bias, cfg, rngs)

  def __call__(self, x, ops):
    return self.down_proj(jax.nn.silu(self.gate_proj(x, ops)) * self.up_proj(x, ops), ops)


class Block(nnx.Module):
  """Pre-norm decoder layer."""

  def __init__(self, index: int, cfg: ModelConfig, rngs: nnx.Rngs):
    name = f"layers.{index}"
    self.input_layernorm = RMSNorm(f"{name}.input_layernorm", cfg.hidden_size, cfg)
    self.self_attn = Attention(f"{name}.self_attn", cfg, rngs)
    self.post_attention_layernorm = RMSNorm(f"{name}.post_attention_layernorm", cfg.hidden_size, cfg)
    self.mlp = MLP(f"{name}.mlp", cfg, rngs)

  def __call__(self, x, cos, sin, allowed, ops, cache=None, cache_index=None, query_chunk: int = 0,
               attention_impl: str = "xla"):
    attn, new_cache = self.self_attn(self.input_layernorm(x, ops), cos, sin, allowed, ops, cache, cache_index,
                                     query_chunk, attention_impl)
    x = x + attn
    x = x + self.mlp(self.post_attention_layernorm(x, ops), ops)
    return x, new_cache


def write_cache(buf: jnp.ndarray, new: jnp.ndarray, index) -> jnp.ndarray:
  """Writes new (B, T, ...) into buf (B, S, ...) at slot `index`: a scalar (every row at the same
  slot) or a (B,) array (each row at its own slot: continuous batching, sampling/continuous.py)."""
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice(buf, new, (0, index) + (0,) * (buf.ndim - 2))
  return jax.vmap(lambda b, n, i: jax.lax.dynamic_update_slice(b, n, (i,) + (0,) * (b.ndim - 1)))(buf, new, index)


def default_positions(attention_mask: jnp.ndarray) -> jnp.ndarray:
  """Position ids for a left-padded batch: 0 at each row's first real token (as transformers does)."""
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


class Decoder(nnx.Module):
  """The causal LM: embeddings, `num_hidden_layers` blocks, final norm, (tied or untied) head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embed_tokens = nnx.Param(
        jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size), _dtype(cfg.param_dtype)) * _INIT_STD)
    self.layers = nnx.List([Block(i, cfg, rngs) for i in range(cfg.num_hidden_layers)])
    self.norm = RMSNorm("norm", cfg.hidden_size, cfg)
    self.lm_head = None if cfg.tie_word_embeddings else Linear(
        "lm_head", cfg.hidden_size, cfg.vocab_size, False, cfg, rngs)

  def __call__(self, input_ids, attention_mask=None, positions=None, *, ops: LayerOps = DEFAULT_OPS,
               cache: list[KVCache] | None = None, cache_index=None, last_only: bool = False,
               logits_from: int = 0):
    """Logits (B, T, V) in float32, or (logits, new_cache) when `cache` is given.

    Without a cache, `attention_mask` (B, T) marks real tokens (left padding is 0) and attention is
    causal over the T slots. With a cache (a list of per-layer KVCache of length S), the T new tokens
    are written at slots [cache_index, cache_index + T) (cache_index a scalar, or (B,) for a slot per
    row) and `attention_mask` (B, S) marks the valid slots of the whole cache, new ones included;
    slots after a row's query are never attended; a mask of (B, W < S) attends to the first W slots
    only (a decode window: the caller guarantees every row's valid slots lie there). `last_only`
    computes logits for the last slot only; `logits_from` (static) for slots [logits_from, T) only:
    the LM head over a large vocabulary is the biggest activation, and RL losses need it only where
    the completion is.
    """
    input_ids = jnp.asarray(input_ids)
    b, t = input_ids.shape
    dt = _dtype(self.config.dtype)
    if attention_mask is None:
      attention_mask = jnp.ones((b, t if cache is None else cache[0].k.shape[1]), jnp.int32)
    attention_mask = jnp.asarray(attention_mask)
    if positions is None:
      if cache is not None:
        raise ValueError("positions are required when decoding with a cache")
      positions = default_positions(attention_mask)
    # cache_index may be (B,) (each row writes at its own slot); query_slots is then (B, T).
    start = jnp.asarray(0 if cache is None else cache_index)
    query_slots = start[..., None] + jnp.arange(t)
    key_slots = jnp.arange(attention_mask.shape[1])
    # Passes without a cache may run a fused kernel (ModelConfig.attention_impl; attention_kernels.py),
    # which takes the key mask (B, 1, S) instead of the (B, T, S) mask.
    impl = attention_kernels.choose_attention_impl(
        self.config.attention_impl, backend=jax.default_backend(), dtype=dt, head_dim=self.config.head_dim,
        q_len=t, kv_len=attention_mask.shape[1], cached=cache is not None)
    if impl != "xla":
      allowed = attention_mask[:, None, :] > 0
    else:
      causal = key_slots <= query_slots[..., None]
      allowed = (causal if causal.ndim == 3 else causal[None]) & (attention_mask[:, None, :] > 0)

    cos, sin = rope.rope_cos_sin(self.config, positions, dt)
    x = ops.embed("embed_tokens", input_ids, self.embed_tokens[...]).astype(dt)
    if cache is None or t > 1:
      # A pass over whole sequences (train, g_ref, cosines, prefill): its rows over the mesh's batch
      # axes, not the table's hidden split. A decode step (one token a row) is left to the propagation:
      # there the weights stay put and the few activations move (layout.py).
      x = layout.constrain_rows(x)
    new_cache = []
    chunk = self.config.attention_query_chunk  # static: a Python int from the (hashable) config
    # Instrumented ops (the fused cosines) address layers by name: they keep the per-layer loop.
    scanned = self.config.scan_layers and cache is None and type(ops) is LayerOps
    if scanned:
      x = self._scan_blocks(x, cos, sin, allowed, ops, chunk, impl)
    for i, block in enumerate(() if scanned else self.layers):
      layer_cache = None if cache is None else cache[i]
      # remat only matters when differentiating (no cache); inside the sampler's decode while_loop
      # flax's nnx.remat of a block merged outside the loop raises TraceContextError.
      if self.config.remat and cache is None:
        x, layer_new = nnx.remat(
            lambda blk, x_, c_: blk(x_, cos, sin, allowed, ops, c_, cache_index, chunk, impl))(block, x, layer_cache)
      else:
        x, layer_new = block(x, cos, sin, allowed, ops, layer_cache, cache_index, chunk, impl)
      new_cache.append(layer_new)
    if last_only:
      x = x[:, -1:]
    elif logits_from:
      x = x[:, logits_from:]
    h = self.norm(x, ops)
    if self.lm_head is None:
      logits = ops.unembed("embed_tokens", h, self.embed_tokens[...].astype(dt))
    else:
      logits = self.lm_head(h, ops)
    logits = logits.astype(jnp.float32)
    return logits if cache is None else (logits, new_cache)

  def _scan_blocks(self, x, cos, sin, allowed, ops, chunk, impl="xla"):
    """The blocks as one lax.scan over their stacked parameters (ModelConfig.scan_layers).

    The per-layer loop unrolls L copies of a block into the program; a scan holds one, so its
    backward pass recomputes one layer at a time under remat whatever the compiler's scheduler
    does (XLA:CPU hoists the unrolled recomputations and keeps every layer's activations live).
    Parameters are cast to the compute dtype before stacking (the blocks cast them anyway), so the
    stack costs one compute-dtype copy of the block weights. Block names are layer 0's: only the
    plain ops, which ignore names, take this path.
    """
    dt = x.dtype
    graphdef, _ = nnx.split(self.layers[0])
    cast = lambda a: a.astype(dt) if jnp.issubdtype(a.dtype, jnp.floating) else a
    stacked = jax.tree.map(lambda *leaves: jnp.stack([cast(a) for a in leaves]),
                           *[nnx.split(block)[1] for block in self.layers])

    def body(h, state):
      h, _ = nnx.merge(graphdef, state)(h, cos, sin, allowed, ops, None, None, chunk, impl)
      return h, None

    if self.config.remat:
      body = jax.checkpoint(body, prevent_cse=False)  # inside a scan CSE cannot merge the recompute
    return jax.lax.scan(body, x, stacked)[0]

  def init_cache(self, batch_size: int, max_len: int, dtype=None) -> list[KVCache]:
    cfg = self.config
    shape = (batch_size, max_len, cfg.num_key_value_heads, cfg.head_dim)
    dtype = dtype or _dtype(cfg.dtype)
    return [KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_hidden_layers)]


def init_decoder(cfg: ModelConfig, seed: int = 0) -> Decoder:
  """A randomly initialised decoder (tests, the `tiny` configs)."""
  return Decoder(cfg, rngs=nnx.Rngs(params=seed))


def model_config(graphdef, params) -> ModelConfig:
  """The ModelConfig of a split Decoder (`nnx.split(model)`); params may be abstract (ShapeDtypeStructs)."""
  return nnx.merge(graphdef, params).config
