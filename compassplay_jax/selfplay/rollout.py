"""What the loops share: the Row a sampled sequence becomes, and sampling from the current policy."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from compassplay_jax.infra import distributed
from compassplay_jax.runtime.config_base import dataclass_from
from compassplay_jax.rewards.proposer_rewards import RewardConfig
from compassplay_jax.sampling import SamplingConfig


@dataclasses.dataclass
class Row:
  """One sampled sequence that enters the policy update."""
  prompt_ids: np.ndarray
  completion_ids: np.ndarray
  logprobs: np.ndarray
  reward: float
  group: str  # e.g. "deduction", "target", "conjecture"
  role: str   # "proposer" | "solver"
  advantage: float | None = None  # set by estimators that do not whiten (Lean)
  completion_mask: np.ndarray | None = None  # 0 on completion tokens that were not sampled (scaffolds)


def reward_config(reward) -> RewardConfig:
  """The proposer-reward gate values from config.reward (defaults: AZR's code, docs/paper_settings.md §4.1)."""
  return dataclass_from(RewardConfig, reward)


def sampling_config(config, *, n_samples: int = 1, max_new_tokens: int | None = None,
                    stop_strings: Sequence[str] = ()) -> SamplingConfig:
  """config.sampling's SamplingConfig fields, for one call's sample count, budget and stop strings;
  prompt buckets reach config.sampling.max_prompt_tokens (the longest text prompt `sample` keeps) and
  that plus max_new_tokens (id prompts that continue a generated segment)."""
  from compassplay_jax.sampling.batching import prompt_buckets
  return dataclass_from(SamplingConfig, config.sampling, n_samples=n_samples,
                        max_new_tokens=max_new_tokens or config.sampling.max_new_tokens,
                        stop_strings=tuple(stop_strings),
                        bucket_lengths=prompt_buckets(config.sampling.max_prompt_tokens,
                                                      config.sampling.max_new_tokens))


def truncate_prompt(tokenizer, text: str, max_tokens: int) -> list[int]:
  """Prompt ids, keeping the last max_tokens (the instruction tail matters most)."""
  from compassplay_jax.sampling.prompts import encode_prompts
  ids = encode_prompts(tokenizer, [text])[0]
  return ids[-max_tokens:]


def sample(engine, params, tokenizer, prompts: Sequence[str | Sequence[int]], config, key, *, n_samples: int = 1,
           max_new_tokens: int | None = None, stop_strings: Sequence[str] = (), on_finish=None):
  """Generation for prompts: texts (capped at config.sampling.max_prompt_tokens, keeping the end) or
  token ids (used as they are), through the run engine's rollout engine (`engine.rollout_engine`: the
  one config.sampling.engine names, kept between calls; an external engine plugs in there).

  Across processes each samples its share of the prompts (distributed.Shares) and all get the whole
  result. on_finish(row, tokens, text, finish_reason): called as each row this process samples is
  final (row: its prompt-major index among all prompts), while others still decode."""
  shares = distributed.Shares.of(len(prompts))  # across processes each host samples its share
  ids = [truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens) if isinstance(p, str) else list(p)
         for p in shares.take(list(prompts))]
  cfg = sampling_config(config, n_samples=n_samples, max_new_tokens=max_new_tokens, stop_strings=stop_strings)
  return engine.generate_shared(params, tokenizer, config.sampling, ids, cfg, key, shares, on_finish=on_finish)


def split_key(key, n: int):
  return list(jax.random.split(key, n))
