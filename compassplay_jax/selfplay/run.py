"""The training run behind `python -m compassplay_jax.main`: build, restore, loop, checkpoint, summarize.

Building, restoring and the step itself are selfplay/session.py's `Session`; this is the loop around it."""
from __future__ import annotations

import json
import pathlib
import time

import jax
import tqdm

from compassplay_jax import settings
from compassplay_jax.infra import preemption
from compassplay_jax.infra.metrics import read_metrics, summary_line
from compassplay_jax.runtime.engine import EngineSettings
from compassplay_jax.runtime.model_setup import build_model, restore_params  # noqa: F401  (used by tests and tools)
from compassplay_jax.rl.train_step import TrainConfig
from compassplay_jax.selfplay.session import Session
from compassplay_jax.selfplay import in_loop_eval as evaluation

# The per-step line: the candidate records' metrics (selfplay/records.py), the setting's own keys
# (its spec's summary_keys), then the update's and the step's.
CANDIDATE_KEYS = [("proposer", "reward/proposer"), ("solver", "reward/solver"), ("valid", "valid_rate"),
                  ("in-band", "in_band_rate"), ("cos-paid", "cos_paid_count"), ("cos share", "cos_share"),
                  ("cos", "cos_valid_mean")]
STEP_KEYS = [("loss", "train/loss"), ("tok/s", "tokens_per_s"), ("overlap", "overlap"), ("s", "time/step")]


def summary_keys(config) -> list[tuple[str, str]]:
  """(label, metric key) of the per-step line and the final summary, for config.setting."""
  return CANDIDATE_KEYS + list(settings.of(config).summary_keys) + STEP_KEYS


def train_config(config) -> TrainConfig:
  """config.train's TrainConfig fields, plus the run length and the sampler's temperature (greedy: 1)."""
  return EngineSettings.from_config(config).train


def run(config, workdir: pathlib.Path) -> dict:
  """Trains for config.steps steps in workdir, resuming from its latest checkpoint. Returns the last metrics.

  The steps are selfplay/session.py's `Session.step`, one per iteration, under a progress bar. On SIGTERM
  (or, multi-process, at the preemption sync point) the step under way is finished and saved, one line
  says so and preemption.Preempted (SystemExit 143) is raised: rerunning resumes (compassplay_jax/infra/preemption.py)."""
  t_start = time.time()
  workdir = pathlib.Path(workdir)
  session = Session.create(config, workdir)
  start = session.start
  metrics = {}
  preempted = None
  # Closed after the checkpoint is written: a first SIGTERM meanwhile asks for what is under way.
  watch = preemption.Watcher(session.manager.reached_preemption)
  try:
    if start == 0 and evaluation.due(config, 0):
      base = session.evaluate_base()  # the base model: the report's step-0 row
      print("[compassplay] step 0 (base model): " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(base.items())),
            flush=True)
    bar = tqdm.tqdm(range(start + 1, config.steps + 1), initial=start, total=config.steps, desc="self-play",
                    unit="step", dynamic_ncols=True, disable=None)
    keys = summary_keys(config)
    for step in bar:
      metrics = session.step(progress=bar.set_postfix_str, stop=watch.should_stop)
      bar.write(summary_line(step, config.steps, metrics, keys))
      if session.stopped and step < config.steps:  # after the last step the run is done anyway
        preempted = step
        break
  finally:
    try:
      session.close()  # waits for the checkpoint
    finally:
      watch.close()
  if preempted is not None:
    print(watch.message(watch.reason, preempted, session.manager.directory), flush=True)
    raise preemption.Preempted(preempted)
  summary = {"steps": config.steps, "resumed_from": start, "wall_s": round(time.time() - t_start, 1),
             "workdir": str(workdir), "last_metrics": {k: v for k, v in metrics.items() if not isinstance(v, list)},
             **settings.of(config).summary(config)}
  from compassplay_jax.infra import distributed
  distributed.write_text(workdir / "summary.json", json.dumps(summary, indent=2, default=float))
  print(_final_summary(summary, summary_keys(config)), flush=True)
  if jax.process_index() == 0:
    print(_proposer_summary(workdir), flush=True)
  return metrics


def _final_summary(summary, keys) -> str:
  m = summary["last_metrics"]
  lines = [f"[compassplay] done: {summary['steps']} steps in {summary['wall_s']} s "
           f"(resumed from step {summary['resumed_from']}); workdir {summary['workdir']}"]
  for label, key in keys:
    if key in m:
      lines.append(f"  {label:>10}: {m[key]:.4g}")
  lines.append(f"  metrics: {summary['workdir']}/metrics.jsonl, TensorBoard: {summary['workdir']}/tensorboard, "
               f"checkpoints: {summary['workdir']}/checkpoints")
  return "\n".join(lines)


def _proposer_summary(workdir: pathlib.Path) -> str:
  """The last step's candidates as a table and the PNG of cosines and proposer rates."""
  from compassplay_jax.selfplay import summary as proposer
  records = read_metrics(workdir)
  last = next((r for r in reversed(records) if r.get("candidates")), None)
  if last is None:
    return ""
  png = proposer.write_png(workdir / proposer.PNG_NAME, records)
  return f"{proposer.candidate_table(last['step'], last['candidates'])}\n  plot: {png}"
