"""SOAR's measurement in a self-play step (reward.name = soar_utility): the loop side of rewards/soar.py.

The candidates SOAR pays (valid ones; with RewardConfig.soar_uses_band also 0 < s < 1) are taken in
proposal order and cut into groups of config.reward.soar_group_size. For each group a copy of the
solver takes soar_inner_steps SGD steps on the group's verified tasks (each candidate's
`solution`: solver prompt + verified completion, loss on the completion), and the held-out loss
before minus after is every member's `heldout_improvement`. Device work goes through the
engine; rows are padded to one group shape and one length bucket per step, so each step compiles at
most one inner-training program per length bucket.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from compassplay_jax import distributed
from compassplay_jax.rewards import soar as soar_lib
from compassplay_jax.rewards.proposer_rewards import RewardConfig, in_band
from compassplay_jax.selfplay.sequences import TRAIN_BUCKETS, PackedBatch, pack

NAME = "soar_utility"


def _place(engine, arrays: dict, pad_id: int, rows: int | None = None):
  """tokens / loss_mask / attention_mask padded to `rows` (or a multiple of data*fsdp), placed."""
  host = {k: np.asarray(arrays[k]) for k in ("tokens", "loss_mask", "attention_mask")}
  if rows is not None and rows > host["tokens"].shape[0]:
    extra = rows - host["tokens"].shape[0]
    host = {k: np.pad(v, ((0, extra), (0, 0)), constant_values=pad_id if k == "tokens" else 0)
            for k, v in host.items()}
  return engine.put_batch(engine.pad_rows(host, {"tokens": pad_id}))


def paid(candidates, reward_cfg: RewardConfig) -> list[int]:
  """Indices of the candidates SOAR measures: valid with a solution (and in band if reward_cfg.soar_uses_band)."""
  return [i for i, c in enumerate(candidates) if c.valid and c.solution is not None
          and (not reward_cfg.soar_uses_band or in_band(c.solve_rate, reward_cfg))]


def measure(engine, params, candidates: Sequence, options, *, pad_id: int, max_len: int,
            reward_cfg: RewardConfig) -> tuple[np.ndarray, dict]:
  """(heldout_improvement per candidate (0 where not measured), metrics): soar/heldout_loss (before),
  soar/groups, soar/group_improvements (in group order) and soar/improvement_mean. `options`: the
  reward stage's step.SoarOptions (held-out set, group size, inner steps and learning rate)."""
  improvement = np.zeros((len(candidates),), np.float32)
  members = paid(candidates, reward_cfg)
  if not members:
    return improvement, {"soar/groups": 0}
  held = _place(engine, options.heldout.as_dict(), pad_id)
  before = float(distributed.to_host(engine.mean_loss(params, held["tokens"], held["loss_mask"],
                                                              held["attention_mask"])))
  packed = pack([candidates[i].solution[0] for i in members], [candidates[i].solution[1] for i in members],
                pad_id, max_len=max_len, buckets=TRAIN_BUCKETS)
  improvements = []
  for group in soar_lib.groups(range(len(members)), options.group_size):
    rows = {k: getattr(packed, k)[group] for k in ("tokens", "loss_mask", "attention_mask")}
    train = _place(engine, rows, pad_id, rows=options.group_size)
    after = float(distributed.to_host(engine.soar_trained_heldout_loss(
        params, train, held, steps=options.steps, learning_rate=options.learning_rate)))
    improvements.append(before - after)
    improvement[[members[j] for j in group]] = before - after
  return improvement, {"soar/heldout_loss": before, "soar/groups": len(improvements),
                       "soar/group_improvements": improvements, "soar/improvement_mean": float(np.mean(improvements))}
