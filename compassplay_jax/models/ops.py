"""The parametric operations of the decoder, behind one small seam.

Every op that touches a parameter goes through a `LayerOps` object, named by the parameter's module
path (e.g. "layers.3.self_attn.q_proj"). The default ops are plain math. The fused gradient-cosine
reward (compassplay_jax/rewards) passes its own ops whose custom VJPs reduce each layer's
(input, output-gradient) pair to per-example statistics, without touching the model code.
"""
from __future__ import annotations

import jax.numpy as jnp


class LayerOps:
  """Plain math for each kind of parametric op. Subclass and override to instrument a forward pass."""

  def dense(self, name: str, x: jnp.ndarray, kernel: jnp.ndarray, bias: jnp.ndarray | None) -> jnp.ndarray:
    """x (..., d_in) @ kernel (d_in, d_out) [+ bias (d_out,)]."""
    y = jnp.einsum("...i,io->...o", x, kernel)
    return y if bias is None else y + bias

  def embed(self, name: str, ids: jnp.ndarray, table: jnp.ndarray) -> jnp.ndarray:
    """Row lookup: ids (B, T) into table (V, d)."""
    return jnp.take(table, ids, axis=0)

  def unembed(self, name: str, h: jnp.ndarray, table: jnp.ndarray) -> jnp.ndarray:
    """Logits from a tied embedding table (V, d): h (B, T, d) @ table.T."""
    return jnp.einsum("...d,vd->...v", h, table)

  def scale(self, name: str, x_hat: jnp.ndarray, gamma: jnp.ndarray) -> jnp.ndarray:
    """RMSNorm's learned per-channel scale applied to the normalized input."""
    return x_hat * gamma


DEFAULT_OPS = LayerOps()
