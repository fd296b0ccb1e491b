"""Gradient-alignment cosines r_cos(x_i) = <g_i, g_ref> / (||g_i|| ||g_ref||), over all parameters.

g_i is the gradient of candidate i's token-mean cross-entropy over its solution tokens
(`losses.per_sequence_loss`: loss_mask aligned with tokens, padding never counts); g_ref is a
params-shaped gradient (`reference.reference_gradient`). Two exact methods, selected by `method`:
  "direct": chunked vmap(grad) reduced per chunk (cosines_direct.py; memory chunk_size x P);
  "fused":  one forward + one backward pass with custom-VJP probe ops (cosines_fused.py; memory of
            a training step, no P-sized buffer at all).
A candidate with no loss tokens has g_i = 0: its inner product and squared norm are 0, its cosine is
defined as 0 and `has_loss_tokens` is False for it (no NaN). A zero g_ref likewise gives cosine 0.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from compassplay_jax.rewards.cosines_direct import direct_stats, tree_vdot
from compassplay_jax.rewards.cosines_fused import FusedConfig, fused_stats
from compassplay_jax.rewards.losses import token_counts

METHODS = ("fused", "direct")
# Arguments that `jax.jit` must treat as static (hashable Python values).
COSINE_STATIC_ARGNAMES = ("graphdef", "method", "chunk_size", "norm_mode")


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
                     chunk_size: int | None = 8, norm_mode: str = "auto") -> CosineResult:
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

  Returns:
    CosineResult; a no-loss-token candidate gets cosine 0 and has_loss_tokens False.
  """
  tokens = jnp.asarray(tokens)
  loss_mask = jnp.asarray(loss_mask)
  attention_mask = jnp.ones(tokens.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
  if method == "direct":
    ip, sq = direct_stats(graphdef, params, g_ref, tokens, loss_mask, attention_mask, chunk_size or tokens.shape[0])
  elif method == "fused":
    ip, sq = fused_stats(graphdef, params, g_ref, tokens, loss_mask, attention_mask,
                         FusedConfig(norm_mode=norm_mode, chunk_size=chunk_size))
  else:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  has_loss = token_counts(loss_mask, attention_mask) > 0
  zero = jnp.zeros_like(ip)
  return cosines_from_stats(jnp.where(has_loss, ip, zero), jnp.where(has_loss, sq, zero),
                            tree_vdot(g_ref, g_ref), has_loss)


gradient_cosines_jit = jax.jit(gradient_cosines, static_argnames=COSINE_STATIC_ARGNAMES)
