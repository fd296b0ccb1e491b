"""The rollout-engine seam: what the self-play loop needs from a generator, and the static engine.

The loop only ever calls `engine.update_params(params)` (after a policy update) and
`engine.generate(requests, config, key)` (requests -> tokens, exact log-probs, finish reasons). Our
two samplers implement it (`StaticEngine`: today's `generate`; `ContinuousEngine`: continuous
batching, continuous.py); an external engine (vLLM, tpu-inference, sglang-jax) implements the same
two methods by converting params to its weights and its outputs to a `GenerationResult`
(docs/sampling.md, "Rollout engines").
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Sequence

import numpy as np

from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.generate import GenerationResult, generate

ENGINES = ("static", "continuous")


@dataclasses.dataclass(frozen=True)
class Request:
  """One prompt to sample `config.n_samples` completions for.

  prompt: text (needs a tokenizer) or token ids. max_new_tokens / stop_strings: this request's own
  budget and stop strings; None uses the SamplingConfig's.
  """
  prompt: str | Sequence[int]
  max_new_tokens: int | None = None
  stop_strings: tuple[str, ...] | None = None

  def __post_init__(self):
    if self.max_new_tokens is not None and self.max_new_tokens < 1:
      raise ValueError(f"Request.max_new_tokens={self.max_new_tokens} is less than 1")
    if self.stop_strings is not None:
      object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
      if any(not s for s in self.stop_strings):
        raise ValueError("Request.stop_strings contains an empty string")

  def budget(self, config: SamplingConfig) -> int:
    return self.max_new_tokens or config.max_new_tokens

  def stops(self, config: SamplingConfig) -> tuple[str, ...]:
    return config.stop_strings if self.stop_strings is None else self.stop_strings


def as_requests(prompts) -> list[Request]:
  """Requests from a list of Requests, texts or token-id lists."""
  if not prompts:
    raise ValueError("requests is empty")
  return [p if isinstance(p, Request) else Request(p) for p in prompts]


class RolloutEngine(abc.ABC):
  """Generates rollouts from the current policy parameters.

  Contract (what the loop and trainer rely on): rows are prompt-major (row = i * n_samples + j);
  `logprobs[r][t]` is log softmax(logits / T) of the chosen token over the full vocabulary at the
  params last given to `update_params`; `tokens[r]` includes eos when the row ended on it and ends
  at the token completing a stop string; a fixed key reproduces the result.
  """

  @abc.abstractmethod
  def update_params(self, params) -> None:
    """Makes `params` (the nnx.split state of the policy) the weights used by later generate calls."""

  @abc.abstractmethod
  def generate(self, requests: Sequence[Request | str | Sequence[int]], config: SamplingConfig,
               key) -> GenerationResult:
    """config.n_samples completions per request."""


class StaticEngine(RolloutEngine):
  """Today's sampler (`generate`): micro-batches decoded until their longest row ends.

  Requests with different budgets or stop strings run as separate `generate` calls (one per
  distinct (budget, stops)); keys still follow the request's position, so results do not depend on
  the grouping. device_fns: see `generate` (a mesh's ShardedSampler).
  """

  def __init__(self, graphdef, tokenizer, params=None, device_fns=None):
    self.graphdef, self.tokenizer, self.params, self.device_fns = graphdef, tokenizer, params, device_fns

  def update_params(self, params) -> None:
    self.params = params

  def generate(self, requests, config: SamplingConfig, key) -> GenerationResult:
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
      res = generate(self.graphdef, self.params, self.tokenizer, [requests[i].prompt for i in index], cfg, key,
                     device_fns=self.device_fns, key_index=index)
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


def make_engine(name: str, graphdef, tokenizer, params=None, **options) -> RolloutEngine:
  """An engine by name: "static" (options: device_fns) or "continuous" (see ContinuousEngine)."""
  if name == "static":
    return StaticEngine(graphdef, tokenizer, params, **options)
  if name == "continuous":
    from compassplay_jax.sampling.continuous import ContinuousEngine
    return ContinuousEngine(graphdef, tokenizer, params, **options)
  raise ValueError(f"sampling engine {name!r} is not one of {ENGINES}")
