"""SOAR's measured reward: how much a copy of the solver improves on held-out problems after it is
trained on a group of proposed tasks (docs/rewards.md, "soar_utility"; docs/paper_settings.md §11).

For one group of candidates, with params the outer (current) policy:
  params' = K inner steps on L_G from params      (L_G: the group's rows, its verified tasks with
                                                   their verified solutions, as SFT rows; each step
                                                   on the whole group or on `batch_rows` of them;
                                                   plain SGD or Adam with a fresh state, `inner_train`)
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
import optax

from compassplay_jax.infra import microbatch
from compassplay_jax.rewards.losses import per_sequence_loss, token_counts
from compassplay_jax.rewards.reference import reference_loss_and_gradient

# Arguments that `jax.jit` must treat as static.
SOAR_STATIC_ARGNAMES = ("graphdef", "steps", "micro_batch", "batch_rows", "optimizer")
# reward.soar_inner_optimizer: "sgd" (p <- p - lr * g) | "adam" (optax.adam(lr), a fresh state per group).
INNER_OPTIMIZERS = ("sgd", "adam")


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


def inner_train(graphdef, params, tokens, loss_mask, attention_mask=None, *, steps: int, learning_rate,
                micro_batch: int = 8, batch_rows: int = 0, optimizer: str = "sgd"):
  """`steps` inner steps from `params` (a new pytree): L over the whole group's rows (batch_rows = 0)
  or over `step_rows` (batch_rows > 0). optimizer "sgd": p <- p - lr * grad L(p); "adam": optax.adam(lr)
  (b1 0.9, b2 0.999, eps 1e-8) from a fresh state, so its first step moves every weight by ~lr whatever
  the gradient's scale (m/sqrt(v) = sign(g) at step 1)."""
  if optimizer not in INNER_OPTIMIZERS:
    raise ValueError(f"inner optimizer {optimizer!r} is not one of {INNER_OPTIMIZERS}")
  tokens, loss_mask = jnp.asarray(tokens), jnp.asarray(loss_mask)
  attention_mask = jnp.ones(tokens.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)

  def grad(k, p):
    rows = (tokens, loss_mask, attention_mask) if not batch_rows else step_rows(
        tokens, loss_mask, attention_mask, k, batch_rows)
    return reference_loss_and_gradient(graphdef, p, *rows, micro_batch)[1]

  if optimizer == "sgd":
    def body(k, p):
      return jax.tree.map(lambda x, gx: (x - learning_rate * gx).astype(x.dtype), p, grad(k, p))
    return jax.lax.fori_loop(0, int(steps), body, params)

  tx = optax.adam(learning_rate)

  def adam_body(k, carry):
    p, state = carry
    g = jax.tree.map(lambda gx, x: gx.astype(x.dtype), grad(k, p), p)
    updates, state = tx.update(g, state, p)
    return jax.tree.map(lambda x, u: (x + u).astype(x.dtype), p, updates), state
  return jax.lax.fori_loop(0, int(steps), adam_body, (params, tx.init(params)))[0]


def inner_sgd(graphdef, params, tokens, loss_mask, attention_mask=None, *, steps: int, learning_rate,
              micro_batch: int = 8, batch_rows: int = 0):
  """`steps` plain SGD steps p <- p - lr * grad L(p) from `params` (inner_train with optimizer "sgd")."""
  return inner_train(graphdef, params, tokens, loss_mask, attention_mask, steps=steps, learning_rate=learning_rate,
                     micro_batch=micro_batch, batch_rows=batch_rows, optimizer="sgd")


def bf16_ulp(x):
  """The spacing of bfloat16 numbers at |x| (8 significant bits: 2^(floor(log2|x|) - 7)), elementwise,
  float32; at 0, the spacing at bfloat16's smallest normal number."""
  a = jnp.maximum(jnp.abs(x.astype(jnp.float32)), jnp.finfo(jnp.bfloat16).tiny)
  _, e = jnp.frexp(a)  # a = m * 2^e, m in [0.5, 1)
  return jnp.ldexp(jnp.ones_like(a), e - 8)


