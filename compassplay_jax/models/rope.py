"""Rotary position embeddings in Hugging Face's rotate-half layout, with every rope-scaling type that
transformers' Llama and Qwen2 accept (default, linear, dynamic, yarn, llama3, longrope).

Frequencies that depend only on the config are computed once in numpy (float32, as transformers does);
the two types whose frequencies depend on the current sequence length (dynamic NTK and longrope) pick
theirs inside the traced graph from max(position)+1, so one compiled function serves every length.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from compassplay_jax.models.config import ConfigError, ModelConfig


def _base_exponents(dim: int) -> np.ndarray:
  return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim


def _default_inv_freq(base: float, dim: int) -> np.ndarray:
  return (1.0 / (np.float32(base) ** _base_exponents(dim))).astype(np.float32)


def _need(cfg: ModelConfig, key: str):
  if key not in cfg.rope:
    raise ConfigError(f"rope type {cfg.rope_type!r} needs rope parameter {key!r}")
  return cfg.rope[key]


def _yarn(cfg: ModelConfig, dim: int) -> tuple[np.ndarray, float]:
  p = cfg.rope
  base = cfg.rope_theta
  original_max = p.get("original_max_position_embeddings", cfg.max_position_embeddings)
  factor = p.get("factor") or cfg.max_position_embeddings / original_max

  def get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

  attention_factor = p.get("attention_factor")
  if attention_factor is None:
    if p.get("mscale") and p.get("mscale_all_dim"):
      attention_factor = float(get_mscale(factor, p["mscale"]) / get_mscale(factor, p["mscale_all_dim"]))
    else:
      attention_factor = get_mscale(factor)
  beta_fast = p.get("beta_fast") or 32
  beta_slow = p.get("beta_slow") or 1

  def correction_dim(rotations):
    return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if p.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # as transformers: avoid a zero-width ramp
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
  pos_freqs = np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / dim)
  extrapolation = 1.0 / pos_freqs
  interpolation = 1.0 / (np.float32(factor) * pos_freqs)
  extrapolation_weight = 1 - ramp
  inv = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
  return inv.astype(np.float32), float(attention_factor)


def _llama3(cfg: ModelConfig, dim: int) -> np.ndarray:
  inv = _default_inv_freq(cfg.rope_theta, dim)
  factor = _need(cfg, "factor")
  low_factor = _need(cfg, "low_freq_factor")
  high_factor = _need(cfg, "high_freq_factor")
  old_len = cfg.rope.get("original_max_position_embeddings", cfg.max_position_embeddings)
  low_wavelen, high_wavelen = old_len / low_factor, old_len / high_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
  smooth = (old_len / wavelen - low_factor) / (high_factor - low_factor)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def _longrope_attention_factor(cfg: ModelConfig) -> float:
  p = cfg.rope
  original_max = p.get("original_max_position_embeddings", cfg.max_position_embeddings)
  factor = p.get("factor") or cfg.max_position_embeddings / original_max
  if p.get("attention_factor") is not None:
    return float(p["attention_factor"])
  if factor <= 1.0:
    return 1.0
  return math.sqrt(1 + math.log(factor) / math.log(original_max))


def static_rope_tables(cfg: ModelConfig) -> tuple[np.ndarray, float]:
  """(inv_freq, attention_factor) for rope types whose frequencies do not depend on the length."""
  dim = cfg.head_dim
  kind = cfg.rope_type
  if kind in ("default", "dynamic"):
    return _default_inv_freq(cfg.rope_theta, dim), 1.0
  if kind == "linear":
    return (_default_inv_freq(cfg.rope_theta, dim) / np.float32(_need(cfg, "factor"))).astype(np.float32), 1.0
  if kind == "yarn":
    return _yarn(cfg, dim)
  if kind == "llama3":
    return _llama3(cfg, dim), 1.0
  if kind == "longrope":
    short = np.asarray(_need(cfg, "short_factor"), np.float32)
    return (1.0 / (short * np.float32(cfg.rope_theta) ** _base_exponents(dim))).astype(np.float32), \
        _longrope_attention_factor(cfg)
  raise ConfigError(f"unknown rope type {kind!r}")


def inv_freq_for_positions(cfg: ModelConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, float]:
  """Frequencies for a batch of positions (B, T). For dynamic/longrope the choice depends on
  seq_len = max(positions) + 1, exactly as transformers' `dynamic_rope_update` decides it."""
  inv, attention_factor = static_rope_tables(cfg)
  inv = jnp.asarray(inv)
  if cfg.rope_type not in ("dynamic", "longrope"):
    return inv, attention_factor
  seq_len = jnp.max(positions).astype(jnp.float32) + 1.0
  dim = cfg.head_dim
  if cfg.rope_type == "dynamic":
    max_pos = float(cfg.max_position_embeddings)
    factor = float(_need(cfg, "factor"))
    grown = jnp.maximum(seq_len, max_pos)
    base = cfg.rope_theta * ((factor * grown / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    dynamic = 1.0 / (base ** jnp.asarray(_base_exponents(dim)))
    return jnp.where(seq_len > max_pos, dynamic, inv), attention_factor
  original_max = cfg.rope.get("original_max_position_embeddings", cfg.max_position_embeddings)
  long = np.asarray(_need(cfg, "long_factor"), np.float32)
  long_inv = jnp.asarray(1.0 / (long * np.float32(cfg.rope_theta) ** _base_exponents(dim)))
  return jnp.where(seq_len > original_max, long_inv, inv), attention_factor


def rope_cos_sin(cfg: ModelConfig, positions: jnp.ndarray, dtype) -> tuple[jnp.ndarray, jnp.ndarray]:
  """cos and sin of shape (B, T, head_dim) in transformers' layout (frequencies repeated twice)."""
  inv, attention_factor = inv_freq_for_positions(cfg, positions)
  freqs = positions.astype(jnp.float32)[..., None] * inv.astype(jnp.float32)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return (jnp.cos(emb) * attention_factor).astype(dtype), (jnp.sin(emb) * attention_factor).astype(dtype)


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
  """x: (B, T, H, D); cos/sin: (B, T, D). Rotate-half convention (not interleaved)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]
