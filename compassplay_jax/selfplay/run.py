"""The training run behind `python -m compassplay_jax.main`: build, restore, loop, checkpoint, summarize."""
from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from flax import nnx

from compassplay_jax.checkpoint import CheckpointManager
from compassplay_jax.metrics import MetricsWriter, last_value, read_metrics, summary_line, truncate_metrics
from compassplay_jax.models.config import ConfigError
from compassplay_jax import compile_cache, config_base
from compassplay_jax.engine import Engine, EngineSettings
from compassplay_jax.model_setup import build_model, restore_params  # noqa: F401  (used by tests and tools)
from compassplay_jax.rl.train_step import TrainConfig
from compassplay_jax.selfplay import step as step_lib

SETTINGS = ("coding", "lean")

SUMMARY_KEYS = [("proposer", "reward/proposer"), ("solver", "reward/solver"), ("valid", "valid_rate"),
                ("in-band", "in_band_rate"), ("cos-paid", "cos_paid_count"), ("cos share", "cos_share"),
                ("cos", "cos_valid_mean"), ("coverage", "coverage"), ("loss", "train/loss"),
                ("tok/s", "tokens_per_s"), ("s", "time/step")]


def train_config(config) -> TrainConfig:
  """config.train's TrainConfig fields, plus the run length and the sampler's temperature (greedy: 1)."""
  return EngineSettings.from_config(config).train


def make_setting(config, tokenizer, engine=None, *, validate_only: bool = False):
  """The setting's self-play object (opens its sandbox or Lean pool), running its device work through
  `engine`. With validate_only, checks the config and data files without starting anything."""
  if config.setting not in SETTINGS:
    raise ConfigError(f"config.setting: {config.setting!r} is not one of {SETTINGS}")
  if config.setting == "coding":
    from compassplay_jax.selfplay import coding
    if validate_only:
      return coding.validate_config(config)
    from compassplay_jax.verifiers.sandbox import SandboxLimits, SandboxPool
    pool = SandboxPool(num_workers=config.sandbox.num_workers or None,
                       limits=SandboxLimits(timeout_s=config.sandbox.timeout_s))
    return coding.CodingSelfPlay(config, tokenizer, pool, engine=engine)
  from compassplay_jax.selfplay import lean
  if validate_only:
    return lean.validate_config(config)
  return lean.LeanSelfPlay(config, tokenizer, engine=engine)


