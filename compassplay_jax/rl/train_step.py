"""The jitted RL update: micro-batched policy-gradient loss, AdamW with clipping, one step per call.

Batch (all leading dims B; per-token arrays use losses.py's alignment, index 0 unused):
  tokens (B, T) int32, attention_mask (B, T), loss_mask (B, W) completion tokens,
  advantages (B,) float32, old_logprobs (B, W) float32, optional ref_logprobs (B, W), positions (B, T).
  W = T covers the whole sequence; W < T covers its last W columns only (see `loss_window`), which
  saves the LM head's (B, T, V) activations over prompt positions.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from compassplay_jax.infra import microbatch
from compassplay_jax.infra import sharding as sh
from compassplay_jax.rl import losses, optim

AGGREGATIONS = ("token_mean", "microbatch_token_mean")
LAYOUTS = microbatch.LAYOUTS
_FLOAT_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation hyper-parameters. Defaults are AZR's (docs/paper_settings.md §5.3); SGS's are in docs/training.md."""
  learning_rate: float = 1e-6
  schedule: str = "constant"  # constant | linear | cosine (after warmup)
  warmup_steps: int = 0
  total_steps: int = 0  # needed by the decaying schedules
  end_lr_ratio: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  adam_eps: float = 1e-8
  weight_decay: float = 0.01
  grad_clip: float | None = 1.0  # global-norm clip; None or 0 disables
  micro_batch_size: int | None = None  # None: the whole batch in one pass
  # token_mean: Σ over all tokens of the batch / their count (independent of micro-batching).
  # microbatch_token_mean: mean over micro-batches of per-micro-batch token-means (veRL/AZR).
  aggregation: str = "token_mean"
  # Which rows form micro-batch k of K: "strided" = rows k, k+K, k+2K, ... (each micro-batch spans every
  # data shard, so no resharding under a data-sharded batch); "contiguous" = rows [k·m, (k+1)·m) (veRL).
  micro_batch_layout: str = "strided"
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  entropy_coef: float = 0.0
  kl_coef: float = 0.0
  temperature: float = 1.0
  master_fp32: bool = True  # keep parameters and optimizer state in float32
  compute_dtype: str | None = None  # overrides the model's compute dtype (e.g. "bfloat16"); None keeps it
  remat: bool | None = None  # overrides the model's per-block rematerialisation; None keeps it
  skip_nonfinite: bool = True  # leave params and opt_state unchanged when the loss or grads are not finite

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")
    if self.micro_batch_layout not in LAYOUTS:
      raise ValueError(f"micro_batch_layout {self.micro_batch_layout!r} is not one of {LAYOUTS}")
    if self.compute_dtype is not None and self.compute_dtype not in _FLOAT_DTYPES:
      raise ValueError(f"compute_dtype {self.compute_dtype!r} is not one of {_FLOAT_DTYPES}")
    if self.micro_batch_size is not None and self.micro_batch_size <= 0:
      raise ValueError(f"micro_batch_size must be positive, got {self.micro_batch_size}")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be positive, got {self.temperature}")

  def replace(self, **changes) -> "TrainConfig":
    return dataclasses.replace(self, **changes)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  schedule = optim.make_schedule(cfg.learning_rate, cfg.schedule, cfg.warmup_steps, cfg.total_steps,
                                 cfg.end_lr_ratio)
  return optim.make_adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                          grad_clip=cfg.grad_clip)


