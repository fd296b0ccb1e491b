"""Greedy evaluation inside a run (config.eval): every benchmark's prompts as one queue of the run's
rollout engine (eval.engine "rollout", the default) or length-sorted batches of the static sampler
("static", the earlier path: the same greedy answers, docs/evaluation.md)."""
from __future__ import annotations

import time

from compassplay_jax.evals import harness


def load_items(config):
  """The evaluation items of config.eval (loaded once per run)."""
  return harness.load_items(config.eval)


def check(config) -> None:
  """Start-up checks of config.eval (one line naming the field)."""
  harness.check_eval_config(config.eval)


def due(config, step: int) -> bool:
  """Whether the run evaluates after `step` (0: the base model): harness.due on config.eval."""
  return harness.due(step, config.eval)


def evaluate(config, engine, params, tokenizer, step: int, workdir, items) -> dict[str, float]:
  """{eval/<benchmark>: accuracy, time/eval: seconds} of greedy completions at `params`; the harness
  writes predictions and tables under workdir/eval/step_<step>/."""
  start = time.perf_counter()
  eval_config = harness.with_defaults(config.eval)
  queue = engine.evaluation_queue(params, tokenizer, config.sampling, eval_config)
  results = harness.evaluate(None, tokenizer, items, eval_config=eval_config, step=step, workdir=str(workdir),
                             generate_queue=queue)
  metrics = {f"eval/{name}": result["accuracy"] for name, result in results.get("benchmarks", {}).items()}
  metrics["time/eval"] = time.perf_counter() - start
  metrics.update(engine_counters(engine, eval_config.engine))
  return metrics


def engine_counters(engine, eval_engine: str) -> dict[str, float]:
  """What the evaluation's decode was (the rollout engine's counters of its last generate call, on this
  process): eval_engine/continuous 1 when the continuous engine ran it, its slots, prompts prefilled,
  decode steps and the fraction of slot-steps that kept a token. Empty for the static path."""
  stats = getattr(engine.rollout, "stats", None) if eval_engine == "rollout" else None
  if stats is None:
    return {}
  return {"eval_engine/continuous": 1.0, "eval_engine/slots": stats.slots, "eval_engine/prompts": stats.prompts,
          "eval_engine/decode_steps": stats.decode_steps, "eval_engine/slot_utilisation": stats.utilisation}
