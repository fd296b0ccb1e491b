"""Choosing the next token from last-position logits: greedy, temperature, top-k, top-p.

The returned log-prob is always of the chosen token under the full tempered distribution
log_softmax(logits / T), before any top-k/top-p truncation, so the trainer (which recomputes
log-probs with a plain forward) and the sampler agree. Greedy reports log_softmax(logits) (T = 1).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from compassplay_jax.sampling.config import SamplerParams


def step_keys(row_keys: jax.Array, step: jax.Array) -> jax.Array:
  """One key per row for this step: a row's draws depend only on its own key and the step.

  step: a scalar (every row at the same token index) or (B,) (each row's own token index).
  """
  return jax.vmap(jax.random.fold_in, in_axes=(0, None if jnp.ndim(step) == 0 else 0))(row_keys, step)


def _draw(keys: jax.Array, logits: jax.Array) -> jax.Array:
  return jax.vmap(jax.random.categorical)(keys, logits)


def select_tokens(logits: jax.Array, keys: jax.Array, sampler: SamplerParams) -> tuple[jax.Array, jax.Array]:
  """(tokens (B,) int32, log-probs (B,) float32) from logits (B, V) and per-row keys (B, ...)."""
  logits = logits.astype(jnp.float32)
  if sampler.temperature == 0:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits
  else:
    scaled = logits / sampler.temperature
    vocab = scaled.shape[-1]
    top_k = sampler.top_k if 0 < sampler.top_k < vocab else 0
    if top_k or sampler.top_p < 1:
      # Candidates in descending order; a top-k prefilter only when top-k is configured.
      vals, idx = jax.lax.top_k(scaled, top_k or vocab)
      if sampler.top_p < 1:
        probs = jax.nn.softmax(vals, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        vals = jnp.where(mass_before < sampler.top_p, vals, -jnp.inf)
      choice = _draw(keys, vals)
      tokens = jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
    else:
      tokens = _draw(keys, scaled).astype(jnp.int32)
  logz = jax.nn.logsumexp(scaled, axis=-1)
  logprobs = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - logz
  return tokens, logprobs

