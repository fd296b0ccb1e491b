"""The rollout-engine seam: what the self-play loop needs from a generator.

The loop only ever calls `engine.update_params(params)` (after a policy update),
`engine.generate(requests, config, key)` (requests -> tokens, exact log-probs, finish reasons) and
`engine.release_memory()` (before the update: what the engine holds on the devices goes back).
Our engines (engine.py's `StaticEngine`, continuous.py's `ContinuousEngine`) and any external one
implement `RolloutEngine`; both import it from here, and engine.py's `make_engine` picks one by name.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Sequence

import numpy as np

from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.generate import GenerationResult


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
               key, on_finish: Callable[[int, np.ndarray, str | None, str], None] | None = None
               ) -> GenerationResult:
    """config.n_samples completions per request.

    on_finish(row, tokens, text, finish_reason), if given, is called on the host once per row as soon
    as that row is final (before generate returns), with the row's prompt-major index and the same
    tokens and text the result will hold: a caller can start verifying rows while others decode."""

  def release_memory(self) -> int:
    """Frees what the engine keeps on the devices between generate calls (its KV cache, its copy of
    the weights), so the policy update has that memory; the next update_params / generate allocate
    again. Returns the device bytes released (0: the engine keeps nothing, as here by default)."""
    return 0
