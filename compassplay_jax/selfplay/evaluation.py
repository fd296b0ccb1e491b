"""Greedy evaluation inside a run (config.eval): the benchmarks through the engine's sampler."""
from __future__ import annotations

from compassplay_jax.evals import harness


def load_items(config):
  """The evaluation items of config.eval (loaded once per run)."""
  return harness.load_items(config.eval)


def evaluate(config, engine, params, tokenizer, step: int, workdir, items) -> dict[str, float]:
  """{eval/<benchmark>: accuracy} of greedy completions at `params`; the harness writes predictions and
  tables under workdir/eval/step_<step>/."""

  def generate_fn(prompts):
    return engine.greedy_texts(params, tokenizer, prompts, config.eval.max_new_tokens, config.eval.batch_size)

  results = harness.evaluate(generate_fn, tokenizer, items, eval_config=config.eval, step=step, workdir=str(workdir))
  return {f"eval/{name}": result["accuracy"] for name, result in results.get("benchmarks", {}).items()}
