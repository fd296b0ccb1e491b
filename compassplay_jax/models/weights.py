"""What the Hugging Face and GGUF loaders share: name tables, the expected leaves, and placing each leaf.

A loader maps its file's tensor names to our parameter paths with a (regex, path template, transpose)
table, checks every expected leaf is present, and gives `build_state` a `read(path, index)` for each
leaf. A leaf with a sharding is assembled from per-device reads (jax.make_array_from_callback), so a
device's slice is all that is ever read for it.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import Decoder
from compassplay_jax.models.tree_paths import path_str

NameTable = Sequence[tuple[str, str, bool]]  # (file tensor name regex, our path template, transpose)
Shardings = Callable[[str, tuple[int, ...]], Any]


def map_name(table: NameTable, name: str) -> tuple[str, bool] | None:
  """(our dotted path, transpose) for a file's tensor name, or None when the table has no entry."""
  for pattern, template, transpose in table:
    m = re.fullmatch(pattern, name)
    if m:
      return template.format(*m.groups()), transpose
  return None


def abstract_model(cfg: ModelConfig):
  """(graphdef, abstract param state) without allocating any weights."""
  return nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))


def expected_leaves(cfg: ModelConfig) -> tuple[Any, Any, dict[str, Any]]:
  """(graphdef, abstract state, {path: abstract leaf}) of the model `cfg` describes."""
  graphdef, state = abstract_model(cfg)
  return graphdef, state, {path_str(kp): leaf for kp, leaf in jax.tree_util.tree_leaves_with_path(state)}


def build_state(abstract_state, cfg: ModelConfig, read: Callable[[str, tuple], Any], shardings: Shardings | None):
  """The param state with leaf `path` = read(path, index) cast to cfg.param_dtype.

  index is a tuple of slices (a device's part) or () for the whole leaf (no sharding given)."""
  dtype = jnp.dtype(cfg.param_dtype)

  def one(key_path, leaf):
    path = path_str(key_path)
    sharding = shardings(path, leaf.shape) if shardings is not None else None
    if sharding is None:
      return jnp.asarray(np.asarray(read(path, ()), dtype=dtype))
    return jax.make_array_from_callback(leaf.shape, sharding, lambda index: np.asarray(read(path, index), dtype))

  return jax.tree_util.tree_map_with_path(one, abstract_state)
