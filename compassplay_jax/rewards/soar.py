"""SOAR's measured reward: how much a copy of the solver improves on held-out problems after it is
trained on a group of proposed tasks (docs/rewards.md, "soar_utility"; docs/paper_settings.md §11).

For one group of candidates, with params the outer (current) policy:
  params' = K plain SGD steps on L_G from params  (L_G: the group's rows, its verified tasks with
                                                   their verified solutions, as SFT rows; each step
                                                   on the whole group or on `batch_rows` of them)
  improvement = signal(params') - signal(params), the same for every candidate of the group
                                                  (proposer_rewards.soar_utility), with signal
    "accuracy": greedy accuracy on held-out problems (SOAR's reward; decoded and checked by the loop,
                selfplay/soar_measure.py, from the params `inner_sgd` returns), or
    "nll":      minus the held-out gold solutions' NLL, i.e. improvement = L_H(params) - L_H(params').

`L` is the mean per-sequence token cross-entropy of rewards/losses.py (the loss g_ref is the gradient
of) over the rows that have loss tokens, so padding rows (no loss tokens) change nothing and groups
can be padded to one compiled shape.

All functions are pure: params are pytrees and the inner steps build new ones, so the outer params are
never written (nothing is donated).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from compassplay_jax import microbatch
from compassplay_jax.rewards.losses import per_sequence_loss, token_counts
from compassplay_jax.rewards.reference import reference_loss_and_gradient

# Arguments that `jax.jit` must treat as static.
SOAR_STATIC_ARGNAMES = ("graphdef", "steps", "micro_batch", "batch_rows")


def heldout_loss(graphdef, params, tokens, loss_mask, attention_mask=None, micro_batch: int = 8):
  """Mean per-sequence token cross-entropy over the rows with loss tokens (0 if none), forward only,
  `micro_batch` rows at a time (the same mean as reference.reference_loss_and_gradient's loss)."""
  tokens, loss_mask = jnp.asarray(tokens), jnp.asarray(loss_mask)
  attention_mask = jnp.ones(tokens.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
  micro_batch = max(1, min(int(micro_batch), tokens.shape[0]))
  xs = tuple(microbatch.split_rows(a, micro_batch, pad=True) for a in (tokens, loss_mask, attention_mask))
  sums = jax.lax.map(lambda b: jnp.sum(per_sequence_loss(graphdef, params, *b)), xs)
  count = jnp.maximum(jnp.sum(token_counts(loss_mask, attention_mask) > 0), 1).astype(jnp.float32)
  return jnp.sum(sums) / count


def step_rows(tokens, loss_mask, attention_mask, step, batch_rows: int):
  """The `batch_rows` rows inner step `step` trains on: the group's rows with loss tokens, in order,
  `batch_rows` at a time, wrapping around (SOAR: batch 8 of a 64-pair data set, 10 steps). With fewer
  such rows than batch_rows, each is taken once and the rest of the batch has no loss tokens."""
  has = token_counts(loss_mask, attention_mask) > 0
  real = jnp.argsort((~has).astype(jnp.int32), stable=True)  # rows with loss tokens first, in their order
  n = jnp.maximum(jnp.sum(has), 1)
  j = jnp.arange(batch_rows)
  rows = real[(step * batch_rows + j) % n]
  keep = (j < n).astype(loss_mask.dtype)[:, None]
  return tokens[rows], loss_mask[rows] * keep, attention_mask[rows]


def inner_sgd(graphdef, params, tokens, loss_mask, attention_mask=None, *, steps: int, learning_rate,
              micro_batch: int = 8, batch_rows: int = 0):
  """`steps` plain SGD steps p <- p - lr * grad L(p) from `params` (a new pytree): L over the whole
  group's rows (batch_rows = 0) or over `step_rows` (batch_rows > 0)."""
  tokens, loss_mask = jnp.asarray(tokens), jnp.asarray(loss_mask)
  attention_mask = jnp.ones(tokens.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)

  def body(k, p):
    rows = (tokens, loss_mask, attention_mask) if not batch_rows else step_rows(
        tokens, loss_mask, attention_mask, k, batch_rows)
    _, g = reference_loss_and_gradient(graphdef, p, *rows, micro_batch)
    return jax.tree.map(lambda x, gx: (x - learning_rate * gx).astype(x.dtype), p, g)
  return jax.lax.fori_loop(0, int(steps), body, params)


def trained_heldout_loss(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, heldout_tokens,
                         heldout_loss_mask, heldout_attention_mask, *, steps: int, learning_rate,
                         micro_batch: int = 8, batch_rows: int = 0):
  """L_H after `steps` inner SGD steps on the group's rows (the outer params stay as they are)."""
  trained = inner_sgd(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, steps=steps,
                      learning_rate=learning_rate, micro_batch=micro_batch, batch_rows=batch_rows)
  return heldout_loss(graphdef, trained, heldout_tokens, heldout_loss_mask, heldout_attention_mask, micro_batch)


def soar_improvement(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, heldout_tokens,
                     heldout_loss_mask, heldout_attention_mask, *, steps: int, learning_rate,
                     micro_batch: int = 8, batch_rows: int = 0) -> dict:
  """{"before", "after", "improvement"}: held-out loss before and after the group's inner training,
  and before - after (one group; the loop computes `before` once and `after` per group)."""
  before = heldout_loss(graphdef, params, heldout_tokens, heldout_loss_mask, heldout_attention_mask, micro_batch)
  after = trained_heldout_loss(graphdef, params, train_tokens, train_loss_mask, train_attention_mask,
                               heldout_tokens, heldout_loss_mask, heldout_attention_mask, steps=steps,
                               learning_rate=learning_rate, micro_batch=micro_batch, batch_rows=batch_rows)
  return {"before": before, "after": after, "improvement": before - after}


soar_improvement_jit = jax.jit(soar_improvement, static_argnames=SOAR_STATIC_ARGNAMES)


def groups(indices, group_size: int) -> list[list]:
  """`indices` in order, cut into consecutive groups of `group_size` (the last may be smaller)."""
  indices = list(indices)
  return [indices[i:i + group_size] for i in range(0, len(indices), group_size)]
