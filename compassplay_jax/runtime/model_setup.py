"""The policy a config names: (model, tokenizer) placed on a mesh, and params from a training checkpoint.

Shared by the training run (selfplay/run.py) and checkpoint evaluation (cli/evaluate.py).
"""
from __future__ import annotations

import pathlib

from flax import nnx

from compassplay_jax.infra.checkpoint import CheckpointManager
from compassplay_jax.models.config import ConfigError
from compassplay_jax.rl.train_step import TrainConfig, init_train_state


def build_model(config, mesh=None):
  """(model, tokenizer) for config.model: a HF directory or Hub id, a .gguf file, "smollm2-135m", or "tiny".

  With a multi-device mesh, a Hugging Face checkpoint is read straight into its sharded layout (each
  device's slice from the file); other sources are loaded, then placed by the partition rules.
  """
  from compassplay_jax.models.loading import load_model
  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.models.hub import resolve_checkpoint
  m = config.model
  if mesh is not None and mesh.size > 1:
    m.path = str(resolve_checkpoint(m.path))  # a Hub id -> its snapshot directory (process 0 downloads)
    model, tokenizer = build_model(config) if not pathlib.Path(m.path).is_dir() else (None, None)
    if model is None:
      from compassplay_jax.models.config import ModelConfig
      head_dim = ModelConfig.from_hf_dir(m.path).head_dim
      model, tokenizer = load_model(m.path, dtype=m.dtype, param_dtype=m.param_dtype,
                                    shardings=sh.loader_shardings(mesh, head_dim))
    else:
      graphdef, params = nnx.split(model)
      model = nnx.merge(graphdef, sh.shard_params(params, mesh, model.config.head_dim))
    _apply_model_knobs(model, m)
    return model, tokenizer
  if not m.path:
    raise ConfigError("config.model.path: empty; set it to a Hugging Face Hub id or checkpoint directory "
                      "(e.g. --config.model.path=Qwen/Qwen2.5-Coder-7B)")
  if m.path == "tiny":
    from compassplay_jax.models.config import ModelConfig
    from compassplay_jax.models.decoder import init_decoder
    from compassplay_jax.models.gguf_io import embedded_gguf_path, load_gguf_tokenizer
    tokenizer = load_gguf_tokenizer(embedded_gguf_path())
    cfg = ModelConfig(model_type="llama", vocab_size=len(tokenizer), hidden_size=m.tiny_hidden_size,
                      intermediate_size=2 * m.tiny_hidden_size, num_hidden_layers=m.tiny_layers,
                      num_attention_heads=m.tiny_heads, num_key_value_heads=m.tiny_kv_heads, tie_word_embeddings=True,
                      dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat,
                      attention_query_chunk=m.attention_query_chunk, scan_layers=m.scan_layers,
                      attention_impl=m.attention_impl)
    return init_decoder(cfg, seed=config.seed), tokenizer
  model, tokenizer = load_model(m.path, dtype=m.dtype, param_dtype=m.param_dtype)
  _apply_model_knobs(model, m)
  return model, tokenizer


def _apply_model_knobs(model, m) -> None:
  """config.model's compute knobs that a checkpoint's config.json does not carry (remat, the
  attention query chunk, scanned layers, the attention kernel); the decoder reads them from its config
  at call time."""
  changes = {"attention_impl": m.attention_impl} if m.get("attention_impl", "auto") != "auto" else {}
  if m.remat:
    changes["remat"] = True
  if m.attention_query_chunk:
    changes["attention_query_chunk"] = int(m.attention_query_chunk)
  if m.scan_layers:
    changes["scan_layers"] = True
  if changes:
    model.config = model.config.replace(**changes)


def restore_params(checkpoint_dir, step: int, params):
  """The params of a training checkpoint (optimizer state not needed), restored into `params`' layout."""
  tcfg = TrainConfig()
  params, opt_state = init_train_state(params, tcfg)
  with CheckpointManager(checkpoint_dir, read_only=True) as manager:  # the run may still be writing
    _, restored, _, _, _ = manager.restore(step=step, params=params, opt_state=opt_state)
  return restored
