"""How a batch's token losses are averaged: per-row weights that give veRL's aggregation.

`token_mean` (the default): Σ over every completion token of the update / their count, whatever the
micro-batching (rl/train_step.py).

`verl`: what AZR's trainer, veRL, computes (AZR's `paper` branch, verl/verl/workers/actor/dp_actor.py
L226-228: gradient_accumulation = ppo_mini_batch_size // ppo_micro_batch_size_per_gpu, the mini-batch
split into micro-batches of ppo_micro_batch_size_per_gpu rows; L274: loss = policy_loss /
gradient_accumulation; verl/verl/trainer/ppo/core_algos.py L301: policy_loss is the micro-batch's token
mean). The gradient is the mean over micro-batches of each micro-batch's token mean: a micro-batch of
short responses weighs as much as one of long ones. AZR concatenates its (task, role) groups of 64 rows
and cuts micro-batches of 16 (scripts/selfplay/coder7b.sh L28), so every group weighs the same.

The weights make that exact under any packing of ours: a token of veRL micro-batch m (of M, n_m loss
tokens) gets weight N / (M n_m), N the mini-batch's loss tokens, folded into the loss mask; our token
mean Σ w ℓ / Σ w then equals (1/M) Σ_m (1/n_m) Σ_{t in m} ℓ_t, and Σ w stays N (the token count the
metrics report). A micro-batch without loss tokens counts in M, as in veRL, and adds nothing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

LOSS_AGGREGATIONS = ("token_mean", "verl")


def verl_row_weights(token_counts: Sequence[float], micro_batch_rows: int) -> np.ndarray:
  """(R,) float32 per-row token weights for rows in the mini-batch's order (veRL cuts its micro-batches
  from consecutive rows), each row's loss-token count given."""
  if micro_batch_rows < 1:
    raise ValueError(f"micro_batch_rows={micro_batch_rows} is less than 1")
  counts = np.asarray(token_counts, np.float64)
  total = counts.sum()
  if counts.size == 0 or total <= 0:
    return np.ones(counts.shape, np.float32)
  micro = np.arange(counts.size) // micro_batch_rows  # each row's veRL micro-batch
  per_micro = np.bincount(micro, weights=counts)
  m = per_micro.size
  weights = total / (m * np.maximum(per_micro[micro], 1e-30))
  return np.where(counts > 0, weights, 1.0).astype(np.float32)
