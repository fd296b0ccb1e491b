"""Packing (prompt, completion) token lists into the padded arrays the train and reward steps take.

Layout (right padding): tokens[b] = prompt + completion + pad. `loss_mask[b, t] = 1` marks completion
tokens, i.e. targets predicted from position t-1. `old_logprobs[b, t]` is the sampler's log-prob of
tokens[b, t] (0 elsewhere). Shapes are rounded up to buckets so a run compiles a few shapes only.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def bucket(n: int, buckets: Sequence[int] = LENGTH_BUCKETS) -> int:
  for b in buckets:
    if n <= b:
      return b
  return int(np.ceil(n / buckets[-1]) * buckets[-1])


@dataclasses.dataclass
class PackedBatch:
  tokens: np.ndarray          # (B, T) int32
  attention_mask: np.ndarray  # (B, T) int32, 1 on real tokens
  loss_mask: np.ndarray       # (B, T) float32, 1 on completion tokens
  old_logprobs: np.ndarray    # (B, T) float32
  num_rows: int               # rows before padding the batch dimension

  def as_dict(self) -> dict[str, np.ndarray]:
    return {"tokens": self.tokens, "attention_mask": self.attention_mask, "loss_mask": self.loss_mask,
            "old_logprobs": self.old_logprobs}


def pack(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
         logprobs: Sequence[Sequence[float]] | None = None, *, row_multiple: int = 1,
         max_len: int | None = None) -> PackedBatch:
  """Right-padded arrays for rows prompt_i + completion_i. Over-long rows keep their prompt's end and
  the completion's start (the completion carries the loss). Padding rows have all-zero masks."""
  if len(prompts) != len(completions):
    raise ValueError(f"pack: {len(prompts)} prompts but {len(completions)} completions")
  rows = []
  for i, (p, c) in enumerate(zip(prompts, completions)):
    p, c = list(p), list(c)
    lp = list(logprobs[i]) if logprobs is not None else [0.0] * len(c)
    if max_len is not None and len(p) + len(c) > max_len:
      c = c[:max(max_len - len(p), max_len // 2)]  # the completion keeps at least half the budget
      lp = lp[:len(c)]
      p = p[len(p) - (max_len - len(c)):]
    rows.append((p, c, lp))
  length = bucket(max(len(p) + len(c) for p, c, _ in rows) if rows else 1)
  n = len(rows)
  b = max(row_multiple, int(np.ceil(max(n, 1) / row_multiple) * row_multiple))
  tokens = np.full((b, length), pad_id, np.int32)
  attention = np.zeros((b, length), np.int32)
  loss = np.zeros((b, length), np.float32)
  old = np.zeros((b, length), np.float32)
  for r, (p, c, lp) in enumerate(rows):
    tokens[r, :len(p) + len(c)] = p + c
    attention[r, :len(p) + len(c)] = 1
    loss[r, len(p):len(p) + len(c)] = 1.0
    old[r, len(p):len(p) + len(lp)] = lp
  return PackedBatch(tokens, attention, loss, old, n)
