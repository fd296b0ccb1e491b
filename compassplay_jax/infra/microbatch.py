"""Micro-batches of a batch's rows, the one layout the train step, g_ref and the cosines share.

"strided" (the default): micro-batch k of K holds rows k, k+K, k+2K, ... Each micro-batch then spans
the whole batch axis, so a batch sharded along its rows stays evenly sharded inside every
micro-batch and nothing is resharded. "contiguous": rows [k·m, (k+1)·m) (veRL's order).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

LAYOUTS = ("strided", "contiguous")


def num_micro(rows: int, size: int) -> int:
  return -(-rows // size)


def split_rows(x, size: int, layout: str = "strided", pad: bool = False):
  """(B, ...) -> (K, size, ...). pad=True zero-pads B up to a multiple of size; else B must be one."""
  b = x.shape[0]
  if layout not in LAYOUTS:
    raise ValueError(f"micro-batch layout {layout!r} is not one of {LAYOUTS}")
  if b % size:
    if not pad:
      raise ValueError(f"batch size {b} is not a multiple of micro_batch_size {size}")
    x = jnp.pad(x, [(0, num_micro(b, size) * size - b)] + [(0, 0)] * (x.ndim - 1))
  k = x.shape[0] // size
  if layout == "contiguous":
    return x.reshape((k, size) + x.shape[1:])
  return jnp.swapaxes(x.reshape((size, k) + x.shape[1:]), 0, 1)


def merge_rows(x, layout: str = "strided"):
  """Inverse of split_rows (without padding): (K, m, ...) -> (K·m, ...)."""
  if layout == "strided":
    x = jnp.swapaxes(x, 0, 1)
  return x.reshape((-1,) + x.shape[2:])


def map_rows(fn, arrays, size: int, pad: bool = False):
  """fn over strided micro-batches of `size` rows of each array -> (B, ...) outputs (any pytree of them).

  Each step slices its micro-batch in place (no transposed copy of the inputs), then the outputs are
  put back in row order. `size` must divide B, unless pad=True: then B is zero-padded up to a multiple
  of it (rows fn must treat as empty) and the padded rows are dropped from the outputs.
  """
  n = arrays[0].shape[0]
  if size >= n:
    return fn(*arrays)
  if n % size:
    if not pad:
      raise ValueError(f"batch size {n} is not a multiple of micro_batch_size {size}")
    rows = num_micro(n, size) * size
    arrays = tuple(jnp.pad(x, [(0, rows - n)] + [(0, 0)] * (x.ndim - 1)) for x in arrays)
  steps = arrays[0].shape[0] // size
  strided = tuple(x.reshape((size, steps) + x.shape[1:]) for x in arrays)
  take = lambda x, j: jax.lax.dynamic_index_in_dim(x, j, axis=1, keepdims=False)
  out = jax.lax.map(lambda j: fn(*(take(x, j) for x in strided)), jnp.arange(steps))
  return jax.tree.map(lambda x: merge_rows(x)[:n], out)
