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
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.tree_paths import path_str
from compassplay_jax.models.weights import abstract_model, build_state, expected_leaves, map_name  # noqa: F401
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
  return map_name(PARAM_MAP, hf_name)


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


def load_params(directory: str | pathlib.Path, cfg: ModelConfig,
                shardings: Callable[[str, tuple[int, ...]], Any] | None = None) -> nnx.State:
  """Reads a safetensors checkpoint into our param state, tensor by tensor.

  `shardings(path, shape)` may return a jax.sharding.Sharding per parameter; each device's slice is
  then read from the memory-mapped file on its own (jax.make_array_from_callback).
  """
  directory = pathlib.Path(directory)
  files = open_checkpoint(directory)
  _, abstract_state, expected = expected_leaves(cfg)
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

  for path, leaf in expected.items():
    hf_name, f, transpose = by_path[path]
    shape = f.shape(hf_name)[::-1] if transpose else f.shape(hf_name)
    if tuple(shape) != tuple(leaf.shape):
      raise CheckpointError(f"{f.path}: tensor {hf_name!r} has shape {tuple(f.shape(hf_name))}, "
                            f"expected {tuple(leaf.shape[::-1] if transpose else leaf.shape)}")

  def read(path, index):  # only `index`'s bytes come off the file (safetensors get_slice)
    hf_name, f, transpose = by_path[path]
    return f.read(hf_name, index, transpose)

  return build_state(abstract_state, cfg, read, shardings)


def save_hf(model_or_state, cfg: ModelConfig, directory: str | pathlib.Path, dtype: str | None = None) -> None:
  """Writes model.safetensors + config.json that transformers' Llama/Qwen2 classes load."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) else model_or_state
  tensors = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(state):
    hf_name, transpose = path_to_hf(path_str(key_path))
    value = leaf.T if transpose else leaf
    tensors[hf_name] = value.astype(dtype) if dtype else value
  write_safetensors(directory / "model.safetensors", tensors, metadata={"format": "pt"})
  hf_config = cfg.to_hf_dict()
  if dtype:
    hf_config["torch_dtype"] = dtype
  (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
