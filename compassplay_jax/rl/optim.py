"""The optimizer: grad-norm clipping then AdamW on a learning-rate schedule."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "linear", "cosine")


def make_schedule(learning_rate: float, schedule: str = "constant", warmup_steps: int = 0, total_steps: int = 0,
                  end_lr_ratio: float = 0.0) -> optax.Schedule:
  """Linear warmup from 0 over `warmup_steps`, then constant or a linear/cosine decay to end_lr_ratio·lr.

  The decay runs over the remaining `total_steps − warmup_steps` updates (so it needs total_steps).
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"schedule {schedule!r} is not one of {SCHEDULES}")
  if schedule != "constant" and total_steps <= warmup_steps:
    raise ValueError(f"schedule {schedule!r} needs total_steps > warmup_steps, got {total_steps} <= {warmup_steps}")
  end = learning_rate * end_lr_ratio
  decay_steps = max(total_steps - warmup_steps, 1)
  if schedule == "constant":
    main = optax.constant_schedule(learning_rate)
  elif schedule == "linear":
    main = optax.linear_schedule(learning_rate, end, decay_steps)
  else:
    main = optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=end_lr_ratio)
  if warmup_steps <= 0:
    return main
  warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warmup, main], [warmup_steps])


def make_adamw(schedule: optax.Schedule, *, b1: float, b2: float, eps: float, weight_decay: float,
               grad_clip: float | None) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) (skipped when falsy) then AdamW, decaying every parameter.

  torch.optim.AdamW as veRL builds it decays all parameters (norm scales and biases included), and
  optax's decoupled decay (−lr·wd·θ) is the same update.
  """
  adamw = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  return optax.chain(optax.clip_by_global_norm(grad_clip), adamw) if grad_clip else adamw


def _has_count(x) -> bool:
  return isinstance(x, (optax.ScaleByAdamState, optax.ScaleByScheduleState))


def optimizer_step(opt_state) -> jnp.ndarray:
  """The number of updates applied so far (Adam's or the schedule's count), as an int32 scalar."""
  for s in jax.tree_util.tree_leaves(opt_state, is_leaf=_has_count):
    if _has_count(s):
      return s.count
  raise ValueError("opt_state holds no update count (no Adam or schedule state)")
