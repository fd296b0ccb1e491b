"""The design card's direct method: per-example gradients by vmap(grad), in chunks, reduced at once.

`jax.lax.map(..., batch_size=chunk_size)` runs `vmap(grad)` over `chunk_size` candidates at a time
and reduces each chunk's gradients to <g_i, g_ref> and ||g_i||^2 before the next chunk starts, so at
most chunk_size x P gradient memory is live. Same FLOPs as a training step; memory chunk_size x P.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from compassplay_jax.rewards.losses import per_sequence_loss


def _leaf_vdot(x, y) -> jnp.ndarray:
  # Row sums first, then their sum: a two-level float32 reduction keeps the round-off of a
  # 10^8-element dot product near 1e-7 relative instead of ~1e-5 for one long accumulation.
  x = x.astype(jnp.float32)
  y = y.astype(jnp.float32)
  if x.ndim < 2:
    return jnp.sum(x * y)
  return jnp.sum(jnp.sum((x * y).reshape(x.shape[0], -1), axis=1))


def tree_vdot(a, b) -> jnp.ndarray:
  """Sum over leaves of <a_leaf, b_leaf>, in float32."""
  terms = [_leaf_vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
  return sum(terms, jnp.zeros((), jnp.float32))


def direct_stats(graphdef, params, g_ref, tokens, loss_mask, attention_mask, chunk_size: int = 8):
  """(inner_products (N,), sq_norms (N,)) of each candidate's full-parameter loss gradient.

  g_i is the gradient of candidate i's token-mean CE over its solution tokens
  (`losses.per_sequence_loss`); a candidate without loss tokens has g_i = 0, so both are 0.
  """
  def one(args):
    tok, lm, am = args
    loss = lambda p: per_sequence_loss(graphdef, p, tok[None], lm[None], am[None])[0]
    g = jax.grad(loss)(params)
    return tree_vdot(g, g_ref), tree_vdot(g, g)

  chunk = max(1, min(int(chunk_size), tokens.shape[0]))
  return jax.lax.map(one, (tokens, loss_mask, attention_mask), batch_size=chunk)
