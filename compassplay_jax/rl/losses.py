"""Token-level policy-gradient loss (PPO-clip, token-mean, entropy bonus, k3 KL to a reference).

Alignment convention (shared with the sampler): logits[b, t] predicts tokens[b, t + 1], so the
per-token arrays here (`old_logprobs`, `ref_logprobs`, `loss_mask`, returned log-probs) are indexed
by the *predicted* token: `logprobs[b, t] = log softmax(logits[b, t - 1] / temperature)[tokens[b, t]]`
over the full vocabulary (before any top-p/top-k), and index 0 is unused (always 0, never masked in).
`loss_mask[b, t] = 1` marks completion tokens (generated ones, EOS included).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# veRL's low_var_kl clamps the k3 estimate to this range.
KL_CLAMP = 10.0


def _shifted_log_softmax(logits: jnp.ndarray, temperature: float) -> jnp.ndarray:
  """(B, T, V) log-probs aligned to predicted tokens: row t holds the distribution of token t."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  # Row 0 has no predictor; zeros keep shapes and are masked out everywhere.
  return jnp.concatenate([jnp.zeros_like(logp[:, :1]), logp[:, :-1]], axis=1)


def token_logprobs(logits: jnp.ndarray, tokens: jnp.ndarray, temperature: float = 1.0) -> jnp.ndarray:
  """(B, T) log-prob of tokens[b, t] under logits[b, t - 1] / temperature; column 0 is 0."""
  logp = _shifted_log_softmax(logits, temperature)
  picked = jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked.at[:, 0].set(0.0)


def token_entropy(logits: jnp.ndarray, temperature: float = 1.0) -> jnp.ndarray:
  """(B, T) entropy of the distribution over tokens[b, t] (same alignment); column 0 is 0."""
  logp = _shifted_log_softmax(logits, temperature)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1).at[:, 0].set(0.0)


def masked_mean(values: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
  """Σ values·mask / Σ mask, and 0 for an empty mask."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def policy_gradient_loss(logits, tokens, loss_mask, advantages, old_logprobs, *, clip_eps_low: float = 0.2,
                         clip_eps_high: float = 0.2, entropy_coef: float = 0.0, kl_coef: float = 0.0,
                         ref_logprobs=None, temperature: float = 1.0, old_from_forward=None):
  """PPO-clip policy-gradient loss, token-mean over `loss_mask`, as veRL's compute_policy_loss.

    ρ_t  = exp(logπ_t − logπ_old_t)
    pg   = token_mean(max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high)))
    loss = pg − entropy_coef · token_mean(H_t) + kl_coef · token_mean(k3_t)
    k3_t = exp(logπ_ref_t − logπ_t) − (logπ_ref_t − logπ_t) − 1, clamped to [−10, 10]

  Args:
    logits: (B, T, V) model logits.
    tokens: (B, T) int token ids.
    loss_mask: (B, T) 1 on completion tokens (see the module docstring for alignment).
    advantages: (B,) per-sequence or (B, T) per-token advantages.
    old_logprobs: (B, T) sampler log-probs of `tokens` (same alignment and temperature).
    clip_eps_low, clip_eps_high: PPO clip range [1 − ε_low, 1 + ε_high] (AZR/veRL: 0.2, 0.2).
    entropy_coef: entropy bonus weight (AZR paper branch: 0.001).
    kl_coef: weight of the k3 KL to the reference policy; needs `ref_logprobs` when non-zero.
    ref_logprobs: (B, T) reference-policy log-probs of `tokens`.
    temperature: the sampler's temperature; logits are divided by it.
    old_from_forward: optional (B,) flags; where 1 the row's old log-probs are this forward's own
      (stop_gradient): the first PPO mini-batch of an update with recomputed old log-probs, whose
      params are the old policy's, so its ratio is exactly 1 (veRL recomputes them likewise).

  Returns:
    (loss, metrics) with scalar float32 metrics: pg_loss, entropy, kl, clip_frac, ratio_mean,
    approx_kl (token-mean of ½(logπ − logπ_old)²), num_tokens.
  """
  if kl_coef and ref_logprobs is None:
    raise ValueError("kl_coef is non-zero but ref_logprobs is None")
  mask = loss_mask.astype(jnp.float32)
  logp = token_logprobs(logits, tokens, temperature)
  if old_from_forward is not None:
    old_logprobs = jnp.where(old_from_forward[:, None] > 0, jax.lax.stop_gradient(logp),
                             old_logprobs.astype(jnp.float32))
  adv = advantages.astype(jnp.float32)
  adv = adv[:, None] if adv.ndim == 1 else adv
  # Where the mask is 0 the old log-prob may be garbage (padding); keep everything finite there.
  log_ratio = jnp.where(mask > 0, logp - old_logprobs.astype(jnp.float32), 0.0)
  ratio = jnp.exp(log_ratio)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
  pg_loss = masked_mean(jnp.maximum(unclipped, clipped), mask)
  entropy = masked_mean(token_entropy(logits, temperature), mask)
  loss = pg_loss - entropy_coef * entropy
  kl = jnp.zeros((), jnp.float32)
  if ref_logprobs is not None:
    diff = jnp.where(mask > 0, ref_logprobs.astype(jnp.float32) - logp, 0.0)
    kl = masked_mean(jnp.clip(jnp.exp(diff) - diff - 1.0, -KL_CLAMP, KL_CLAMP), mask)
    loss = loss + kl_coef * kl
  metrics = {
      "pg_loss": pg_loss,
      "entropy": entropy,
      "kl": kl,
      "clip_frac": masked_mean((clipped > unclipped).astype(jnp.float32), mask),
      "ratio_mean": masked_mean(ratio, mask),
      "approx_kl": masked_mean(0.5 * log_ratio ** 2, mask),
      "num_tokens": jnp.sum(mask),
  }
  return loss, metrics
