"""A self-play run as an object, one step per call: what `python -m compassplay_jax.main` loops over.

    session = Session.create(config, workdir)     # build, restore the latest checkpoint if any
    metrics = session.step()                      # selfplay/step.run_step, evaluated when due, logged and saved
    session.reference_loss()                      # the solver's mean loss on the setting's reference set
    session.close()

`selfplay/run.py`'s loop is `for _ in steps: session.step()` plus its progress bar and the end-of-run
summary; notebooks (experiments/colab_ablation.ipynb) and tools call the same `step`. Every step
writes its metrics line to workdir/metrics.jsonl and its checkpoint, exactly as the command does.
"""
from __future__ import annotations

import contextlib
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax import settings
from compassplay_jax.infra import compile_cache, distributed, profiling
from compassplay_jax.runtime import config_base
from compassplay_jax.infra.checkpoint import CheckpointManager
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.infra.metrics import MetricsWriter, last_value, truncate_metrics
from compassplay_jax.runtime.model_setup import build_model
from compassplay_jax.selfplay import in_loop_eval as evaluation
from compassplay_jax.selfplay import step as step_lib


class Session:
  """The state of one run between steps: params, optimizer state, key, the setting and its writers."""

  def __init__(self, config, workdir, *, engine, graphdef, params, opt_state, ref_params, key, start, setting,
               tokenizer, manager, writer, compiles):
    self.config, self.workdir = config, pathlib.Path(workdir)
    self.engine, self.graphdef, self.params, self.opt_state = engine, graphdef, params, opt_state
    self.ref_params, self.key, self.start, self.step_count = ref_params, key, start, start
    self.setting, self.tokenizer, self.manager, self.writer, self.compiles = setting, tokenizer, manager, writer, compiles
    self.accelerator_s_total = last_value(self.workdir, "cost/accelerator_s_total") if start else 0.0
    self.eval_items = None
    self.stopped = False  # the last step was saved because `step`'s stop asked for it (selfplay/run.py)
    self.update_options = step_lib.UpdateOptions.from_config(config, tokenizer.pad_token_id)

  @classmethod
  def create(cls, config, workdir, *, sampler=None) -> "Session":
    """Checks the config, builds the model, engine and setting, and restores workdir's latest checkpoint.
    sampler: rollout.sample's signature for the setting (default rollout.sample; tests script one)."""
    from compassplay_jax.infra import sharding as sh
    from compassplay_jax.infra.backend import describe_backend
    from compassplay_jax.selfplay.data_files import prepare_config
    # Multi-host: join the run before anything asks JAX about processes or devices.
    distributed.initialize()  # from COMPASSPLAY_* variables; a no-op on one host
    workdir = pathlib.Path(workdir)
    # Everything that can be wrong with the input is checked before any model is loaded.
    prepare_config(config)  # data: paths -> files in the data directory; missing ones name their fetch command
    config_base.check_config(config)
    spec = settings.of(config)
    spec.validate(config)
    evaluation.check(config)
    compile_cache.enable(config.compile_cache_dir)  # before anything compiles
    compiles = compile_cache.CompileStats()
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
      (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    print(f"[compassplay] {config.setting}:{config.variant} -> {workdir}", flush=True)
    print(f"[compassplay] {describe_backend()}", flush=True)
    mesh = sh.make_mesh(config.mesh)
    if mesh.size > 1:
      print(f"[compassplay] mesh {sh.mesh_summary(mesh)}", flush=True)
    model, tokenizer = build_model(config, mesh)
    graphdef, params = nnx.split(model)
    del model
    # Every compiled device function of the run, with its shardings; micro-batches rounded to the mesh.
    engine = Engine.build(graphdef, params, mesh, EngineSettings.from_config(config))
    if engine.settings.train.micro_batch_size != config.train.micro_batch_size:
      print(f"[compassplay] train micro-batch {config.train.micro_batch_size} -> "
            f"{engine.settings.train.micro_batch_size} rows (a multiple of data*fsdp)", flush=True)
    setting = spec.build(config, tokenizer, sampler)
    try:
      # The KL term's frozen reference policy: the initial params, laid out like the policy (kept apart
      # from them, which the train step donates).
      ref_params = engine.place_params(jax.tree.map(jnp.copy, params)) if config.train.kl_coef > 0 else None
      params, opt_state = engine.init_train_state(params)
      manager = CheckpointManager(workdir / "checkpoints", keep=config.checkpoint.keep,
                                  save_every=config.checkpoint.every_steps, async_save=config.checkpoint.async_save)
      key = jax.random.key(config.seed)
      start = 0
      if manager.latest_step() is not None:
        start, params, opt_state, key, extra = manager.restore(params=params, opt_state=opt_state)
        setting.load_state_dict(extra["selfplay"])
        print(f"[compassplay] resumed from step {start}", flush=True)
      if jax.process_index() == 0:
        # Steps logged after the last checkpoint (or before the first one, the step-0 evaluation
        # included) are run again: drop them.
        truncate_metrics(workdir, start if start else -1)
      writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
    except BaseException:
      setting.close()
      raise
    return cls(config, workdir, engine=engine, graphdef=graphdef, params=params, opt_state=opt_state,
               ref_params=ref_params, key=key, start=start, setting=setting, tokenizer=tokenizer, manager=manager,
               writer=writer, compiles=compiles)

  def step(self, progress: Callable[[str], Any] | None = None,
           stop: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Runs the next step (selfplay/step.run_step: plan -> propose -> verify -> score -> rows -> commit
    -> advantages -> update), evaluates when due, logs it to metrics.jsonl, checkpoints it and returns
    its metrics. `progress` is told the phase as it starts. `stop(step)`, asked once the metrics line
    is written (preemption.Watcher.should_stop): when true the step is saved whatever the checkpoint
    interval and `self.stopped` is set, for the caller to stop after it."""
    config = self.config
    self.step_count += 1
    step = self.step_count
    compiled_before = self.compiles.totals()
    self.key, key = jax.random.split(self.key)
    with profiling.step_trace(config.profile, step, self.workdir):  # a no-op unless config.profile.steps names it
      result = step_lib.run_step(self.setting, self.engine, self.params, self.opt_state, step, key,
                                 update=self.update_options, ref_params=self.ref_params, progress=progress)
    self.params, self.opt_state = result.params, result.opt_state
    metrics = dict(result.metrics)
    compiled_after = self.compiles.totals()
    metrics.update({k: compiled_after[k] - compiled_before[k] for k in compiled_after})
    if evaluation.due(config, step):
      metrics.update(self.evaluate(step))
    self._add_cost(metrics)
    # What must be global is the same on every process (a no-op on one): else stop, naming the field.
    extras = {"selfplay": self.setting.state_dict(), "step": step}
    distributed.check_agreement(step, {
        **{f"selfplay state [{name}]": value for name, value in extras["selfplay"].items()},
        "candidate records": metrics.get("candidates", []), "checkpoint extras": extras,
        "metrics": {k: v for k, v in metrics.items()
                    if not k.startswith(("time/", "cost/", "compile/", "memory/")) and k != "tokens_per_s"}})
    self.writer.write(step, metrics)
    self.stopped = bool(stop is not None and stop(step))
    self.manager.save(step, self.params, self.opt_state, self.key, extras, force=step == config.steps or self.stopped)
    return metrics

  def evaluate(self, step: int) -> dict[str, float]:
    """Greedy evaluation of the current params on config.eval's benchmarks: {eval/<benchmark>: accuracy,
    time/eval: seconds}."""
    if self.eval_items is None:
      self.eval_items = evaluation.load_items(self.config)
    return evaluation.evaluate(self.config, self.engine, self.params, self.tokenizer, step, self.workdir,
                               self.eval_items)

  def evaluate_base(self) -> dict[str, float]:
    """The step-0 evaluation (the base model, before any update), logged as metrics line 0: the
    report's base-model row. Only on a fresh run whose config evaluates at step 0 (evaluation.due)."""
    metrics = self.evaluate(0)
    self._add_cost(metrics)
    self.writer.write(0, metrics)
    return metrics

  def _add_cost(self, metrics: dict) -> None:
    """The cost axis of the reports (docs/experiments.md): wall time x devices of the step and of its
    evaluation (time/eval, when it ran), and the running sum; the evaluation's share also on its own."""
    devices = jax.device_count()
    metrics["cost/eval_accelerator_s"] = metrics.get("time/eval", 0.0) * devices
    metrics["cost/accelerator_s"] = metrics.get("time/step", 0.0) * devices + metrics["cost/eval_accelerator_s"]
    self.accelerator_s_total += metrics["cost/accelerator_s"]
    metrics["cost/accelerator_s_total"] = self.accelerator_s_total

  def reference_loss(self) -> float:
    """The solver's mean per-sequence loss on the setting's reference set at the current params (its
    spec's reference_set; coding: the MATH-train gold solutions, whatever the reward). NaN when the
    setting has none."""
    reference = settings.of(self.config).reference_set(self.setting)
    if reference is None:
      return float("nan")
    batch = self.engine.put_batch(self.engine.pad_rows(
        {k: np.asarray(getattr(reference, k)) for k in ("tokens", "loss_mask", "attention_mask")}))
    return float(distributed.to_host(self.engine.mean_loss(self.params, batch["tokens"], batch["loss_mask"],
                                                           batch["attention_mask"])))

  def close(self) -> None:
    """Waits for the last checkpoint, closes the writers, the setting (its sandbox or Lean pool) and the
    engine's compile-ahead thread; each is closed even when one before it fails (a checkpoint write that
    failed raises CheckpointError)."""
    with contextlib.ExitStack() as closing:  # runs last-in first: manager, writer, setting, compile-ahead
      closing.callback(self.engine.ahead.close)
      closing.callback(self.setting.close)
      closing.callback(self.writer.close)
      closing.callback(self.manager.close)
      self.manager.wait_until_finished()

  def __enter__(self) -> "Session":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
