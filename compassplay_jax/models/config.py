"""The decoder's configuration, and its conversion from/to Hugging Face `config.json`.

Both model families we serve (Llama: SmolLM2, DeepSeek-Prover-V2; Qwen2: Qwen2.5-Coder) are the same
pre-norm decoder; they differ only in q/k/v biases and defaults, so one dataclass covers both.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from compassplay_jax.core.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")  # attention_kernels.IMPLEMENTATIONS


class ConfigError(UserError, ValueError):
  """A config.json (or equivalent metadata) that we cannot turn into a ModelConfig."""


def _freeze(value):
  """Makes a rope-parameter value hashable (lists become tuples) so the config can be a jit static."""
  if isinstance(value, (list, tuple)):
    return tuple(_freeze(v) for v in value)
  return value


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of a Llama/Qwen2-style decoder. Hashable, so it can be a static jit argument."""
  model_type: str = "llama"
  vocab_size: int = 256
  hidden_size: int = 64
  intermediate_size: int = 128
  num_hidden_layers: int = 2
  num_attention_heads: int = 4
  num_key_value_heads: int = 2
  head_dim: int | None = None
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 2048
  rope_theta: float = 10000.0
  rope_type: str = "default"
  # Extra rope-scaling parameters (factor, beta_fast, long_factor, ...) as sorted (key, value) pairs.
  rope_params: tuple[tuple[str, Any], ...] = ()
  attention_bias: bool = False  # Qwen2 has q/k/v biases; Llama does not (unless the config says so).
  mlp_bias: bool = False
  tie_word_embeddings: bool = False
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype
  remat: bool = False  # recompute each block's activations in the backward pass
  # Memory-bounded attention: > 0 computes full-sequence attention (training, reference gradient,
  # cosines, prefill) in blocks of this many queries, each block's fp32 scores (B, heads, chunk, S)
  # recomputed in the backward pass, so temporaries scale with chunk x S instead of T x S. 0 (or a
  # query length <= chunk, e.g. one decode step) = plain attention. Same results (docs/model.md).
  attention_query_chunk: int = 0
  # Passes without a cache that use the plain ops (train step, g_ref, KL/SOAR log-probs, direct
  # cosines) run the blocks as one lax.scan over stacked weights: one block in the program instead of
  # L, so remat bounds activations to one layer under any scheduler. Same results (docs/model.md).
  scan_layers: bool = False
  # Attention of passes without a KV cache: "auto" (splash on TPU, cuDNN flash attention on a GPU for
  # bf16/fp16 compute, the plain/chunked XLA path otherwise), or "xla" | "cudnn" | "splash" explicitly.
  # Cached passes (sampler prefill, decode) always take the XLA path (models/attention_kernels.py).
  attention_impl: str = "auto"

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ConfigError(f"model_type {self.model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
    if self.rope_type not in SUPPORTED_ROPE_TYPES:
      raise ConfigError(f"rope type {self.rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ConfigError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                        f"num_key_value_heads={self.num_key_value_heads}")
    if self.attention_query_chunk < 0:
      raise ConfigError(f"attention_query_chunk={self.attention_query_chunk} is negative (0 = plain attention)")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ConfigError(f"attention_impl={self.attention_impl!r} is not one of {ATTENTION_IMPLS}")
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

  @property
  def rope(self) -> dict[str, Any]:
    return dict(self.rope_params)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  # ---- Hugging Face config.json ------------------------------------------------------------------

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json", **overrides) -> "ModelConfig":
    """Reads a transformers config dict, classic (rope_theta + rope_scaling) or v5 (rope_parameters)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ConfigError(f"{source}: model_type {model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
      if key not in hf:
        raise ConfigError(f"{source}: missing key {key!r}")
    rope = dict(hf.get("rope_parameters") or {})  # transformers 5 form
    if hf.get("rope_scaling"):  # classic form
      rope.update(hf["rope_scaling"])
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope.pop("type", None)
    if rope_type == "dynamic" and "factor" not in rope:
      raise ConfigError(f"{source}: rope type 'dynamic' needs key 'factor'")
    heads = hf["num_attention_heads"]
    default_bias = model_type == "qwen2"
    kwargs = dict(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rope_theta=float(theta),
        rope_type=rope_type,
        rope_params=tuple(sorted((k, _freeze(v)) for k, v in rope.items() if v is not None)),
        attention_bias=hf.get("attention_bias", default_bias),
        mlp_bias=hf.get("mlp_bias", False),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
    )
    kwargs.update(overrides)
    try:
      return cls(**kwargs)
    except ConfigError as e:
      raise ConfigError(f"{source}: {e}") from None

  @classmethod
  def from_hf_dir(cls, path: str | pathlib.Path, **overrides) -> "ModelConfig":
    config_path = pathlib.Path(path) / "config.json"
    if not config_path.is_file():
      raise ConfigError(f"{config_path}: not found (a Hugging Face checkpoint directory needs config.json)")
    try:
      hf = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
      raise ConfigError(f"{config_path}: not valid JSON ({e})") from None
    return cls.from_hf_dict(hf, source=str(config_path), **overrides)

  def to_hf_dict(self) -> dict[str, Any]:
    """A transformers-5 style config.json dict (rope_parameters), which classic readers also accept."""
    rope = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
    rope.update({k: list(v) if isinstance(v, tuple) else v for k, v in self.rope_params})
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[self.model_type]
    out = {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_hidden_layers,
        "num_attention_heads": self.num_attention_heads,
        "num_key_value_heads": self.num_key_value_heads,
        "head_dim": self.head_dim,
        "rms_norm_eps": self.rms_norm_eps,
        "max_position_embeddings": self.max_position_embeddings,
        "rope_theta": self.rope_theta,
        "rope_parameters": rope,
        "tie_word_embeddings": self.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": self.param_dtype,
    }
    if self.model_type == "llama":
      out["attention_bias"] = self.attention_bias
      out["mlp_bias"] = self.mlp_bias
    return out
