"""The device engine of a run: every compiled device function, with its in/out shardings, in one place.

Built once per run from (graphdef, mesh, settings) and passed explicitly to whoever needs a device
function: the sampler (through sampling.engine's rollout-engine seam), the reference gradient, the
candidate cosines, the train step (padded or length-bucketed), the frozen reference policy's
log-probs, and greedy evaluation. On one device it is the same code on a (1, 1, 1) mesh.

Layouts (infra/sharding.py's rules): params, gradients, g_ref and optimizer moments by PARAM_RULES; batch
rows and per-example outputs over (data, fsdp); scalars replicated. Host data enters through
`put_batch`, which builds global arrays from what every process holds (each process hands over only
its own devices' rows), so the same calls work on one host and across hosts.

Each device function `f` that is one jitted program has a builder `f_jit(...)` returning the jit
(with its in/out shardings and donation) that `f` calls for those argument shapes; arguments may be
ShapeDtypeStructs, so memory_report lowers and compiles exactly the programs a run compiles
(`abstract_train_state` gives the train step's abstract inputs). The sampler's are
`ShardedSampler.prefill_jit` / `decode_jit`; the bucketed train step is several jits and has none.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compassplay_jax.infra import compile_ahead
from compassplay_jax.infra import sharding as sh
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import model_config
from compassplay_jax.rewards import cosines as cosines_lib
from compassplay_jax.rewards import reference as reference_lib
from compassplay_jax.rewards import soar as soar_lib
from compassplay_jax.rl import train_step as train_lib
from compassplay_jax.sampling import decode as decode_lib
from compassplay_jax.sampling import slots as slots_lib
from compassplay_jax.sampling.rollout_engine import RolloutEngine

_log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class EngineSettings:
  """The static knobs of the device functions (everything else is an argument)."""
  train: train_lib.TrainConfig = train_lib.TrainConfig()
  reward_method: str = "fused"  # fused | direct | auto (cosines_lib.choose_method, per shape)
  reward_chunk_size: int | None = 8  # candidates per chunk inside one cosine pass
  reward_micro_batch: int = 8  # rows per forward/backward of g_ref and of a cosine pass
  norm_mode: str = "auto"
  compile_ahead: bool = False  # compile known programs on a background thread (infra/compile_ahead.py)

  def __post_init__(self):
    if self.reward_method not in cosines_lib.METHODS:
      raise ValueError(f"reward method {self.reward_method!r} is not one of {cosines_lib.METHODS}")
    if self.reward_micro_batch < 1:
      raise ValueError(f"reward micro_batch_size must be positive, got {self.reward_micro_batch}")

  @classmethod
  def from_config(cls, config) -> "EngineSettings":
    """From a run config: config.train's TrainConfig fields plus the run length and the sampler's
    temperature (greedy: 1), and config.reward's method, chunk and micro-batch sizes."""
    from compassplay_jax.runtime import config_base
    train = config_base.dataclass_from(
        train_lib.TrainConfig, config.train, total_steps=config.steps,
        temperature=config.sampling.temperature if config.sampling.temperature > 0 else 1.0)
    r = config.reward
    return cls(train=train, reward_method=r.method, reward_chunk_size=r.chunk_size,
               reward_micro_batch=r.micro_batch_size, compile_ahead=config_base.compile_ahead(config))

  def fitted(self, mesh: Mesh) -> "EngineSettings":
    """Micro-batch sizes rounded up to multiples of data*fsdp, where that changes no result.

    g_ref (a mean over sequences) and the cosines (per example) do not depend on how rows are
    grouped, nor does a token_mean train step (padding rows carry no loss tokens). The per-micro-batch
    mean (microbatch_token_mean) does, so there a size that does not fit the mesh stays an error.
    """
    train = self.train
    mbs = train.micro_batch_size
    if mbs is not None and mbs % sh.batch_divisor(mesh):
      if train.aggregation != "token_mean":
        raise sh.ShardingError(f"train.micro_batch_size={mbs} is not a multiple of data*fsdp="
                               f"{sh.batch_divisor(mesh)} (aggregation {train.aggregation!r} depends on it)")
      train = train.replace(micro_batch_size=sh.round_to_mesh(mbs, mesh))
    return dataclasses.replace(self, train=train, reward_micro_batch=sh.round_to_mesh(self.reward_micro_batch, mesh))


