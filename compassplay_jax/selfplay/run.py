"""The training run behind `python -m compassplay_jax.main`: build, restore, loop, checkpoint, summarize."""
from __future__ import annotations

import json
import pathlib
import time

import jax
import numpy as np
import tqdm
from flax import nnx

from compassplay_jax.checkpoint import CheckpointError, CheckpointManager
from compassplay_jax.metrics import MetricsWriter, summary_line, truncate_metrics
from compassplay_jax.models.config import ConfigError
from compassplay_jax.models.safetensors_io import CheckpointError as WeightsError
from compassplay_jax.rl.train_step import TrainConfig, init_train_state, make_train_step
from compassplay_jax.selfplay.reference_set import ReferenceSetError
from compassplay_jax.selfplay.rollout import rows_to_batch

SETTINGS = ("coding", "lean")


from compassplay_jax.verifiers.lean_repl import LeanSetupError

# Errors that mean "bad input" (config, checkpoint, data files, missing Lean): printed as one line.
USER_ERRORS = (ConfigError, WeightsError, CheckpointError, ReferenceSetError, LeanSetupError, FileNotFoundError,
               ValueError)

SUMMARY_KEYS = [("proposer", "reward/proposer"), ("solver", "reward/solver"), ("valid", "valid_rate"),
                ("in-band", "in_band_rate"), ("cos", "cos_valid_mean"), ("coverage", "coverage"), ("loss", "train/loss"),
                ("tok/s", "tokens_per_s"), ("s", "time/step")]


def build_model(config, mesh=None):
  """(model, tokenizer) for config.model: a HF directory, a .gguf file, "smollm2-135m", or "tiny".

  With a multi-device mesh, a Hugging Face checkpoint is read straight into its sharded layout (each
  device's slice from the file); other sources are loaded, then placed by the partition rules.
  """
  from compassplay_jax import load_model
  from compassplay_jax import sharding as sh
  m = config.model
  if mesh is not None and mesh.size > 1:
    model, tokenizer = build_model(config) if not pathlib.Path(m.path).is_dir() else (None, None)
    if model is None:
      from compassplay_jax.models.config import ModelConfig
      head_dim = ModelConfig.from_hf_dir(m.path).head_dim
      model, tokenizer = load_model(m.path, dtype=m.dtype, param_dtype=m.param_dtype,
                                    shardings=sh.loader_shardings(mesh, head_dim))
    else:
      graphdef, params = nnx.split(model)
      model = nnx.merge(graphdef, sh.shard_params(params, mesh, model.config.head_dim))
    if m.remat:
      model.config = model.config.replace(remat=True)
    return model, tokenizer
  if not m.path:
    raise ConfigError("config.model.path: empty; set it to a Hugging Face checkpoint directory "
                      "(e.g. --config.model.path=/models/Qwen2.5-Coder-7B)")
  if m.path == "tiny":
    from compassplay_jax.models.config import ModelConfig
    from compassplay_jax.models.decoder import init_decoder
    from compassplay_jax.models.gguf_io import embedded_gguf_path, load_gguf_tokenizer
    tokenizer = load_gguf_tokenizer(embedded_gguf_path())
    cfg = ModelConfig(model_type="llama", vocab_size=len(tokenizer), hidden_size=m.tiny_hidden_size,
                      intermediate_size=2 * m.tiny_hidden_size, num_hidden_layers=m.tiny_layers,
                      num_attention_heads=m.tiny_heads, num_key_value_heads=m.tiny_kv_heads, tie_word_embeddings=True,
                      dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat)
    return init_decoder(cfg, seed=config.seed), tokenizer
  model, tokenizer = load_model(m.path, dtype=m.dtype, param_dtype=m.param_dtype)
  if m.remat:
    model.config = model.config.replace(remat=True)
  return model, tokenizer


def train_config(config) -> TrainConfig:
  t = config.train
  return TrainConfig(learning_rate=t.learning_rate, schedule=t.schedule, warmup_steps=t.warmup_steps,
                     total_steps=config.steps, b1=t.b1, b2=t.b2, weight_decay=t.weight_decay, grad_clip=t.grad_clip,
                     micro_batch_size=t.micro_batch_size, clip_eps_low=t.clip_eps_low, clip_eps_high=t.clip_eps_high,
                     entropy_coef=t.entropy_coef, kl_coef=t.kl_coef,
                     temperature=config.sampling.temperature if config.sampling.temperature > 0 else 1.0)


def make_setting(config, tokenizer, *, validate_only: bool = False):
  """The setting's self-play object (opens its sandbox or Lean pool). With validate_only, checks the
  config and data files without starting anything."""
  if config.setting not in SETTINGS:
    raise ConfigError(f"config.setting: {config.setting!r} is not one of {SETTINGS}")
  if config.setting == "coding":
    from compassplay_jax.selfplay import coding
    if validate_only:
      return coding.validate_config(config)
    from compassplay_jax.verifiers.sandbox import SandboxLimits, SandboxPool
    pool = SandboxPool(num_workers=config.sandbox.num_workers or None,
                       limits=SandboxLimits(timeout_s=config.sandbox.timeout_s))
    return coding.CodingSelfPlay(config, tokenizer, pool)
  from compassplay_jax.selfplay import lean
  if validate_only:
    return lean.validate_config(config)
  return lean.LeanSelfPlay(config, tokenizer)


