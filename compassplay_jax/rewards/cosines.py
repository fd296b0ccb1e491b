"""Gradient-alignment cosines r_cos(x_i) = <g_i, g_ref> / (||g_i|| ||g_ref||), over all parameters.

g_i is the gradient of candidate i's token-mean cross-entropy over its solution tokens
(`losses.per_sequence_loss`: loss_mask aligned with tokens, padding never counts); g_ref is a
params-shaped gradient (`reference.reference_gradient`). Two exact methods, selected by `method`:
  "direct": chunked vmap(grad) reduced per chunk (cosines_direct.py; memory chunk_size x P);
  "fused":  one forward + one backward pass with custom-VJP probe ops (cosines_fused.py; memory of
            a training step, no P-sized buffer at all).
Either runs over `micro_batch` candidates at a time (strided micro-batches under `lax.map`, the
layout g_ref and the train step use), so activation memory is that of micro_batch rows, not of all
N: each candidate's statistics depend on its own row only, so the grouping changes no result.
A candidate with no loss tokens has g_i = 0: its inner product and squared norm are 0, its cosine is
defined as 0 and `has_loss_tokens` is False for it (no NaN). A zero g_ref likewise gives cosine 0.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from compassplay_jax import microbatch
from compassplay_jax.rewards.cosines_direct import direct_stats, tree_vdot
from compassplay_jax.rewards.cosines_fused import FusedConfig, fused_stats
from compassplay_jax.rewards.losses import token_counts

METHODS = ("fused", "direct")
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
    method: "fused" (default) or "direct" (static).
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
