"""Packing (prompt, completion) token lists into the padded arrays the train and reward steps take.

Two layouts:
  * full (rewards): tokens[b] = prompt + completion + right padding; loss_mask and old_logprobs are
    (B, T), with loss_mask[b, t] = 1 where token t is a completion token.
  * completion window (policy update): prompts are left-padded so every completion starts at the
    same column P; tokens (B, P + C). loss_mask and old_logprobs cover only the last C + 1 columns
    (column 0 of the window, the last prompt token, predicts the first completion token and is never
    a target), so the train step computes LM-head logits for C + 1 positions instead of P + C.
`old_logprobs[., t]` is the sampler's log-prob of the token in that column. Lengths are rounded up
to buckets so a run compiles a few shapes only.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

LENGTH_BUCKETS = (32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


def bucket(n: int, buckets: Sequence[int] = LENGTH_BUCKETS) -> int:
  for b in buckets:
    if n <= b:
      return b
  return int(np.ceil(n / buckets[-1]) * buckets[-1])


@dataclasses.dataclass
class PackedBatch:
  tokens: np.ndarray          # (B, T) int32
  attention_mask: np.ndarray  # (B, T) int32, 1 on real tokens
  loss_mask: np.ndarray       # (B, T) or (B, C + 1) float32, 1 on completion tokens
  old_logprobs: np.ndarray    # same shape as loss_mask, float32
  num_rows: int               # rows before padding the batch dimension

  def as_dict(self) -> dict[str, np.ndarray]:
    return {"tokens": self.tokens, "attention_mask": self.attention_mask, "loss_mask": self.loss_mask,
            "old_logprobs": self.old_logprobs}


def _truncate(p, c, lp, m, max_len):
  """Over-long rows keep the prompt's end and the completion's start (the completion carries the
  loss, and keeps at least half the budget)."""
  if max_len is None or len(p) + len(c) <= max_len:
    return p, c, lp, m
  c = c[:max(max_len - len(p), max_len // 2)]
  return p[len(p) - (max_len - len(c)):], c, lp[:len(c)], m[:len(c)]


def pack(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
         logprobs: Sequence[Sequence[float]] | None = None, *, row_multiple: int = 1,
         max_len: int | None = None, completion_window: bool = False,
         completion_masks: Sequence[Sequence[float]] | None = None) -> PackedBatch:
  """Padded arrays for rows prompt_i + completion_i (layouts in the module docstring). Padding rows
  have all-zero masks. `completion_masks[i]` (default all ones) marks which completion tokens are
  targets: 0 for tokens the model did not sample (e.g. a scaffold inserted between two segments)."""
  if len(prompts) != len(completions):
    raise ValueError(f"pack: {len(prompts)} prompts but {len(completions)} completions")
  rows = []
  for i, (p, c) in enumerate(zip(prompts, completions)):
    lp = list(logprobs[i]) if logprobs is not None else [0.0] * len(c)
    m = list(completion_masks[i]) if completion_masks is not None else [1.0] * len(c)
    rows.append(_truncate(list(p), list(c), lp, m, max_len))
  n = len(rows)
  b = max(row_multiple, int(np.ceil(max(n, 1) / row_multiple) * row_multiple))
  if completion_window:
    prompt_len = bucket(max((len(p) for p, _, _, _ in rows), default=1))
    window = bucket(max((len(c) for _, c, _, _ in rows), default=1)) + 1
    length = prompt_len + window - 1
  else:
    length = bucket(max((len(p) + len(c) for p, c, _, _ in rows), default=1))
    window = length
  tokens = np.full((b, length), pad_id, np.int32)
  attention = np.zeros((b, length), np.int32)
  loss = np.zeros((b, window), np.float32)
  old = np.zeros((b, window), np.float32)
  for r, (p, c, lp, m) in enumerate(rows):
    start = prompt_len - len(p) if completion_window else 0  # column of the first prompt token
    end = start + len(p) + len(c)
    tokens[r, start:end] = p + c
    attention[r, start:end] = 1
    first = start + len(p) - (length - window)  # the first completion token, in window columns
    loss[r, first:first + len(c)] = m
    old[r, first:first + len(lp)] = lp
  return PackedBatch(tokens, attention, loss, old, n)
