"""The static rollout engine: today's `generate` behind the `RolloutEngine` seam (rollout_engine.py).

Micro-batches decoded until their longest row ends; `make_engine` (factory.py) picks it by name
("static"), beside the continuous engine (continuous.py) and vLLM (vllm_engine.py).
"""
from __future__ import annotations

import numpy as np

from compassplay_jax.sampling import slots as slots_lib
from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.generate import GenerationResult, generate, graphdef_config
from compassplay_jax.sampling.rollout_engine import RolloutEngine, as_requests


class StaticEngine(RolloutEngine):
  """Today's sampler (`generate`): micro-batches decoded until their longest row ends.

  Requests with different budgets or stop strings run as separate `generate` calls (one per
  distinct (budget, stops)); keys still follow the request's position, so results do not depend on
  the grouping. device_fns: see `generate` (a mesh's ShardedSampler).
  """

  def __init__(self, graphdef, tokenizer, params=None, device_fns=None):
    self.graphdef, self.tokenizer, self.device_fns = graphdef, tokenizer, device_fns
    self._programs = slots_lib.SlotPrograms(getattr(device_fns, "mesh", None))
    self.params = self._source = None
    if params is not None:
      self.update_params(params)

  def update_params(self, params) -> None:
    """Keeps the compute-dtype copy of `params` (cast once here, on device_fns' mesh if any), so the
    decode loop converts no weight. The same object again is not re-cast."""
    if params is self._source:
      return
    self.params = self._source = None
    cfg = graphdef_config(self.graphdef, params)
    self._programs.head_dim = cfg.head_dim
    self.params = self._programs.cast_params(params, cfg.dtype)
    self._source = params

  def generate(self, requests, config: SamplingConfig, key, on_finish=None) -> GenerationResult:
    """on_finish(row, tokens, text, finish_reason), if given, is called for the rows of each
    micro-batch when it ends (rows prompt-major, as in the result), before this returns."""
    if self.params is None:
      raise ValueError("StaticEngine has no params: call update_params first")
    requests = as_requests(requests)
    groups: dict[tuple, list[int]] = {}
    for i, req in enumerate(requests):
      groups.setdefault((req.budget(config), req.stops(config)), []).append(i)
    n = config.n_samples
    parts = []
    for (budget, stops), index in groups.items():
      cfg = config.replace(max_new_tokens=budget, stop_strings=stops)
      report = None
      if on_finish is not None:
        report = lambda r, *rest, index=index: on_finish(index[r // n] * n + r % n, *rest)
      res = generate(self.graphdef, self.params, self.tokenizer, [requests[i].prompt for i in index], cfg, key,
                     device_fns=self.device_fns, key_index=index, on_finish=report)
      parts.append((index, res))
    if len(parts) == 1:
      return parts[0][1]
    return merge_results(parts, len(requests), n)


def merge_results(parts, n_requests: int, n_samples: int) -> GenerationResult:
  """One prompt-major result from (request indices, result over those requests) pairs."""
  rows = n_requests * n_samples
  fields = {name: [None] * rows for name in ("prompt_tokens", "tokens", "logprobs", "finish_reasons", "texts")}
  lengths = np.zeros((rows,), np.int32)
  has_texts = all(res.texts is not None for _, res in parts)
  for index, res in parts:
    for local, i in enumerate(index):
      for j in range(n_samples):
        src, dst = local * n_samples + j, i * n_samples + j
        for name in fields:
          if name != "texts" or has_texts:
            fields[name][dst] = getattr(res, name)[src]
        lengths[dst] = res.lengths[src]
  r = np.arange(rows)
  return GenerationResult(prompt_index=r // n_samples, sample_index=r % n_samples, lengths=lengths,
                          prompt_tokens=fields["prompt_tokens"], tokens=fields["tokens"],
                          logprobs=fields["logprobs"], finish_reasons=fields["finish_reasons"],
                          texts=fields["texts"] if has_texts else None)
