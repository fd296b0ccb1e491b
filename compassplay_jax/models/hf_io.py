"""Hugging Face checkpoints <-> our parameter pytree.

The whole mapping is one small table: HF tensor name pattern -> our parameter path, and whether the
tensor is transposed ((out, in) in torch's Linear, (in, out) here). Nothing else is reshaped.
"""
from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import Decoder
from compassplay_jax.models.safetensors_io import CheckpointError, open_checkpoint, write_safetensors

# (HF name regex, our path template, transpose). {i} is the layer index.
PARAM_MAP: tuple[tuple[str, str, bool], ...] = (
    (r"model\.embed_tokens\.weight", "embed_tokens", False),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v|o)_proj\.weight", "layers.{0}.self_attn.{1}_proj.kernel", True),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v|o)_proj\.bias", "layers.{0}.self_attn.{1}_proj.bias", False),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", "layers.{0}.mlp.{1}_proj.kernel", True),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.bias", "layers.{0}.mlp.{1}_proj.bias", False),
    (r"model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight", "layers.{0}.{1}.scale", False),
    (r"model\.norm\.weight", "norm.scale", False),
    (r"lm_head\.weight", "lm_head.kernel", True),
)
# Tensors some checkpoints carry that the model does not use.
_IGNORED = (re.compile(r".*rotary_emb\.inv_freq"),)


def hf_to_path(hf_name: str) -> tuple[str, bool] | None:
  """Our dotted parameter path and the transpose flag for an HF tensor name (None if unknown)."""
  for pattern, template, transpose in PARAM_MAP:
    m = re.fullmatch(pattern, hf_name)
    if m:
      return template.format(*m.groups()), transpose
  return None


def path_to_hf(path: str) -> tuple[str, bool]:
  """Inverse of hf_to_path for our parameter paths."""
  for pattern, template, transpose in PARAM_MAP:
    regex = re.escape(template).replace(r"\{0\}", r"(\d+)").replace(r"\{1\}", r"(\w+?)")
    m = re.fullmatch(regex, path)
    if m:
      hf = pattern
      for group in m.groups():
        hf = re.sub(r"\([^)]*\)", group, hf, count=1)
      return hf.replace("\\.", "."), transpose
  raise KeyError(f"no Hugging Face name for parameter {path!r}")


def _path_str(key_path) -> str:
  """'layers.0.self_attn.q_proj.kernel' for a pytree key path into an nnx.State."""
  parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path]
  return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)


def abstract_model(cfg: ModelConfig):
  """(graphdef, abstract param state) without allocating any weights."""
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  return graphdef, state


def load_params(directory: str | pathlib.Path, cfg: ModelConfig,
                shardings: Callable[[str, tuple[int, ...]], Any] | None = None) -> nnx.State:
  """Reads a safetensors checkpoint into our param state, tensor by tensor.

  `shardings(path, shape)` may return a jax.sharding.Sharding per parameter; each device's slice is
  then read from the memory-mapped file on its own (jax.make_array_from_callback).
  """
  directory = pathlib.Path(directory)
  files = open_checkpoint(directory)
  _, abstract_state = abstract_model(cfg)
  expected = {_path_str(kp): leaf for kp, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)}
  by_path = {}
  for hf_name, f in files.items():
    if any(p.fullmatch(hf_name) for p in _IGNORED):
      continue
    mapped = hf_to_path(hf_name)
    if mapped is None or mapped[0] not in expected:
      if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
        continue  # tied checkpoints may still carry a copy of the embedding
      raise CheckpointError(f"{f.path}: unexpected tensor {hf_name!r} (not part of a {cfg.model_type} model "
                            f"with this config.json)")
    by_path[mapped[0]] = (hf_name, f, mapped[1])
  missing = [p for p in expected if p not in by_path]
  if missing:
    hf_name = path_to_hf(missing[0])[0]
    raise CheckpointError(f"{directory}: missing tensor {hf_name!r}" +
                          (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))

  param_dtype = jnp.dtype(cfg.param_dtype)

  def load_leaf(key_path, leaf):
    path = _path_str(key_path)
    hf_name, f, transpose = by_path[path]
    array = f.get(hf_name)
    if transpose:
      array = array.T
    if tuple(array.shape) != tuple(leaf.shape):
      raise CheckpointError(f"{f.path}: tensor {hf_name!r} has shape {tuple(f.shape(hf_name))}, "
                            f"expected {tuple(leaf.shape[::-1] if transpose else leaf.shape)}")
    sharding = shardings(path, leaf.shape) if shardings is not None else None
    if sharding is None:
      return jnp.asarray(np.asarray(array, dtype=param_dtype))
    return jax.make_array_from_callback(
        leaf.shape, sharding, lambda index: np.asarray(array[index], dtype=param_dtype))

  return jax.tree_util.tree_map_with_path(load_leaf, abstract_state)


def save_hf(model_or_state, cfg: ModelConfig, directory: str | pathlib.Path, dtype: str | None = None) -> None:
  """Writes model.safetensors + config.json that transformers' Llama/Qwen2 classes load."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) else model_or_state
  tensors = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(state):
    hf_name, transpose = path_to_hf(_path_str(key_path))
    value = leaf.T if transpose else leaf
    tensors[hf_name] = value.astype(dtype) if dtype else value
  write_safetensors(directory / "model.safetensors", tensors, metadata={"format": "pt"})
  hf_config = cfg.to_hf_dict()
  if dtype:
    hf_config["torch_dtype"] = dtype
  (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
