"""What the loops share: the Row a sampled sequence becomes, and sampling from the current policy."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from compassplay_jax.config_base import dataclass_from
from compassplay_jax.rewards.proposer_rewards import RewardConfig
from compassplay_jax.sampling import SamplingConfig
from compassplay_jax.sampling.engine import RolloutEngine, make_engine


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
  """config.sampling's SamplingConfig fields, for one call's sample count, budget and stop strings."""
  return dataclass_from(SamplingConfig, config.sampling, n_samples=n_samples,
                        max_new_tokens=max_new_tokens or config.sampling.max_new_tokens,
                        stop_strings=tuple(stop_strings))


def truncate_prompt(tokenizer, text: str, max_tokens: int) -> list[int]:
  """Prompt ids, keeping the last max_tokens (the instruction tail matters most)."""
  from compassplay_jax.sampling.prompts import encode_prompts
  ids = encode_prompts(tokenizer, [text])[0]
  return ids[-max_tokens:]


def sample(graphdef, params, tokenizer, prompts: Sequence[str | Sequence[int]], config, key, *, n_samples: int = 1,
           max_new_tokens: int | None = None, stop_strings: Sequence[str] = (), device_fns=None,
           rollout_engine: RolloutEngine | None = None):
  """Generation for prompts: texts (capped at config.sampling.max_prompt_tokens, keeping the end) or
  token ids (used as they are), through a rollout engine (sampling/engine.py): `rollout_engine` when
  given (the run's engine owns it, so a continuous engine keeps its slot cache between calls, and an
  external engine plugs in there), else a new one as config.sampling.engine names on device_fns."""
  ids = [truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens) if isinstance(p, str) else list(p)
         for p in prompts]
  cfg = sampling_config(config, n_samples=n_samples, max_new_tokens=max_new_tokens, stop_strings=stop_strings)
  engine = rollout_engine or make_rollout_engine(graphdef, tokenizer, config, device_fns)
  engine.update_params(params)
  return engine.generate(ids, cfg, key)


def make_rollout_engine(graphdef, tokenizer, config, device_fns=None) -> RolloutEngine:
  """The engine config.sampling.engine names: "static" on device_fns (any mesh) or "continuous"
  (one device)."""
  s = config.sampling
  name = s.get("engine", "static")
  if name != "continuous":
    return make_engine(name, graphdef, tokenizer, device_fns=device_fns)
  mesh = getattr(device_fns, "mesh", None)
  if mesh is not None and mesh.size > 1:
    raise ValueError("config.sampling.engine='continuous' runs on one device; use 'static' on a multi-device mesh")
  return make_engine("continuous", graphdef, tokenizer, slots=s.micro_batch_size,
                     chunk_tokens=s.get("chunk_tokens", 8))


def split_key(key, n: int):
  return list(jax.random.split(key, n))
