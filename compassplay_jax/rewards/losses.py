"""Per-sequence solver loss: token-mean cross-entropy over the solution tokens only.

Masks are aligned with `tokens`: `loss_mask[:, t] = 1` means token t is a target, predicted from
the logits at position t - 1. Position 0 has no predecessor, so `loss_mask[:, 0]` is ignored.
Padding never counts: where `attention_mask` is given, targets with `attention_mask[:, t] = 0` are
dropped as well. A sequence with no counted target gets loss 0 (so its gradient is exactly 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from compassplay_jax.models.ops import DEFAULT_OPS


def target_weights(loss_mask, attention_mask=None) -> jnp.ndarray:
  """(N, T-1) float32 weights of the predicted positions: 1 where tokens[:, 1:] count as targets."""
  w = jnp.asarray(loss_mask)[:, 1:].astype(jnp.float32)
  if attention_mask is not None:
    w = w * (jnp.asarray(attention_mask)[:, 1:] > 0)
  return w


def token_counts(loss_mask, attention_mask=None) -> jnp.ndarray:
  """(N,) number of counted target tokens per sequence; 0 marks a candidate with no loss tokens."""
  return jnp.sum(target_weights(loss_mask, attention_mask), axis=-1)


def masked_token_mean_ce(logits, tokens, weights) -> jnp.ndarray:
  """(N,) token-mean CE of logits[:, :-1] against tokens[:, 1:] under weights (N, T-1); 0 if none."""
  logits = logits[:, :-1].astype(jnp.float32)
  targets = jnp.asarray(tokens)[:, 1:]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  ce = jax.nn.logsumexp(logits, axis=-1) - target_logit
  # Zero weights times a finite CE keep no-target rows at exactly 0 with a zero gradient.
  return jnp.sum(ce * weights, axis=-1) / jnp.maximum(jnp.sum(weights, axis=-1), 1.0)


def per_sequence_loss(graphdef, params, tokens, loss_mask, attention_mask=None, ops=None) -> jnp.ndarray:
  """(N,) token-mean cross-entropy of each (prompt, solution) sequence over its solution tokens.

  Args:
    graphdef, params: `nnx.split(model)`.
    tokens: (N, T) int token ids (prompt then solution, padded).
    loss_mask: (N, T); 1 where token t is a solution token to predict (from t - 1). Prompt and
      padding must be 0; `loss_mask[:, 0]` is ignored.
    attention_mask: (N, T) or None; 1 on real tokens. Padded targets never count.
    ops: the model's `LayerOps` (None: plain math). The fused cosine method passes probe ops.

  Returns:
    (N,) float32 losses. A sequence with no counted target token gets 0 (and a zero gradient).
  """
  model = nnx.merge(graphdef, params)
  logits = model(tokens, attention_mask=attention_mask, ops=DEFAULT_OPS if ops is None else ops)
  return masked_token_mean_ce(logits, tokens, target_weights(loss_mask, attention_mask))