def _cast_floats(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def init_train_state(params, cfg: TrainConfig, optimizer: optax.GradientTransformation | None = None):
  """(params, opt_state) ready for the train step; params are cast to float32 when cfg.master_fp32.

  The returned params may be the very arrays passed in, and the train step donates them: afterwards
  use only the params it returns (e.g. `nnx.merge(graphdef, params)` for the sampler), not the model
  they were split from.
  """
  if cfg.master_fp32:
    params = _cast_floats(params, jnp.float32)
  return params, (optimizer or make_optimizer(cfg)).init(params)


def _apply_model(graphdef, params, cfg_overrides: dict, batch, logits_from: int = 0) -> jnp.ndarray:
  model = nnx.merge(graphdef, params)
  if cfg_overrides:
    # Compute dtype and remat are read from the config at call time, so overriding it is enough.
    model.config = model.config.replace(**cfg_overrides)
  return model(batch["tokens"], attention_mask=batch["attention_mask"], positions=batch.get("positions"),
               logits_from=logits_from)


def loss_window(batch) -> int:
  """Where the per-token arrays start. loss_mask / old_logprobs (/ ref_logprobs) may cover only the
  last W columns of tokens (W = their width): then logits are computed for those columns only, with
  the same alignment (column 0 of the window is a predictor-only position and is never a target)."""
  return batch["tokens"].shape[-1] - batch["loss_mask"].shape[-1]


def _overrides(compute_dtype: str | None, remat: bool | None) -> dict:
  out = {}
  if compute_dtype is not None:
    out["dtype"] = compute_dtype
  if remat is not None:
    out["remat"] = remat
  return out


def _split_micro(batch: dict, micro_batch_size: int | None, layout: str) -> tuple[dict, int]:
  """Each array (B, ...) -> (K, m, ...), m = micro_batch_size, rows grouped as `layout` says."""
  mbs = micro_batch_size or batch["tokens"].shape[0]
  micro = {name: microbatch.split_rows(x, mbs, layout) for name, x in batch.items()}
  return micro, micro["tokens"].shape[0]


METRIC_NAMES = ("pg_loss", "entropy", "kl", "clip_frac", "ratio_mean", "approx_kl", "num_tokens", "loss")


def _micro_grad_fn(graphdef, cfg: TrainConfig):
  """grad(weight · loss(micro-batch)) with the unweighted loss and its metrics as aux."""
  overrides = _overrides(cfg.compute_dtype, cfg.remat)
  loss_kwargs = dict(clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                     entropy_coef=cfg.entropy_coef, kl_coef=cfg.kl_coef, temperature=cfg.temperature)

  def micro_loss(params, mb, weight):
    start = loss_window(mb)
    logits = _apply_model(graphdef, params, overrides, mb, logits_from=start)
    loss, metrics = losses.policy_gradient_loss(
        logits, mb["tokens"][:, start:], mb["loss_mask"], mb["advantages"], mb["old_logprobs"],
        ref_logprobs=mb.get("ref_logprobs"), old_from_forward=mb.get("old_from_forward"), **loss_kwargs)
    return weight * loss, (loss, metrics)

  return jax.grad(micro_loss, has_aux=True)


def _accumulate(grad_acc, metric_acc, grads, loss, metrics, weight):
  """Adds one micro-batch: gradients (already weighted) in float32, metrics weighted (token counts summed)."""
  grad_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_acc, grads)
  metrics = {**metrics, "loss": loss}
  metric_acc = {name: metric_acc[name] + (v if name == "num_tokens" else weight * v) for name, v in metrics.items()}
  return grad_acc, metric_acc


def _zero_accumulators(params):
  return (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
          {name: jnp.zeros((), jnp.float32) for name in METRIC_NAMES})


def _update_fn(cfg: TrainConfig, optimizer):
  """(params, opt_state, summed grads, metrics) -> one AdamW step, skipped when not finite."""
  schedule = optim.make_schedule(cfg.learning_rate, cfg.schedule, cfg.warmup_steps, cfg.total_steps,
                                 cfg.end_lr_ratio)

  def update(params, opt_state, grads, metrics):
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    step = optim.optimizer_step(opt_state)
    grad_norm = optax.global_norm(grads)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    ok = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
    if cfg.skip_nonfinite:
      keep = lambda new, old: jnp.where(ok, new, old)
      new_params = jax.tree.map(keep, new_params, params)
      new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    metrics = {**metrics, "grad_norm": grad_norm, "learning_rate": schedule(step),
               "skipped": (~ok).astype(jnp.float32)}
    return new_params, new_opt_state, metrics

  return update


