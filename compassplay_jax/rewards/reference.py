"""The reference gradient g_ref: the gradient of the mean solver loss over a reference set.

It is recomputed at the current params on every call, because the reference direction moves with
the solver. Micro-batches bound the activation memory; the gradient is accumulated in a params-shaped
carry, so it has the params' pytree (and, under jit, their sharding when the caller pins
`out_shardings` to the params' shardings).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from compassplay_jax.infra import microbatch
from compassplay_jax.rewards.losses import per_sequence_loss, token_counts

# Arguments that `jax.jit` must treat as static (hashable Python values).
REFERENCE_STATIC_ARGNAMES = ("graphdef", "micro_batch")


def reference_loss_and_gradient(graphdef, params, tokens, loss_mask, attention_mask=None, micro_batch: int = 8):
  """(mean reference loss, g_ref); see `reference_gradient`."""
  tokens = jnp.asarray(tokens)
  loss_mask = jnp.asarray(loss_mask)
  if attention_mask is None:
    attention_mask = jnp.ones(tokens.shape, jnp.int32)
  attention_mask = jnp.asarray(attention_mask)
  micro_batch = max(1, min(int(micro_batch), tokens.shape[0]))
  # Padding rows have no loss tokens, so they add exactly 0 to the loss and the gradient.
  # Strided micro-batches (microbatch.split_rows): each spans the whole (sharded) batch axis.
  xs = tuple(microbatch.split_rows(a, micro_batch, pad=True) for a in (tokens, loss_mask, attention_mask))

  def summed_loss(p, tok, lm, am):
    return jnp.sum(per_sequence_loss(graphdef, p, tok, lm, am))

  def step(carry, batch):
    loss_sum, grad_sum = carry
    loss, grads = jax.value_and_grad(summed_loss)(params, *batch)
    return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  (loss_sum, grad_sum), _ = jax.lax.scan(step, (jnp.zeros((), jnp.float32), zeros), xs)
  # Mean over the sequences that have loss tokens; an all-empty set gives loss 0 and g_ref = 0.
  count = jnp.maximum(jnp.sum(token_counts(loss_mask, attention_mask) > 0), 1).astype(jnp.float32)
  return loss_sum / count, jax.tree.map(lambda g: (g / count).astype(g.dtype), grad_sum)


def reference_gradient(graphdef, params, tokens, loss_mask, attention_mask=None, micro_batch: int = 8):
  """Gradient of the mean per-sequence loss over a reference set, accumulated over micro-batches.

  Args:
    graphdef, params: `nnx.split(model)`; the gradient is taken at these params.
    tokens: (R, T) reference sequences, e.g. 32 problems with gold solutions (prompt + solution).
    loss_mask: (R, T) solution-token mask, aligned with tokens (see `losses.per_sequence_loss`).
    attention_mask: (R, T) or None (all real).
    micro_batch: sequences per forward/backward (static); R need not be a multiple of it.

  Returns:
    A params-shaped pytree: grad of mean_r L_r, where L_r is the token-mean CE of sequence r over
    its solution tokens and the mean runs over the sequences with at least one loss token
    (sequences without any are ignored; if none has one, the result is all zeros).
  """
  return reference_loss_and_gradient(graphdef, params, tokens, loss_mask, attention_mask, micro_batch)[1]


reference_gradient_jit = jax.jit(reference_gradient, static_argnames=REFERENCE_STATIC_ARGNAMES)