def run(config, workdir: pathlib.Path) -> dict:
  """Trains for config.steps steps in workdir, resuming from its latest checkpoint. Returns the last metrics."""
  from compassplay_jax import distributed
  from compassplay_jax import sharding as sh
  # Multi-host: join the run before anything asks JAX about processes or devices.
  distributed.initialize()  # from COMPASSPLAY_* variables; a no-op on one host
  t_start = time.time()
  workdir = pathlib.Path(workdir)
  # Everything that can be wrong with the input is checked before any model is loaded.
  from compassplay_jax.data.paths import prepare_config
  prepare_config(config)  # data: paths -> files in the data directory; missing ones name their fetch command
  config_base.check_config(config)
  make_setting(config, None, validate_only=True)
  compile_cache.enable(config.compile_cache_dir)  # before anything compiles
  compiles = compile_cache.CompileStats()
  ckpt_dir = workdir / "checkpoints"
  workdir.mkdir(parents=True, exist_ok=True)
  if jax.process_index() == 0:
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  print(f"[compassplay] {config.setting}:{config.variant} -> {workdir}", flush=True)

  from compassplay_jax.backend import describe_backend
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
  setting = make_setting(config, tokenizer, engine)
  try:
    # The KL term's frozen reference policy: the initial params, laid out like the policy (kept apart
    # from them, which the train step donates).
    ref_params = engine.place_params(jax.tree.map(jnp.copy, params)) if config.train.kl_coef > 0 else None
    params, opt_state = engine.init_train_state(params)
    manager = CheckpointManager(ckpt_dir, keep=config.checkpoint.keep, save_every=config.checkpoint.every_steps)
    key = jax.random.key(config.seed)
    start = 0
    if manager.latest_step() is not None:
      start, params, opt_state, key, extra = manager.restore(params=params, opt_state=opt_state)
      setting.load_state_dict(extra["selfplay"])
      print(f"[compassplay] resumed from step {start}", flush=True)
    if jax.process_index() == 0:
      # Steps logged after the last checkpoint (or before the first one) are run again: drop them.
      truncate_metrics(workdir, start)
    writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
    accelerator_s_total = last_value(workdir, "cost/accelerator_s_total") if start else 0.0
    eval_items = None
    metrics = {}
    bar = tqdm.tqdm(range(start + 1, config.steps + 1), initial=start, total=config.steps, desc="self-play",
                    unit="step", dynamic_ncols=True, disable=None)
    max_len = config.sampling.max_prompt_tokens + config.sampling.max_new_tokens
    for step in bar:
      t0 = time.time()
      compiled_before = compiles.totals()
      key, k_collect, k_train = jax.random.split(key, 3)
      # propose -> verify -> reward (the setting's stages, selfplay/step.py)
      rows, metrics = setting.collect(graphdef, params, step, k_collect, progress=bar.set_postfix_str)
      metrics = dict(metrics)
      if rows:
        # advantages -> update. A setting may split its rows into several optimizer steps (Lean: SGS's
        # one epoch at batch 32); with micro_batch_tokens > 0 rows are packed by their real length.
        bar.set_postfix_str("update")
        chunks = setting.train_batches(rows, step) if hasattr(setting, "train_batches") else [rows]
        t1 = time.time()
        params, opt_state, train_metrics = step_lib.update(
            engine, params, opt_state, chunks, k_train, pad_id=tokenizer.pad_token_id, max_len=max_len,
            token_budget=config.train.micro_batch_tokens, ref_params=ref_params)
        metrics.update(train_metrics)
        metrics["time/update"] = time.time() - t1
      metrics["time/step"] = time.time() - t0
      # The cost axis of the reports: wall time x devices (docs/experiments.md); eval time not included.
      metrics["cost/accelerator_s"] = metrics["time/step"] * jax.device_count()
      accelerator_s_total += metrics["cost/accelerator_s"]
      metrics["cost/accelerator_s_total"] = accelerator_s_total
      compiled_after = compiles.totals()
      metrics.update({k: compiled_after[k] - compiled_before[k] for k in compiled_after})
      if config.eval.every_steps and step % config.eval.every_steps == 0:
        eval_items = _evaluate(config, engine, params, tokenizer, step, workdir, eval_items, metrics)
      writer.write(step, metrics)
      manager.save(step, params, opt_state, key, {"selfplay": setting.state_dict(), "step": step},
                   force=step == config.steps)
      bar.write(summary_line(step, config.steps, metrics, SUMMARY_KEYS))
    manager.wait_until_finished()
    manager.close()
    writer.close()
  finally:
    setting.close()
  summary = {"steps": config.steps, "resumed_from": start, "wall_s": round(time.time() - t_start, 1),
             "workdir": str(workdir), "last_metrics": {k: v for k, v in metrics.items() if not isinstance(v, list)}}
  distributed.write_text(workdir / "summary.json", json.dumps(summary, indent=2, default=float))
  print(_final_summary(summary), flush=True)
  if jax.process_index() == 0:
    print(_proposer_summary(workdir), flush=True)
  return metrics


def _evaluate(config, engine, params, tokenizer, step, workdir, items, metrics):
  """Greedy evaluation through the harness (the engine's sampler); adds eval/<benchmark> accuracies."""
  from compassplay_jax.evals import harness
  items = items if items is not None else harness.load_items(config.eval)

  def generate_fn(prompts):
    return engine.greedy_texts(params, tokenizer, prompts, config.eval.max_new_tokens, config.eval.batch_size)

  results = harness.evaluate(generate_fn, tokenizer, items, eval_config=config.eval, step=step, workdir=str(workdir))
  for name, result in results.get("benchmarks", {}).items():
    metrics[f"eval/{name}"] = result["accuracy"]
  return items


def _final_summary(summary) -> str:
  m = summary["last_metrics"]
  lines = [f"[compassplay] done: {summary['steps']} steps in {summary['wall_s']} s "
           f"(resumed from step {summary['resumed_from']}); workdir {summary['workdir']}"]
  for label, key in SUMMARY_KEYS:
    if key in m:
      lines.append(f"  {label:>10}: {m[key]:.4g}")
  lines.append(f"  metrics: {summary['workdir']}/metrics.jsonl, TensorBoard: {summary['workdir']}/tensorboard, "
               f"checkpoints: {summary['workdir']}/checkpoints")
  return "\n".join(lines)


def _proposer_summary(workdir: pathlib.Path) -> str:
  """The last step's candidates as a table and the PNG of cosines and proposer rates (coding runs)."""
  from compassplay_jax.selfplay import summary as proposer
  records = read_metrics(workdir)
  last = next((r for r in reversed(records) if r.get("candidates")), None)
  if last is None:
    return ""
  png = proposer.write_png(workdir / proposer.PNG_NAME, records)
  return f"{proposer.candidate_table(last['step'], last['candidates'])}\n  plot: {png}"