def make_train_step(graphdef, cfg: TrainConfig, *, optimizer: optax.GradientTransformation | None = None,
                    in_shardings: Any = None, out_shardings: Any = None, donate: bool = True) -> Callable:
  """Returns jitted `train_step(params, opt_state, batch, key) -> (params, opt_state, metrics)`.

  One call = one optimizer update on the whole batch, accumulating gradients over micro-batches of
  cfg.micro_batch_size rows with lax.scan. `key` is reserved for stochastic layers (the decoder has
  none) and is unused. params and opt_state are donated when `donate`. `in_shardings` and
  `out_shardings` go to jax.jit unchanged (leave None for single-device use).
  """
  optimizer = optimizer or make_optimizer(cfg)
  grad_fn = _micro_grad_fn(graphdef, cfg)
  update = _update_fn(cfg, optimizer)

  def train_step(params, opt_state, batch, key):
    del key  # no stochastic layers
    micro, k = _split_micro(dict(batch), cfg.micro_batch_size, cfg.micro_batch_layout)
    tokens_per_micro = jnp.sum(micro["loss_mask"].astype(jnp.float32), axis=tuple(range(1, micro["loss_mask"].ndim)))
    total_tokens = jnp.sum(tokens_per_micro)
    if cfg.aggregation == "token_mean":
      weights = tokens_per_micro / jnp.maximum(total_tokens, 1.0)
    else:
      weights = jnp.full((k,), 1.0 / k, jnp.float32)

    def body(carry, xs):
      mb, w = xs
      grads, (loss, metrics) = grad_fn(params, mb, w)
      return _accumulate(*carry, grads, loss, metrics, w), None

    (grads, metrics), _ = jax.lax.scan(body, _zero_accumulators(params), (micro, weights))
    return update(params, opt_state, grads, metrics)

  jit_kwargs = {}
  if in_shardings is not None:
    jit_kwargs["in_shardings"] = in_shardings
  if out_shardings is not None:
    jit_kwargs["out_shardings"] = out_shardings
  return sh.jit(train_step, donate_argnums=(0, 1) if donate else (), **jit_kwargs)


class StepShardings(NamedTuple):
  """Explicit layouts for the bucketed step's jits: params (and gradient accumulators), optimizer
  state, batch rows (a prefix for every micro-batch array), replicated scalars."""
  params: Any
  opt_state: Any
  rows: Any
  replicated: Any


def make_bucketed_train_step(graphdef, cfg: TrainConfig, *, optimizer: optax.GradientTransformation | None = None,
                             shardings: StepShardings | None = None, ahead=None) -> "BucketedTrainStep":
  """`train_step(params, opt_state, micro_batches, key) -> (params, opt_state, metrics)` for micro-batches
  of different shapes (rows packed by their real length, selfplay/sequences.py `pack_by_length`).

  One call = one optimizer update, equal to make_train_step's on the same rows: each micro-batch is one
  jitted gradient-accumulation call (compiled once per shape, so shapes should come from few buckets),
  then one jitted update. Weights: token_mean = the micro-batch's share of all loss tokens;
  microbatch_token_mean = 1/K. params and opt_state are donated. ahead: a compile_ahead.Ahead that
  may be compiling the update (waited for before it is called).
  """
  optimizer = optimizer or make_optimizer(cfg)
  grad_fn = _micro_grad_fn(graphdef, cfg)

  def accumulate(params, grad_acc, metric_acc, mb, weight):
    grads, (loss, metrics) = grad_fn(params, mb, weight)
    return _accumulate(grad_acc, metric_acc, grads, loss, metrics, weight)

  jit_acc, jit_update, jit_zeros = {}, {}, {}
  if shardings is not None:
    p, o, rows, repl = shardings
    jit_acc = dict(in_shardings=(p, p, repl, rows, repl), out_shardings=(p, repl))
    jit_update = dict(in_shardings=(p, o, p, repl), out_shardings=(p, o, repl))
    jit_zeros = dict(in_shardings=(p,), out_shardings=(p, repl))
  return BucketedTrainStep(cfg.aggregation, sh.jit(accumulate, donate_argnums=(1, 2), **jit_acc),
                           jax.jit(_update_fn(cfg, optimizer), donate_argnums=(0, 1), **jit_update),
                           jax.jit(_zero_accumulators, **jit_zeros), shardings, ahead)