def param_change(before, after) -> dict:
  """How far a SOAR copy moved (scalars, float32): "l2" = ||after - before||_2 over all weights,
  "rms_rel" = RMS(after - before) / RMS(before), "max_ulp" = max |after - before| / bf16_ulp(before)
  over the nonzero weights,
  "bf16_changed" = the fraction of weights whose bfloat16 value differs (what a bf16 decode sees)."""
  f32 = jnp.float32
  pairs = list(zip(jax.tree.leaves(before), jax.tree.leaves(after)))
  n = float(sum(b.size for b, _ in pairs))
  sq_d = sum(jnp.sum(jnp.square(a.astype(f32) - b.astype(f32))) for b, a in pairs)
  sq_b = sum(jnp.sum(jnp.square(b.astype(f32))) for b, _ in pairs)
  # Per-leaf counts in int32 (a leaf < 2^31 weights), summed as float32 (7B totals pass 2^31).
  changed = sum(jnp.sum(b.astype(jnp.bfloat16) != a.astype(jnp.bfloat16), dtype=jnp.int32).astype(f32)
                for b, a in pairs)
  # Weights that are exactly 0 have no meaningful ulp (bf16's spacing at 0 is ~1e-38): left out of max_ulp.
  max_ulp = jnp.max(jnp.stack([jnp.max(jnp.where(b != 0, jnp.abs(a.astype(f32) - b.astype(f32)) / bf16_ulp(b), 0.0))
                               for b, a in pairs]))
  return {"l2": jnp.sqrt(sq_d), "rms_rel": jnp.sqrt(sq_d / jnp.maximum(sq_b, 1e-30)), "max_ulp": max_ulp,
          "bf16_changed": changed / n}


def trained_heldout_loss_and_change(graphdef, params, train_tokens, train_loss_mask, train_attention_mask,
                                    heldout_tokens, heldout_loss_mask, heldout_attention_mask, *, steps: int,
                                    learning_rate, micro_batch: int = 8, batch_rows: int = 0,
                                    optimizer: str = "sgd"):
  """(L_H after `steps` inner steps on the group's rows, param_change(params, trained copy)); the outer
  params stay as they are."""
  trained = inner_train(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, steps=steps,
                        learning_rate=learning_rate, micro_batch=micro_batch, batch_rows=batch_rows,
                        optimizer=optimizer)
  loss = heldout_loss(graphdef, trained, heldout_tokens, heldout_loss_mask, heldout_attention_mask, micro_batch)
  return loss, param_change(params, trained)


def trained_heldout_loss(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, heldout_tokens,
                         heldout_loss_mask, heldout_attention_mask, *, steps: int, learning_rate,
                         micro_batch: int = 8, batch_rows: int = 0, optimizer: str = "sgd"):
  """L_H after `steps` inner steps on the group's rows (the outer params stay as they are)."""
  trained = inner_train(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, steps=steps,
                        learning_rate=learning_rate, micro_batch=micro_batch, batch_rows=batch_rows,
                        optimizer=optimizer)
  return heldout_loss(graphdef, trained, heldout_tokens, heldout_loss_mask, heldout_attention_mask, micro_batch)


def soar_improvement(graphdef, params, train_tokens, train_loss_mask, train_attention_mask, heldout_tokens,
                     heldout_loss_mask, heldout_attention_mask, *, steps: int, learning_rate,
                     micro_batch: int = 8, batch_rows: int = 0, optimizer: str = "sgd") -> dict:
  """{"before", "after", "improvement"}: held-out loss before and after the group's inner training,
  and before - after (one group; the loop computes `before` once and `after` per group)."""
  before = heldout_loss(graphdef, params, heldout_tokens, heldout_loss_mask, heldout_attention_mask, micro_batch)
  after = trained_heldout_loss(graphdef, params, train_tokens, train_loss_mask, train_attention_mask,
                               heldout_tokens, heldout_loss_mask, heldout_attention_mask, steps=steps,
                               learning_rate=learning_rate, micro_batch=micro_batch, batch_rows=batch_rows,
                               optimizer=optimizer)
  return {"before": before, "after": after, "improvement": before - after}


soar_improvement_jit = jax.jit(soar_improvement, static_argnames=SOAR_STATIC_ARGNAMES)


def groups(indices, group_size: int) -> list[list]:
  """`indices` in order, cut into consecutive groups of `group_size` (the last may be smaller)."""
  indices = list(indices)
  return [indices[i:i + group_size] for i in range(0, len(indices), group_size)]