class Engine:
  """Compiled device functions of one (graphdef, mesh, settings). Nothing here mutates module state."""

  def __init__(self, graphdef, mesh: Mesh, settings: EngineSettings, model_cfg: ModelConfig, optimizer=None):
    self.graphdef, self.mesh, self.model_config = graphdef, mesh, model_cfg
    self.settings = settings.fitted(mesh)
    self.optimizer = optimizer or train_lib.make_optimizer(self.settings.train)
    self.rows = sh.batch_sharding(mesh, 1)  # leading dim over (data, fsdp): a prefix for whole batches
    self.repl = sh.replicated(mesh)
    self.sampler = ShardedSampler(mesh, model_cfg.head_dim)
    # Rollouts run per host: each process samples its share of a step's prompts on its own devices
    # (sampler_mesh), with its own copy of the weights (sampler_params), so hosts never wait on each
    # other while decoding. On one process the sampler mesh is the mesh.
    self.transfer_mesh, self.sampler_mesh = (sh.host_meshes(mesh) if jax.process_count() > 1 else (None, mesh))
    self.local_sampler = (self.sampler if self.sampler_mesh is mesh
                          else ShardedSampler(self.sampler_mesh, model_cfg.head_dim))
    self.rollout: RolloutEngine | None = None  # see rollout_engine()
    self._jitted: dict[Any, Any] = {}
    self._sampler_params = (None, None)  # (the params they were cast from, the cast copy)
    self._cast_jit = None  # sampler_params' jitted cast
    # Programs whose shapes are known before their first call compile here in the background.
    self.ahead = compile_ahead.Ahead(self.settings.compile_ahead)

  @classmethod
  def build(cls, graphdef, params, mesh: Mesh, settings: EngineSettings, optimizer=None) -> "Engine":
    """From a split model; `params` may be abstract (only their config is read)."""
    return cls(graphdef, mesh, settings, model_config(graphdef, params), optimizer)

  # ---- layouts ------------------------------------------------------------------------------------

  @property
  def batch_divisor(self) -> int:
    return sh.batch_divisor(self.mesh)

  def param_shardings(self, params):
    return sh.tree_shardings(params, self.mesh, self.model_config.head_dim)

  def opt_shardings(self, opt_state):
    return sh.tree_shardings(opt_state, self.mesh, self.model_config.head_dim, strict=False)

  def place_params(self, params):
    """params on the mesh by the rules (a no-op for arrays already laid out so)."""
    return jax.device_put(params, self.param_shardings(params))

  def abstract_train_state(self, params):
    """What init_train_state returns for `params` (real or abstract), as sharded ShapeDtypeStructs:
    nothing is allocated (memory_report's train-step inputs)."""
    params = jax.eval_shape(lambda p: train_lib.init_train_state(p, self.settings.train, optimizer=_NoState())[0],
                            params)
    opt_state = jax.eval_shape(self.optimizer.init, params)
    return (sh.abstract_sharded(params, self.param_shardings(params)),
            sh.abstract_sharded(opt_state, self.opt_shardings(opt_state)))

  def init_train_state(self, params):
    """(params, opt_state) on the mesh: fp32 masters when configured, optimizer state sharded like them."""
    params = self.place_params(params)
    params, _ = train_lib.init_train_state(params, self.settings.train, optimizer=_NoState())
    abstract = jax.eval_shape(self.optimizer.init, params)
    opt_state = jax.jit(self.optimizer.init, out_shardings=self.opt_shardings(abstract))(params)
    return params, opt_state

  def put_batch(self, host_batch):
    """Global arrays with rows over (data, fsdp) from a host batch every process holds whole."""
    return sh.shard_batch(host_batch, self.mesh)

  def pad_rows(self, host_batch, pad_values: dict[str, int] | None = None):
    """Host batch with rows padded to a multiple of data*fsdp (padding rows: no loss tokens)."""
    pad_values = pad_values or {}
    b = len(next(iter(host_batch.values())))
    extra = sh.round_to_mesh(b, self.mesh) - b
    if extra == 0:
      return host_batch
    return {k: np.pad(np.asarray(v), [(0, extra)] + [(0, 0)] * (np.ndim(v) - 1), constant_values=pad_values.get(k, 0))
            for k, v in host_batch.items()}

  def local_rows(self, rows: int, multiple: int = 1) -> int:
    """Rows per process for a share of at most `rows` rows: a multiple of this process's batch devices
    and such that the global batch (rows x processes) is a multiple of `multiple`."""
    unit = sh.local_row_unit(self.mesh)
    step = unit * (multiple // math.gcd(multiple, unit * jax.process_count()))
    return max(step, -(-max(int(rows), 1) // step) * step)

  def put_local_rows(self, local_batch, rows_per_process: int):
    """Global arrays (rows over (data, fsdp)) from this process's rows only (sharding.put_local_rows)."""
    return sh.put_local_rows(local_batch, self.mesh, rows_per_process)

  def process_rows(self, global_rows: int, process: int) -> np.ndarray:
    """Indices in a global batch of `global_rows` rows of process `process`'s local rows, in order."""
    from compassplay_jax.infra import distributed
    return distributed.process_rows(global_rows, self.mesh, process)

  def sampler_params(self, params):
    """The weights the rollout engine samples with: cast to the compute dtype once per update (not
    inside the decode loop) and laid out on the sampler mesh; across processes each host gets a whole
    copy (the transfer mesh's all-gather), split only inside the host. Cached per params object."""
    if self._sampler_params[0] is params:
      return self._sampler_params[1]
    dtype = jnp.dtype(self.settings.train.compute_dtype or self.model_config.dtype)
    cast = functools.partial(slots_lib.cast_params, dtype=dtype)
    local_shardings = sh.tree_shardings(params, self.sampler_mesh, self.model_config.head_dim)
    if self._cast_jit is None:  # built once per run: a new jit per update would retrace every step
      target = (local_shardings if self.transfer_mesh is None else
                jax.tree.map(lambda s: NamedSharding(self.transfer_mesh, s.spec), local_shardings))
      self._cast_jit = jax.jit(cast, out_shardings=target)
    if self.transfer_mesh is None:
      out = self._cast_jit(params)
    else:
      gathered = self._cast_jit(params)
      out = jax.tree.map(lambda x, s: jax.make_array_from_single_device_arrays(
          x.shape, s, [shard.data for shard in x.addressable_shards]), gathered, local_shardings)
    self._sampler_params = (params, out)
    return out

  def release_rollout_memory(self) -> int:
    """Before the update: the rollout engine's KV cache and weight copy go back (RolloutEngine.
    release_memory), and so does the cast copy kept here (sampler_params), so the update's
    temporaries have that memory; the next rollout allocates both again. Returns the bytes released."""
    self._sampler_params = (None, None)
    return self.rollout.release_memory() if self.rollout is not None else 0

  # ---- device functions ---------------------------------------------------------------------------

  def _cached(self, name, build):
    if name not in self._jitted:
      self._jitted[name] = build()
    return self._jitted[name]

  def reward_micro_batch(self, rows: int) -> int:
    """Rows per forward/backward of g_ref, a cosine pass or a held-out loss over `rows` rows."""
    return min(self.settings.reward_micro_batch, sh.round_to_mesh(rows, self.mesh))

  def reference_gradient(self, params, tokens, loss_mask, attention_mask):
    """g_ref at `params` over a reference set (rows: a multiple of data*fsdp), stored like the params."""
    jitted = self.reference_gradient_jit(params, tokens.shape[0])
    self.ahead.wait(jitted)
    return jitted(params, tokens, loss_mask, attention_mask)

  def reference_gradient_jit(self, params, rows: int):
    """The jitted `(params, tokens, loss_mask, attention_mask) -> g_ref` for `rows` reference rows."""
    mb = self.reward_micro_batch(rows)

    def build():
      p_sh = self.param_shardings(params)
      def reference_gradient(p, t, lm, am):  # named: compile logs and profiles show the name
        return reference_lib.reference_gradient(self.graphdef, p, t, lm, am, micro_batch=mb)
      return sh.jit(reference_gradient, in_shardings=(p_sh, self.rows, self.rows, self.rows), out_shardings=p_sh)
    return self._cached(("reference", mb), build)

  def cosines(self, params, g_ref, tokens, loss_mask, attention_mask) -> cosines_lib.CosineResult:
    """Cosines of each row's loss gradient with g_ref; per-example outputs over (data, fsdp)."""
    jitted = self.cosines_jit(params, tokens.shape[0])
    self.ahead.wait(jitted)
    return jitted(params, g_ref, tokens, loss_mask, attention_mask)

  def cosines_jit(self, params, rows: int, method: str | None = None):
    """The jitted `(params, g_ref, tokens, loss_mask, attention_mask) -> CosineResult` for `rows` candidates.

    reward.method "auto": a cosines_lib.AutoMethod over the fused and direct programs, which compiles
    both at each new candidate shape and keeps the one `choose_method` picks (its `choices`)."""
    s = self.settings
    mb = self.reward_micro_batch(rows)
    method = method or s.reward_method
    if method == "auto":
      return self._cached(("cosines", mb, "auto"), lambda: cosines_lib.AutoMethod(
          lambda m: self.cosines_jit(params, rows, m),
          memory_budget=cosines_lib.device_memory_budget(self.mesh.devices.flat[0])))

    def build():
      p_sh = self.param_shardings(params)
      def gradient_cosines(p, g, t, lm, am):
        return cosines_lib.gradient_cosines(self.graphdef, p, g, t, lm, am, method=method,
                                            chunk_size=s.reward_chunk_size, norm_mode=s.norm_mode, micro_batch=mb)
      out = cosines_lib.CosineResult(cosines=self.rows, inner_products=self.rows, sq_norms=self.rows,
                                     ref_sq_norm=self.repl, has_loss_tokens=self.rows)
      # Nothing donated: outputs are (N,) vectors, and params / g_ref live on.
      return sh.jit(gradient_cosines, in_shardings=(p_sh, p_sh, self.rows, self.rows, self.rows), out_shardings=out)
    return self._cached(("cosines", mb, method), build)

  def mean_loss(self, params, tokens, loss_mask, attention_mask):
    """Mean per-sequence loss over the rows with loss tokens at `params`, forward only (rows: a multiple
    of data*fsdp), a scalar: SOAR's held-out loss and the session's reference loss (rewards/soar.py)."""
    return self.mean_loss_jit(params, tokens.shape[0])(params, tokens, loss_mask, attention_mask)

  def mean_loss_jit(self, params, rows: int):
    """The jitted `(params, tokens, loss_mask, attention_mask) -> mean loss` for `rows` rows."""
    mb = self.reward_micro_batch(rows)

    def build():
      def mean_loss(p, t, lm, am):
        return soar_lib.heldout_loss(self.graphdef, p, t, lm, am, micro_batch=mb)
      return sh.jit(mean_loss, in_shardings=(self.param_shardings(params), self.rows, self.rows, self.rows),
                     out_shardings=self.repl)
    return self._cached(("mean_loss", mb), build)

  def soar_trained_heldout_loss(self, params, train: dict, heldout: dict, *, steps: int, learning_rate: float,
                                batch_rows: int = 0, optimizer: str = "sgd", with_change: bool = False):
    """SOAR's held-out loss after `steps` inner steps (optimizer "sgd" | "adam", rewards/soar.inner_train)
    of a copy of `params` on the `train` rows (a group's verified tasks; batch_rows > 0: that many of
    them per step, rewards/soar.step_rows); placed batches with tokens / loss_mask / attention_mask.
    with_change: (loss, rewards/soar.param_change of the copy). Nothing is donated: the outer params
    are read, never written."""
    names = ("tokens", "loss_mask", "attention_mask")
    fn = self.soar_trained_heldout_loss_jit(params, train["tokens"].shape[0], steps, batch_rows, optimizer)
    lr = np.asarray(learning_rate, np.float32)
    loss, change = fn(params, lr, *(train[k] for k in names), *(heldout[k] for k in names))
    return (loss, change) if with_change else loss

  def soar_trained_heldout_loss_jit(self, params, rows: int, steps: int, batch_rows: int = 0, optimizer: str = "sgd"):
    """The jitted `(params, learning_rate, train tokens / loss_mask / attention_mask, held-out ditto) ->
    (held-out loss, param change)` for `rows` train rows."""
    mb = self.reward_micro_batch(rows)

    def build():
      def soar_trained_heldout_loss(p, lr, t, lm, am, ht, hlm, ham):
        return soar_lib.trained_heldout_loss_and_change(self.graphdef, p, t, lm, am, ht, hlm, ham, steps=steps,
                                                        learning_rate=lr, micro_batch=mb, batch_rows=batch_rows,
                                                        optimizer=optimizer)
      return sh.jit(soar_trained_heldout_loss, in_shardings=(self.param_shardings(params), self.repl) + (self.rows,) * 6,
                     out_shardings=self.repl)
    return self._cached(("soar_trained", mb, int(steps), int(batch_rows), optimizer), build)

  def soar_trained_params(self, params, train: dict, *, steps: int, learning_rate: float, batch_rows: int = 0,
                          optimizer: str = "sgd"):
    """The solver copy SOAR's accuracy signal decodes with: `params` after `steps` inner steps on the
    `train` rows (as soar_trained_heldout_loss), a new pytree laid out like `params`. Nothing is
    donated: the outer params are read, never written; the copy is one more params' worth of memory
    (Adam: three more during the inner steps, its two moments)."""
    names = ("tokens", "loss_mask", "attention_mask")
    fn = self.soar_trained_params_jit(params, train["tokens"].shape[0], steps, batch_rows, optimizer)
    return fn(params, np.asarray(learning_rate, np.float32), *(train[k] for k in names))

  def soar_trained_params_jit(self, params, rows: int, steps: int, batch_rows: int = 0, optimizer: str = "sgd"):
    """The jitted `(params, learning_rate, train tokens / loss_mask / attention_mask) -> trained params`."""
    mb = self.reward_micro_batch(rows)

    def build():
      p_sh = self.param_shardings(params)
      def soar_trained_params(p, lr, t, lm, am):
        return soar_lib.inner_train(self.graphdef, p, t, lm, am, steps=steps, learning_rate=lr, micro_batch=mb,
                                    batch_rows=batch_rows, optimizer=optimizer)
      return sh.jit(soar_trained_params, in_shardings=(p_sh, self.repl) + (self.rows,) * 3, out_shardings=p_sh)
    return self._cached(("soar_params", mb, int(steps), int(batch_rows), optimizer), build)

  def soar_param_change(self, params, trained) -> dict:
    """rewards/soar.param_change(params, trained): how far a SOAR copy moved (replicated scalars)."""
    def build():
      p_sh = self.param_shardings(params)
      return sh.jit(soar_lib.param_change, in_shardings=(p_sh, p_sh), out_shardings=self.repl)
    return self._cached(("soar_change",), build)(params, trained)

  def train_step(self, params, opt_state, batch, key):
    """One optimizer update on a padded batch (rows: a multiple of the train micro-batch); donates
    params and opt_state."""
    return self.train_step_jit(params, opt_state)(params, opt_state, batch, key)

  def train_step_jit(self, params, opt_state):
    """The jitted `(params, opt_state, batch, key) -> (params, opt_state, metrics)` (one per Engine)."""
    def build():
      p_sh, o_sh = self.param_shardings(params), self.opt_shardings(opt_state)
      return train_lib.make_train_step(self.graphdef, self.settings.train, optimizer=self.optimizer, donate=True,
                                       in_shardings=(p_sh, o_sh, self.rows, self.repl),
                                       out_shardings=(p_sh, o_sh, self.repl))
    return self._cached("train", build)

  def bucketed_train_step(self, params, opt_state, micro_batches: Sequence[dict], key, ref_params=None):
    """One optimizer update over micro-batches of different lengths (rl.train_step's bucketed step).

    Each host micro-batch is padded to a multiple of data*fsdp rows (no loss tokens), then placed;
    with ref_params, the reference policy's log-probs join it (with_reference)."""
    placed = [mb if isinstance(mb["tokens"], jax.Array) else self.place_train_batch(mb, ref_params)
              for mb in micro_batches]
    return self._bucketed_step(params, opt_state)(params, opt_state, placed, key)

  def _bucketed_step(self, params, opt_state) -> train_lib.BucketedTrainStep:
    def build():
      return train_lib.make_bucketed_train_step(
          self.graphdef, self.settings.train, optimizer=self.optimizer, ahead=self.ahead,
          shardings=train_lib.StepShardings(self.param_shardings(params), self.opt_shardings(opt_state),
                                            self.rows, self.repl))
    return self._cached("bucketed", build)

  # ---- compiling ahead (infra/compile_ahead.py): the call of each waits for its program -----------------

  def update_ahead(self, params, opt_state) -> None:
    """Compiles the bucketed step's optimizer update (its shapes are the params') in the background."""
    step = self._bucketed_step(params, opt_state)
    self.ahead.submit(step.update, *step.update_arguments(compile_ahead.abstract(params),
                                                          compile_ahead.abstract(opt_state)))

  def reference_gradient_ahead(self, params, rows: int, length: int) -> None:
    """Compiles g_ref's program for `rows` (global) reference rows of `length` columns in the background."""
    self.ahead.submit(self.reference_gradient_jit(params, rows), compile_ahead.abstract(params),
                      *self._abstract_rows(rows, length))

  def cosines_ahead(self, params, rows: int, length: int) -> None:
    """Compiles the cosine pass for `rows` (global) candidate rows of `length` columns in the background."""
    p = compile_ahead.abstract(params)  # g_ref is stored like the params (reference_gradient_jit)
    self.ahead.submit(self.cosines_jit(params, rows), p, p, *self._abstract_rows(rows, length))

  def _abstract_rows(self, rows: int, length: int):
    """(tokens, loss_mask, attention_mask) of a placed (rows, length) pass (sequences.PackedBatch's dtypes)."""
    s = sh.batch_sharding(self.mesh, 2)
    return tuple(jax.ShapeDtypeStruct((rows, length), dtype, sharding=s) for dtype in (jnp.int32, jnp.float32, jnp.int32))

  def place_train_batch(self, host_batch: dict, ref_params=None, micro_batch_size: int | None = None) -> dict:
    """A host train batch on the mesh: rows padded to a multiple of data*fsdp (no loss tokens) and
    placed; with ref_params, the reference policy's log-probs join it (with_reference)."""
    placed = self.put_batch(self.pad_rows(host_batch))
    return placed if ref_params is None else self.with_reference(ref_params, placed, micro_batch_size)

  def logprobs(self, params, tokens, attention_mask, micro_batch_size: int | None = None):
    """(B, T) token log-probs in the loss's alignment, `micro_batch_size` rows at a time (None: all)."""
    return self.logprobs_jit(params, micro_batch_size)(params, tokens, attention_mask)

  def logprobs_jit(self, params, micro_batch_size: int | None = None):
    """The jitted `(params, tokens, attention_mask) -> (B, T) log-probs`."""
    t = self.settings.train

    def build():
      return train_lib.make_logprob_fn(self.graphdef, temperature=t.temperature, micro_batch_size=micro_batch_size,
                                       compute_dtype=t.compute_dtype,
                                       in_shardings=(self.param_shardings(params), self.rows, self.rows),
                                       out_shardings=self.rows)
    return self._cached(("logprobs", micro_batch_size), build)

  def train_logprobs(self, params, batch, *, whole: bool = False):
    """(B, W) log-probs over a placed batch's loss window by the train step's own forward (recomputed
    old log-probs, train.recompute_logprobs). whole: the batch is one pass (a length-bucketed
    micro-batch), else the train micro-batches of the padded step."""
    return self.train_logprobs_jit(params, whole)(params, batch)

  def train_logprobs_jit(self, params, whole: bool = False):
    """The jitted `(params, batch) -> (B, W)` of train_logprobs."""
    cfg = self.settings.train.replace(micro_batch_size=None) if whole else self.settings.train

    def build():
      return train_lib.make_train_logprob_fn(self.graphdef, cfg, in_shardings=(self.param_shardings(params), self.rows),
                                             out_shardings=self.rows)
    return self._cached(("train_logprobs", whole), build)

  def with_reference(self, ref_params, batch, micro_batch_size: int | None = None):
    """A placed batch plus `ref_logprobs`: the frozen reference policy's log-probs over the loss
    window (the KL term of the loss, train.kl_coef)."""
    window = batch["loss_mask"].shape[1]
    lp = self.logprobs(ref_params, batch["tokens"], batch["attention_mask"], micro_batch_size)
    return {**batch, "ref_logprobs": lp[:, lp.shape[1] - window:]}

  def rollout_engine(self, tokenizer, sampling) -> RolloutEngine:
    """The run's rollout engine (sampling/factory.py), built on first use and kept. `sampling` is
    config.sampling. "continuous": slots over the batch axes and KV heads over tensor of
    `self.sampler_mesh` (if set, e.g. a host-local mesh) or `self.mesh`, as many slots per device as
    sampling.memory_budget_gb allows (0: batching.device_memory_budget), its cache kept between calls;
    on a mesh that spans processes (its host reads need every slot local) it falls back to "static".
    "static": prefill/decode through this mesh (ShardedSampler). "vllm": vLLM in its own process
    (sampling/vllm_engine.py; options from config.sampling, `vllm_options`). To plug in another
    engine, assign `rollout`."""
    if self.rollout is None:
      from compassplay_jax.sampling import batching
      from compassplay_jax.sampling.factory import make_engine
      name = sampling.engine
      mesh = getattr(self, "sampler_mesh", None) or self.mesh
      if name == "continuous" and not all(d.process_index == jax.process_index() for d in mesh.devices.flat):
        _log.warning("sampling.engine='continuous' needs a host-local mesh (engine.sampler_mesh); "
                     "this mesh spans processes, so rollouts use the static engine")
        name = "static"
      if name == "vllm":  # vLLM in its own venv process (sampling/vllm_engine.py)
        from compassplay_jax.sampling.vllm_engine import vllm_options
        self.rollout = make_engine(name, self.graphdef, tokenizer, **vllm_options(sampling))
      elif name == "continuous":
        budget_gb = float(sampling.memory_budget_gb)
        budget = int(budget_gb * 2 ** 30) if budget_gb > 0 else batching.device_memory_budget(mesh.devices.flat)
        kv_layout = sampling.get("kv_layout", "auto")  # "auto": paged (on any mesh: pages over the batch shards)
        self.rollout = make_engine(name, self.graphdef, tokenizer, mesh=mesh, memory_budget_bytes=budget,
                                   chunk_tokens=sampling.chunk_tokens, kv_layout=kv_layout,
                                   paged_attention=sampling.get("paged_attention", "auto"))
      else:
        self.rollout = make_engine(name, self.graphdef, tokenizer, device_fns=self.local_sampler)
    return self.rollout

  def generate_shared(self, params, tokenizer, sampling, requests: Sequence, cfg, key, shares, on_finish=None):
    """This process's share of the requests (`shares.take` of them: ids or sampling Requests) through
    the run's rollout engine (config.sampling `sampling` names it), every process's rows then gathered
    into one prompt-major GenerationResult. on_finish rows are indices among all prompts' rows."""
    rollout = self.rollout_engine(tokenizer, sampling)
    rollout.update_params(self.sampler_params(params))  # cast once per update, on the sampler mesh
    if shares.count == 1:
      return rollout.generate(requests, cfg, key, on_finish=on_finish)
    offset = shares.start * cfg.n_samples  # this share's first row among all prompts' rows
    local_finish = None if on_finish is None else (lambda row, *rest: on_finish(row + offset, *rest))
    local = (rollout.generate(requests, cfg, jax.random.fold_in(key, shares.start), on_finish=local_finish)
             if requests else None)
    return gather_generation(local, shares, cfg.n_samples)

  def greedy_queue(self, params, tokenizer, sampling, prompts: Sequence[str], budgets: Sequence[int],
                   on_finish=None) -> list[str]:
    """Greedy completions through the run's rollout engine (evaluation): every prompt in one generate
    call, so the engine fills its slots from one queue, each with its own budget and no stop string;
    weights cast to the compute dtype once (sampler_params). Across processes each host decodes its
    share. on_finish(row, ...) as each row is final (a progress bar)."""
    from compassplay_jax.infra import distributed
    from compassplay_jax.sampling import SamplingConfig
    from compassplay_jax.sampling.batching import prompt_buckets
    from compassplay_jax.sampling.prompts import encode_prompts
    from compassplay_jax.sampling.rollout_engine import Request
    if len(budgets) != len(prompts):
      raise ValueError(f"greedy_queue: {len(budgets)} budgets for {len(prompts)} prompts")
    ids = encode_prompts(tokenizer, list(prompts))
    shares = distributed.Shares.of(len(ids))
    # Hosts take contiguous blocks of the queue: deal the prompts round-robin first (a benchmark's prompts
    # sit together, and its budgets and lengths with them), so each host gets a like mix of them.
    order = dealt_order(len(ids), shares.count)
    requests = [Request(ids[i], max_new_tokens=int(budgets[i])) for i in shares.take(order)]
    cfg = SamplingConfig(temperature=0.0, n_samples=1, max_new_tokens=max(int(b) for b in budgets),
                         bucket_lengths=prompt_buckets(max(len(p) for p in ids)))
    finish = None if on_finish is None else (lambda row, *rest: on_finish(order[row], *rest))
    texts = self.generate_shared(params, tokenizer, sampling, requests, cfg, 0, shares, on_finish=finish).texts
    out = [""] * len(ids)
    for row, i in enumerate(order):
      out[i] = texts[row]
    return out

  def evaluation_queue(self, params, tokenizer, sampling, eval_config):
    """The harness's generate_queue (evals/harness.evaluate): (prompts, budgets) -> greedy completions,
    by eval_config.engine: "rollout" (greedy_queue: one queue of the run's rollout engine, `sampling`
    being config.sampling) or "static" (greedy_texts, eval_config.batch_size prompts a call); with
    eval_config.progress, a progress bar over prompts on process 0."""
    import contextlib
    import tqdm

    def generate(prompts, budgets):
      bar = tqdm.tqdm(total=len(prompts), desc=f"eval generate ({eval_config.engine})", unit="prompt",
                      dynamic_ncols=True, disable=not eval_config.progress or jax.process_index() != 0)
      with contextlib.closing(bar):
        if eval_config.engine == "rollout":
          return self.greedy_queue(params, tokenizer, sampling, prompts, budgets, on_finish=lambda *_: bar.update(1))
        return self.greedy_texts(params, tokenizer, prompts, list(budgets), int(eval_config.batch_size),
                                 on_batch=bar.update)
    return generate

  def greedy_texts(self, params, tokenizer, prompts: Sequence[str], max_new_tokens: int | Sequence[int],
                   micro_batch_size: int, on_batch=None) -> list[str]:
    """Greedy completions through the static sampler (SOAR's held-out answers; evaluation with
    eval.engine="static"). max_new_tokens: one budget for all (one generate call), or one per prompt:
    then prompts of one budget go shortest first in calls of `micro_batch_size` (on_batch(n) after each)."""
    from compassplay_jax.sampling import SamplingConfig, generate
    mbs = sh.round_to_mesh(micro_batch_size, self.mesh)

    def texts(batch, budget):
      config = SamplingConfig(temperature=0.0, max_new_tokens=int(budget), micro_batch_size=mbs)
      return generate(self.graphdef, params, tokenizer, list(batch), config, 0, device_fns=self.sampler).texts

    if isinstance(max_new_tokens, (int, np.integer)):
      return texts(prompts, max_new_tokens)
    budgets = list(max_new_tokens)
    if len(budgets) != len(prompts):
      raise ValueError(f"greedy_texts: {len(budgets)} budgets for {len(prompts)} prompts")
    out = [""] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: (budgets[i], len(prompts[i])))
    for _, group in itertools.groupby(order, key=lambda i: budgets[i]):
      group = list(group)
      for k in range(0, len(group), micro_batch_size):
        batch = group[k:k + micro_batch_size]
        for i, text in zip(batch, texts([prompts[i] for i in batch], budgets[batch[0]])):
          out[i] = text
        if on_batch is not None:
          on_batch(len(batch))
    return out


def dealt_order(n: int, count: int) -> list[int]:
  """0..n-1 reordered so that each of `count` contiguous shares (distributed.Shares: process p holds
  positions [p * size, (p + 1) * size)) gets items dealt in turn from the whole range, in proportion
  to its size."""
  size = -(-n // count) if n else 0
  room = [max(0, min(size, n - p * size)) for p in range(count)]
  hands: list[list[int]] = [[] for _ in range(count)]
  for i in range(n):  # to the share least filled for its size: a short last share is spread out too
    p = min((q for q in range(count) if len(hands[q]) < room[q]), key=lambda q: (len(hands[q]) / room[q], q))
    hands[p].append(i)
  return [i for hand in hands for i in hand]


def gather_generation(local, shares, n_samples: int):
  """One prompt-major GenerationResult over all prompts from each process's result on its share
  (None for an empty share)."""
  from compassplay_jax.infra import distributed
  from compassplay_jax.sampling.generate import GenerationResult
  parts = [p for p in distributed.allgather_objects(local) if p is not None]
  fields = {name: [x for p in parts for x in getattr(p, name)] for name in
            ("prompt_tokens", "tokens", "logprobs", "finish_reasons")}
  has_texts = all(p.texts is not None for p in parts)
  rows = np.arange(shares.n * n_samples)
  return GenerationResult(prompt_index=rows // n_samples, sample_index=rows % n_samples,
                          lengths=np.concatenate([np.asarray(p.lengths) for p in parts]),
                          texts=[t for p in parts for t in p.texts] if has_texts else None, **fields)


class _NoState:
  """An optimizer stand-in whose init allocates nothing (init_train_state's cast only)."""

  def init(self, params):
    return None


# ---- the sampler's device functions ---------------------------------------------------------------

_HOST_READ = ("step", "tokens", "logprobs", "lengths", "done", "hit_eos")  # DecodeState fields the host reads


def decode_state_shardings(mesh: Mesh, state):
  """sharding.decode_state_shardings, except that across processes the small per-row fields the
  host reads every chunk (tokens, log-probs, lengths, flags) are replicated: a process can only read
  arrays it holds whole. The KV cache stays split (rows over (data, fsdp), kv heads over tensor)."""
  out = sh.decode_state_shardings(mesh, state)
  if jax.process_count() == 1:
    return out
  return out._replace(**{name: sh.replicated(mesh) for name in _HOST_READ})


class ShardedSampler:
  """sampling.decode's prefill and decode, jitted with explicit in/out shardings on `mesh`.

  Same call signatures as `decode.prefill` / `decode.decode` (graphdef first, sampler knobs as
  keywords), so it is the `device_fns` of sampling.generate. One jit per (static knobs, input
  shapes); the decode state is donated call to call so the KV cache is updated in place.
  """

  def __init__(self, mesh: Mesh, head_dim: int | None = None):
    self.mesh, self.head_dim = mesh, head_dim
    self._cache = {}
    # The undecorated functions: jitted here with shardings instead of decode's own jit.
    self._prefill, self._decode = decode_lib.prefill.__wrapped__, decode_lib.decode.__wrapped__

  def _rows(self, shape):
    return NamedSharding(self.mesh, sh.fit_spec(P(sh.BATCH_AXES), shape, self.mesh))

  def _put(self, x, sharding):
    """Across processes, host inputs become global arrays (each process gives its devices' slices);
    on one process jit places them itself."""
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
      return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = sh.put_global(np.asarray(jax.random.key_data(x)), sharding)
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return sh.put_global(np.asarray(x), sharding)

  def prefill(self, graphdef, params, input_ids, prompt_mask, prompt_index, row_live, key, **static):
    fn, in_sh = self.prefill_jit(graphdef, params, input_ids, prompt_mask, prompt_index, row_live, key, **static)
    host = tuple(self._put(x, s) for x, s in zip((input_ids, prompt_mask, prompt_index, row_live), in_sh[1:5]))
    return fn(params, *host, self._put(key, in_sh[5]))

  def prefill_jit(self, graphdef, params, input_ids, prompt_mask, prompt_index, row_live, key, **static):
    """(the jitted prefill `prefill` calls for these arguments' shapes, its in_shardings); the
    arguments may be ShapeDtypeStructs."""
    args = (params, input_ids, prompt_mask, prompt_index, row_live, key)
    sig = ("prefill", graphdef, tuple(sorted(static.items())), tuple(_shape(x) for x in jax.tree.leaves(args[1:])))
    if sig not in self._cache:
      def prefill(p, *rest):
        return self._prefill(graphdef, p, *rest, **static)
      fn = prefill
      p_sh = sh.tree_shardings(params, self.mesh, self.head_dim)
      state = jax.eval_shape(fn, *args)
      in_sh = (p_sh,) + tuple(self._rows(_shape(x)) for x in args[1:5]) + (sh.replicated(self.mesh),)
      self._cache[sig] = (sh.jit(fn, in_shardings=in_sh, out_shardings=decode_state_shardings(self.mesh, state)),
                          in_sh)
    return self._cache[sig]

  def decode(self, graphdef, params, state, stop_at, host_done, **static):
    fn, in_sh = self.decode_jit(graphdef, params, state, stop_at, host_done, **static)
    return fn(params, state, self._put(stop_at, in_sh[2]), self._put(host_done, in_sh[3]))

  def decode_jit(self, graphdef, params, state, stop_at, host_done, **static):
    """(the jitted decode `decode` calls for this state's shapes, its in_shardings); the state is
    donated. The arguments may be ShapeDtypeStructs."""
    sig = ("decode", graphdef, tuple(sorted(static.items())),
           tuple(_shape(x) for x in jax.tree.leaves((state, host_done))))
    if sig not in self._cache:
      def decode(p, st, stop, done):
        return self._decode(graphdef, p, st, stop, done, **static)
      fn = decode
      p_sh = sh.tree_shardings(params, self.mesh, self.head_dim)
      s_sh = decode_state_shardings(self.mesh, state)
      in_sh = (p_sh, s_sh, sh.replicated(self.mesh), self._rows(_shape(host_done)))
      self._cache[sig] = (sh.jit(fn, in_shardings=in_sh, out_shardings=s_sh, donate_argnums=(1,)), in_sh)
    return self._cache[sig]


def _shape(x) -> tuple[int, ...]:
  return tuple(getattr(x, "shape", ()))