def run(config, workdir: pathlib.Path) -> dict:
  """Trains for config.steps steps in workdir, resuming from its latest checkpoint. Returns the last metrics."""
  from compassplay_jax import distributed
  from compassplay_jax import sharding as sh
  from compassplay_jax.selfplay import rollout
  t_start = time.time()
  workdir = pathlib.Path(workdir)
  # Everything that can be wrong with the input is checked before any model is loaded.
  make_setting(config, None, validate_only=True)
  ckpt_dir = workdir / "checkpoints"
  workdir.mkdir(parents=True, exist_ok=True)
  if jax.process_index() == 0:
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  print(f"[compassplay] {config.setting}:{config.variant} -> {workdir}", flush=True)

  distributed.initialize()  # multi-host from COMPASSPLAY_* variables; a no-op on one host
  mesh = sh.make_mesh(config.mesh)
  if mesh.size > 1:
    if config.train.micro_batch_size % sh.batch_divisor(mesh):
      raise ConfigError(f"config.train.micro_batch_size={config.train.micro_batch_size} is not a multiple of "
                        f"data*fsdp={sh.batch_divisor(mesh)}")
    print(f"[compassplay] mesh {sh.mesh_summary(mesh)}", flush=True)
    rollout.DEVICE_FNS = sh.ShardedSampler(mesh)
  model, tokenizer = build_model(config, mesh)
  setting = make_setting(config, tokenizer)
  try:
    graphdef, params = nnx.split(model)
    del model
    tcfg = train_config(config)
    params, opt_state = init_train_state(params, tcfg)
    train_step = None  # built on the first batch (its shardings need the batch's structure)
    manager = CheckpointManager(ckpt_dir, keep=config.checkpoint.keep, save_every=config.checkpoint.every_steps)
    key = jax.random.key(config.seed)
    start = 0
    if manager.latest_step() is not None:
      start, params, opt_state, key, extra = manager.restore(params=params, opt_state=opt_state)
      setting.load_state_dict(extra["selfplay"])
      truncate_metrics(workdir, start)
      print(f"[compassplay] resumed from step {start}", flush=True)
    writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
    eval_items = None
    metrics = {}
    bar = tqdm.tqdm(range(start + 1, config.steps + 1), initial=start, total=config.steps, desc="self-play",
                    unit="step", dynamic_ncols=True, disable=None)
    for step in bar:
      t0 = time.time()
      key, k_collect, k_train = jax.random.split(key, 3)
      rows, metrics = setting.collect(graphdef, params, step, k_collect)
      metrics = dict(metrics)
      if rows:
        batch = rows_to_batch(rows, tokenizer.pad_token_id, config.train.micro_batch_size,
                              max_len=config.sampling.max_prompt_tokens + config.sampling.max_new_tokens)
        t1 = time.time()
        if train_step is None:
          train_step = (sh.jit_train_step(graphdef, tcfg, mesh, params, opt_state, batch) if mesh.size > 1
                        else make_train_step(graphdef, tcfg))
        params, opt_state, train_metrics = train_step(params, opt_state, batch, k_train)
        metrics.update({f"train/{k}": float(v) for k, v in jax.device_get(train_metrics).items()})
        metrics["time/update"] = time.time() - t1
        metrics["tokens/trained"] = int(batch["loss_mask"].sum())
        metrics["rows"] = len(rows)
      metrics["time/step"] = time.time() - t0
      if config.eval.every_steps and step % config.eval.every_steps == 0:
        eval_items = _evaluate(config, graphdef, params, tokenizer, step, workdir, eval_items, metrics)
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
  return metrics


def _evaluate(config, graphdef, params, tokenizer, step, workdir, items, metrics):
  """Greedy evaluation through the harness; adds eval/<benchmark> accuracies to metrics."""
  from compassplay_jax.evals import harness
  from compassplay_jax.sampling import SamplingConfig, generate
  items = items if items is not None else harness.load_items(config.eval)
  sampling = SamplingConfig(temperature=0.0, max_new_tokens=config.eval.max_new_tokens,
                            micro_batch_size=config.eval.batch_size)

  def generate_fn(prompts):
    return generate(graphdef, params, tokenizer, list(prompts), sampling, 0).texts

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


def restore_params(checkpoint_dir, step: int, params):
  """The params of a training checkpoint (optimizer state not needed), restored into `params`' layout."""
  tcfg = TrainConfig()
  params, opt_state = init_train_state(params, tcfg)
  with CheckpointManager(checkpoint_dir, create=False) as manager:
    _, restored, _, _, _ = manager.restore(step=step, params=params, opt_state=opt_state)
  return restored