@dataclasses.dataclass(frozen=True, eq=False)
class BucketedTrainStep:
  """make_bucketed_train_step's step: its three jits (zeros, accumulate per micro-batch, update)."""
  aggregation: str
  accumulate: Callable
  update: Callable
  zeros: Callable
  shardings: StepShardings | None = None
  ahead: Any = None

  def __call__(self, params, opt_state, micro_batches, key):
    del key  # no stochastic layers
    if not micro_batches:
      raise ValueError("train_step: no micro-batches")
    # jnp.sum: micro-batches may be global arrays spread over processes (the sum is replicated).
    tokens = [float(jnp.sum(mb["loss_mask"])) for mb in micro_batches]
    if self.aggregation == "token_mean":
      weights = [t / max(sum(tokens), 1.0) for t in tokens]
    else:
      weights = [1.0 / len(micro_batches)] * len(micro_batches)
    grad_acc, metric_acc = self.zeros(params)
    for mb, w in zip(micro_batches, weights):
      grad_acc, metric_acc = self.accumulate(params, grad_acc, metric_acc, mb, np.float32(w))
    if self.ahead is not None:
      self.ahead.wait(self.update)
    return self.update(params, opt_state, grad_acc, metric_acc)

  def update_arguments(self, params, opt_state) -> tuple:
    """The update's abstract arguments for abstract (params, opt_state): the summed float32 gradients
    laid out like the params and the summed metrics (replicated), as `zeros` makes them."""
    grads, metrics = jax.eval_shape(_zero_accumulators, params)
    grads = jax.tree.map(lambda g, p: jax.ShapeDtypeStruct(g.shape, g.dtype, sharding=p.sharding), grads, params)
    repl = None if self.shardings is None else self.shardings.replicated
    metrics = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=repl), metrics)
    return params, opt_state, grads, metrics


def make_train_logprob_fn(graphdef, cfg: TrainConfig, *, in_shardings: Any = None, out_shardings: Any = None):
  """Jitted `fn(params, batch) -> (B, W)` log-probs over the batch's loss window, by the train step's
  own forward (same micro-batches, compute dtype, remat and LM-head window): the old log-probs of a
  PPO update recomputed at the params before it (train.recompute_logprobs; veRL's old_log_prob)."""
  overrides = _overrides(cfg.compute_dtype, cfg.remat)

  def fn(params, batch):
    micro, _ = _split_micro({k: batch[k] for k in ("tokens", "attention_mask", "loss_mask")},
                            cfg.micro_batch_size, cfg.micro_batch_layout)

    def one(mb):
      start = loss_window(mb)
      logits = _apply_model(graphdef, params, overrides, mb, logits_from=start)
      return losses.token_logprobs(logits, mb["tokens"][:, start:], cfg.temperature)

    return microbatch.merge_rows(jax.lax.map(one, micro), cfg.micro_batch_layout)

  jit_kwargs = {}
  if in_shardings is not None:
    jit_kwargs["in_shardings"] = in_shardings
  if out_shardings is not None:
    jit_kwargs["out_shardings"] = out_shardings
  return sh.jit(fn, **jit_kwargs)


def make_logprob_fn(graphdef, *, temperature: float = 1.0, micro_batch_size: int | None = None,
                    micro_batch_layout: str = "strided", compute_dtype: str | None = None, in_shardings: Any = None,
                    out_shardings: Any = None) -> Callable:
  """Jitted `logprob_fn(params, tokens, attention_mask) -> (B, T)` log-probs in the loss's alignment.

  For recomputing old log-probs (veRL does) or a frozen reference's log-probs for the KL term.
  Rows are processed `micro_batch_size` at a time to bound the (B, T, V) logits' memory.
  """
  overrides = _overrides(compute_dtype, None)

  def logprob_fn(params, tokens, attention_mask):
    micro, _ = _split_micro({"tokens": tokens, "attention_mask": attention_mask}, micro_batch_size,
                            micro_batch_layout)

    def one(mb):
      return losses.token_logprobs(_apply_model(graphdef, params, overrides, mb), mb["tokens"], temperature)

    return microbatch.merge_rows(jax.lax.map(one, micro), micro_batch_layout)

  jit_kwargs = {}
  if in_shardings is not None:
    jit_kwargs["in_shardings"] = in_shardings
  if out_shardings is not None:
    jit_kwargs["out_shardings"] = out_shardings
  return sh.jit(logprob_fn, **jit_kwargs)
