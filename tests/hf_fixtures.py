"""Tiny random transformers models saved to disk: the independent oracle for parity tests."""
from __future__ import annotations

import pathlib

import numpy as np

ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    # max_position_embeddings is small in these configs so sequences actually exceed it.
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 8,
                 "short_factor": [1.0 + 0.1 * i for i in range(4)], "long_factor": [2.0 + 0.5 * i for i in range(4)]},
}


def tiny_hf_config(model_type: str, *, heads=4, kv_heads=2, tied=False, rope=None, max_pos=64, layers=2,
                   vocab=97, hidden=32, inter=48):
  import transformers
  cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model_type]
  kwargs = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                tie_word_embeddings=tied, rms_norm_eps=1e-6)
  if rope is not None:
    params = dict(rope)
    params.setdefault("rope_theta", 10000.0)
    kwargs["rope_parameters"] = params
  return cls(**kwargs)


def save_tiny_hf_model(tmp_path: pathlib.Path, model_type: str, seed: int = 0, **config_kwargs):
  """Builds a random transformers model from a tiny config, saves it, returns (dir, torch model)."""
  import torch
  import transformers
  torch.manual_seed(seed)
  config = tiny_hf_config(model_type, **config_kwargs)
  cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[model_type]
  model = cls(config).eval()
  with torch.no_grad():  # non-trivial norms and biases, so a mistake in either shows
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.add_(0.1 * torch.randn_like(p))
      if name.endswith("bias"):
        p.normal_(0.0, 0.1)
  directory = tmp_path / f"{model_type}_{seed}"
  model.save_pretrained(directory)
  return directory, model


def left_pad(rows):
  """(ids, mask) of token rows of different lengths, left-padded with 0 to the longest."""
  width = max(map(len, rows))
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for r, row in enumerate(rows):
    ids[r, width - len(row):], mask[r, width - len(row):] = row, 1
  return ids, mask


def left_padded_batch(vocab: int, lengths=(9, 5, 12), seed: int = 0):
  """Random token ids and mask for rows of different lengths, left-padded to the longest."""
  rng = np.random.default_rng(seed)
  return left_pad([rng.integers(1, vocab, n) for n in lengths])


def torch_logits(model, ids, mask):
  """Logits of a transformers model with explicit position ids (0 at each row's first real token)."""
  import torch
  positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.float().numpy()
