"""Dotted names of parameter-tree leaves: one spelling for loaders, partition rules and reward probes."""
from __future__ import annotations


def path_str(key_path) -> str:
  """'layers.0.self_attn.q_proj.kernel' for a pytree key path into an nnx.State (or optimizer state:
  '0.mu.layers.0...'); a trailing '.value' (the Variable's field) is dropped."""
  parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path]
  return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)
