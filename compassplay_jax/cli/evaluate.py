r"""Evaluates checkpoints on the benchmarks and plots accuracy against step.

  python -m compassplay_jax.cli.evaluate --config=configs/coding.py \
      --checkpoint=/runs/a/checkpoints/step_100,/runs/a/checkpoints/step_200 \
      --benchmarks=cruxeval_i,cruxeval_o,livecodebench_execution,math500

Outputs go to <workdir>/eval/step_<N>/ (see docs/evaluation.md). With --plot_runs=dir1,dir2 and no
--checkpoint it only draws the history plot of existing runs (several runs = seeds: mean ± s.d.).
"""
import pathlib
import re

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from compassplay_jax.core.errors import InputNotFound
from compassplay_jax.evals import harness
from compassplay_jax.evals import report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file; its `eval` block is read.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Checkpoint path(s), comma-separated.")
_BENCHMARKS = flags.DEFINE_string("benchmarks", "", "Overrides config.eval.benchmarks (comma list or 'all').")
_WORKDIR = flags.DEFINE_string("workdir", "", "Overrides config.eval.workdir / config.workdir.")
_STEP = flags.DEFINE_integer("step", None, "Step of a single checkpoint (default: parsed from its path).")
_PLOT_RUNS = flags.DEFINE_string("plot_runs", "", "Run dirs to plot together (seeds), comma-separated.")


def _load_generate_fn(config, checkpoint: str):
  """(generate_queue, tokenizer) for a checkpoint; generate_queue(prompts, budgets) -> greedy completions
  through the engine (config.eval.engine: the rollout engine's one queue, or the static sampler).

  `checkpoint` is a training checkpoint (<run>/checkpoints/<step>, built from config.model and
  restored with orbax), anything `load_model` takes (a Hugging Face directory, a .gguf file,
  "smollm2-135m"), or "tiny" (config.model's random tiny model, for tests).
  """
  from flax import nnx
  from compassplay_jax.runtime.model_setup import build_model, restore_params
  config = complete_config(config)
  path = pathlib.Path(checkpoint)
  if checkpoint == "tiny":
    model, tokenizer = build_model(_with_model_path(config, "tiny"))
    graphdef, params = nnx.split(model)
  elif path.parent.name == "checkpoints" and path.name.isdigit():
    if not path.is_dir():
      raise InputNotFound(f"{checkpoint}: checkpoint directory does not exist")
    model, tokenizer = build_model(config)
    graphdef, params = nnx.split(model)
    params = restore_params(path.parent, int(path.name), params)
  else:
    from compassplay_jax.models.loading import load_model
    model, tokenizer = load_model(checkpoint, dtype=config.model.dtype)
    graphdef, params = nnx.split(model)
  # Greedy generation through a device engine (the run loop's path), on every local device.
  from compassplay_jax.infra import sharding as sh
  from compassplay_jax.runtime.engine import Engine, EngineSettings
  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings.from_config(config))
  params = engine.place_params(params)
  return engine.evaluation_queue(params, tokenizer, config.sampling, harness.with_defaults(config.eval)), tokenizer


def complete_config(config):
  """`config` with every field evaluation reads: config_base's defaults (their one source) under the
  fields `config` sets (a run's config, or a partial one holding only an eval block)."""
  from compassplay_jax.runtime import config_base
  out = config_base.base_config("coding", "eval")
  out.update(config)
  return out


def _with_model_path(config, path):
  """A copy of config whose model.path is `path`."""
  out = complete_config(config)
  out.model.path = path
  return out


def step_from_path(checkpoint: str) -> int:
  """The trailing number of a checkpoint path (…/step_200, …/checkpoint-200, …/200)."""
  match = re.search(r"(\d+)/*$", checkpoint)
  if not match:
    raise ValueError(f"--checkpoint: cannot read a step from {checkpoint!r}; pass --step")
  return int(match.group(1))


def eval_workdir(config, override: str = "") -> str:
  config = complete_config(config)
  return override or config.eval.workdir or config.workdir


def run(config, checkpoints: list[str], benchmarks: str = "", workdir: str = "", step=None,
        load_generate_fn=_load_generate_fn) -> pathlib.Path | None:
  """Evaluates each checkpoint, then writes <workdir>/eval/history.png; returns the plot path."""
  config = complete_config(config)
  eval_config = config.eval.to_dict()
  if not eval_config["data_dir"] and config.data_dir:  # "" = the run's data directory (docs/data.md)
    from compassplay_jax.data import paths
    eval_config["data_dir"] = str(paths.data_dir(config.data_dir))
  if benchmarks:
    eval_config["benchmarks"] = benchmarks
  out_root = eval_workdir(config, workdir)
  if not out_root:
    raise ValueError("config.eval.workdir: no workdir set (set it, config.workdir, or --workdir)")
  items = harness.load_items(eval_config)
  for checkpoint in checkpoints:
    ckpt_step = step if step is not None and len(checkpoints) == 1 else step_from_path(checkpoint)
    generate_queue, tokenizer = load_generate_fn(config, checkpoint)
    summary = harness.evaluate(None, tokenizer, items, eval_config=eval_config, step=ckpt_step,
                               workdir=out_root, generate_queue=generate_queue)
    logging.info("step %d: %s", ckpt_step, pathlib.Path(summary["out_dir"]) / "results.md")
    print(report.markdown_table(summary))
  return report.plot_history([out_root], pathlib.Path(out_root) / "eval" / "history.png")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  checkpoints = [c for c in _CHECKPOINT.value.split(",") if c]
  plot_runs = [r for r in _PLOT_RUNS.value.split(",") if r]
  if plot_runs and not checkpoints:
    out = pathlib.Path(_WORKDIR.value or plot_runs[0]) / "eval" / "history_runs.png"
    print(report.plot_history(plot_runs, out))
    return
  if _CONFIG.value is None or not checkpoints:
    raise app.UsageError("--config and --checkpoint are required (or --plot_runs alone)")
  print(run(_CONFIG.value, checkpoints, _BENCHMARKS.value, _WORKDIR.value, _STEP.value))


def entry():
  """Runs main; a missing checkpoint or a bad data file ends with one line on stderr."""
  import os
  import sys
  try:
    app.run(main)
  except (FileNotFoundError, ValueError) as e:
    if os.environ.get("COMPASSPLAY_TRACEBACK"):
      raise
    print(f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  entry()
