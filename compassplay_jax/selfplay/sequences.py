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

`pack_by_length` packs the policy update's rows by their real length instead: longest first, each
micro-batch takes its first row's completion bucket and its rows' widest prompt bucket over the
coarser TRAIN_BUCKETS, and the power-of-two row count that fits a token budget, so a short solver row
is not padded to a long proposer row, and only the last micro-batch of an update is short of rows. Shapes
come from bucket pairs and power-of-two row counts, reused across steps (a forward/backward compile
costs as much as several passes, so shapes are kept few on purpose).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from compassplay_jax.sampling import batching

LENGTH_BUCKETS = (32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
# 192: prompts of 129-192 tokens (the demo's compact prompts are 139-166) padded to 256 cost the demo's
# update and cosine passes ~30% more tokens and twice the passes (docs/demo.md, "Update buckets").
TRAIN_BUCKETS = (32, 64, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16384)


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


def trained_tokens(prompt: Sequence[int], completion: Sequence[int], completion_mask: Sequence[float],
                   max_len: int | None) -> float:
  """The completion tokens a row trains on once packed (its mask after truncation to max_len)."""
  _, c, _, m = _truncate(list(prompt), list(completion), [0.0] * len(completion), list(completion_mask), max_len)
  return float(np.sum(m[:len(c)]))


def truncated_lengths(prompt_len: int, completion_len: int, max_len: int | None) -> tuple[int, int]:
  """(prompt, completion) lengths of a row after `_truncate`."""
  if max_len is None or prompt_len + completion_len <= max_len:
    return prompt_len, completion_len
  c = min(completion_len, max(max_len - prompt_len, max_len // 2))
  return max_len - c, c


def packed_shape(lengths: Sequence[tuple[int, int]], *, max_len: int | None = None, completion_window: bool = False,
                 buckets: Sequence[int] = LENGTH_BUCKETS) -> tuple[int, ...]:
  """The column shape `pack` gives rows of these (prompt, completion) lengths: (length,) for the full
  layout, (prompt columns, window) for the completion window. Across processes each packs only its
  own rows, at the shape of everyone's (`pack(..., shape=)`)."""
  rows = [truncated_lengths(p, c, max_len) for p, c in lengths]
  if completion_window:
    return (bucket(max((p for p, _ in rows), default=1), buckets),
            bucket(max((c for _, c in rows), default=1), buckets) + 1)
  return (bucket(max((p + c for p, c in rows), default=1), buckets),)


def pack(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
         logprobs: Sequence[Sequence[float]] | None = None, *, row_multiple: int = 1,
         max_len: int | None = None, completion_window: bool = False,
         completion_masks: Sequence[Sequence[float]] | None = None,
         buckets: Sequence[int] = LENGTH_BUCKETS, shape: tuple[int, ...] | None = None) -> PackedBatch:
  """Padded arrays for rows prompt_i + completion_i (layouts in the module docstring). Padding rows
  have all-zero masks. `completion_masks[i]` (default all ones) marks which completion tokens are
  targets: 0 for tokens the model did not sample (e.g. a scaffold inserted between two segments).
  shape: the column shape to pad to (packed_shape of a larger set of rows); default these rows' own."""
  if len(prompts) != len(completions):
    raise ValueError(f"pack: {len(prompts)} prompts but {len(completions)} completions")
  rows = []
  for i, (p, c) in enumerate(zip(prompts, completions)):
    lp = list(logprobs[i]) if logprobs is not None else [0.0] * len(c)
    m = list(completion_masks[i]) if completion_masks is not None else [1.0] * len(c)
    rows.append(_truncate(list(p), list(c), lp, m, max_len))
  n = len(rows)
  b = max(row_multiple, int(np.ceil(max(n, 1) / row_multiple) * row_multiple))
  shape = shape or packed_shape([(len(p), len(c)) for p, c, _, _ in rows], completion_window=completion_window,
                                 buckets=buckets)
  if completion_window:
    prompt_len, window = shape
    length = prompt_len + window - 1
  else:
    length = window = shape[0]
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


def length_groups(lengths: Sequence[tuple[int, int]], token_budget: int, *, max_len: int | None = None,
                  buckets: Sequence[int] = TRAIN_BUCKETS) -> list[tuple[list[int], int, tuple[int, int]]]:
  """pack_by_length's micro-batches from the rows' (prompt, completion) lengths alone: (row indices, rows
  of the micro-batch, its (prompt columns, completion columns)) each, in pack_by_length's order.

  Rows go longest first (completion bucket, then prompt bucket): a micro-batch takes the next rows, as
  many as the largest power of two whose (rows x (widest prompt bucket + the first row's completion
  bucket)) fits token_budget (at least one), so its shape is a bucket pair and a power of two; the last
  one holds the smallest power of two that fits the rows left. Each micro-batch is (rows, prompt +
  completion columns) tokens: experiments/step_time.py prices a packed update with it.
  """
  if token_budget <= 0:
    raise ValueError(f"pack_by_length: token_budget must be positive, got {token_budget}")
  bucketed = []
  for p, c in lengths:
    p, c = truncated_lengths(p, c, max_len)
    bucketed.append((bucket(p, buckets), bucket(max(c, 1), buckets)))
  order = sorted(range(len(lengths)), key=lambda i: (-bucketed[i][1], -bucketed[i][0], i))
  out, start = [], 0
  while start < len(order):
    completion_len = bucketed[order[start]][1]  # the longest left
    rows = batching.pow2_at_most(token_budget // (bucketed[order[start]][0] + completion_len))
    while True:  # the most rows whose widest prompt still fits the budget (at least one)
      prompt_len = max(bucketed[i][0] for i in order[start:start + rows])
      if rows == 1 or rows * (prompt_len + completion_len) <= token_budget:
        break
      rows //= 2
    chunk = order[start:start + rows]
    out.append((chunk, min(rows, batching.pow2_at_least(len(chunk))), (prompt_len, completion_len)))
    start += len(chunk)
  return out


def pack_by_length(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
                   logprobs: Sequence[Sequence[float]], completion_masks: Sequence[Sequence[float]], *,
                   token_budget: int, max_len: int | None = None,
                   buckets: Sequence[int] = TRAIN_BUCKETS) -> list[tuple[list[int], PackedBatch]]:
  """Completion-window micro-batches of rows of similar lengths, longest first (length_groups: a
  micro-batch's shape is a bucket pair and a power-of-two row count).

  Returns (row indices, PackedBatch) pairs covering every row once.
  """
  if not len(prompts) == len(completions) == len(logprobs) == len(completion_masks):
    raise ValueError(f"pack_by_length: {len(prompts)} prompts, {len(completions)} completions, "
                     f"{len(logprobs)} logprob lists and {len(completion_masks)} masks")
  lengths = [(len(p), len(c)) for p, c in zip(prompts, completions)]
  return [(chunk, pack([prompts[i] for i in chunk], [completions[i] for i in chunk], pad_id,
                       [logprobs[i] for i in chunk], row_multiple=rows, max_len=max_len, completion_window=True,
                       completion_masks=[completion_masks[i] for i in chunk], buckets=buckets,
                       shape=(prompt_len, completion_len + 1)))
          for chunk, rows, (prompt_len, completion_len)
          in length_groups(lengths, token_budget, max_len=max_len, buckets=buckets)]
