"""Rollout engines by name (`config.sampling.engine`): `make_engine`.

The loop only ever calls `engine.update_params(params)` (after a policy update), `engine.generate(requests,
config, key)` (requests -> tokens, exact log-probs, finish reasons) and `engine.release_memory()`: the
`RolloutEngine` seam (rollout_engine.py). Our two samplers implement it (`StaticEngine`, static_engine.py:
today's `generate`; `ContinuousEngine`, continuous.py: continuous batching), and so does vLLM
(`VLLMEngine`, vllm_engine.py: vLLM in its own venv process); another external engine (tpu-inference,
sglang-jax) implements the same methods by converting params to its weights and its outputs to a
`GenerationResult` (docs/sampling.md, "Rollout engines").
"""
from __future__ import annotations

from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import RolloutEngine
from compassplay_jax.sampling.static_engine import StaticEngine

ENGINES = ("static", "continuous", "vllm")


def make_engine(name: str, graphdef, tokenizer, params=None, **options) -> RolloutEngine:
  """An engine by name: "static" (options: device_fns), "continuous" (see ContinuousEngine) or "vllm"
  (vLLM in its own venv process; see vllm_engine.VLLMEngine)."""
  if name == "static":
    return StaticEngine(graphdef, tokenizer, params, **options)
  if name == "continuous":
    return ContinuousEngine(graphdef, tokenizer, params, **options)
  if name == "vllm":
    from compassplay_jax.sampling.vllm_engine import VLLMEngine
    return VLLMEngine(graphdef, tokenizer, params, **options)
  raise ValueError(f"sampling engine {name!r} is not one of {ENGINES}")
