"""What the loops share: sampling rows from the current policy, and turning rows into a train batch."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from compassplay_jax.rewards.proposer_rewards import RewardConfig
from compassplay_jax.rl.advantages import trr_plus_plus
from compassplay_jax.sampling import SamplingConfig, generate
from compassplay_jax.selfplay.sequences import pack


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
  """The proposer-reward gate values from config.reward (defaults: AZR's code, notes §4.1)."""
  return RewardConfig(bad_format=reward.bad_format, invalid=reward.invalid, out_of_band=reward.out_of_band)


def sampling_config(config, *, n_samples: int = 1, max_new_tokens: int | None = None,
                    stop_strings: Sequence[str] = ()) -> SamplingConfig:
  s = config.sampling
  return SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                        max_new_tokens=max_new_tokens or s.max_new_tokens, n_samples=n_samples,
                        stop_strings=tuple(stop_strings), micro_batch_size=s.micro_batch_size)


def truncate_prompt(tokenizer, text: str, max_tokens: int) -> list[int]:
  """Prompt ids, keeping the last max_tokens (the instruction tail matters most)."""
  from compassplay_jax.sampling.prompts import encode_prompts
  ids = encode_prompts(tokenizer, [text])[0]
  return ids[-max_tokens:]


# Set by the run loop on a multi-device mesh (sharding.ShardedSampler): prefill/decode with explicit
# shardings. None: the plain jitted functions.
DEVICE_FNS = None


def sample(graphdef, params, tokenizer, prompts: Sequence[str], config, key, *, n_samples: int = 1,
           max_new_tokens: int | None = None, stop_strings: Sequence[str] = ()):
  """Generation for text prompts (capped at config.sampling.max_prompt_tokens)."""
  ids = [truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens) for p in prompts]
  cfg = sampling_config(config, n_samples=n_samples, max_new_tokens=max_new_tokens, stop_strings=stop_strings)
  return generate(graphdef, params, tokenizer, ids, cfg, key, device_fns=DEVICE_FNS)


def rows_to_batch(rows: Sequence[Row], pad_id: int, micro_batch_size: int, max_len: int | None = None):
  """Packed arrays plus per-row advantages (TRR++ over (group, role) unless rows carry their own)."""
  packed = pack([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id,
                [r.logprobs for r in rows], row_multiple=micro_batch_size, max_len=max_len, completion_window=True,
                completion_masks=[np.ones(len(r.completion_ids)) if r.completion_mask is None else r.completion_mask
                                  for r in rows])
  if all(r.advantage is not None for r in rows):
    adv = np.asarray([r.advantage for r in rows], np.float32)
  else:
    counts = packed.loss_mask[:len(rows)].sum(-1)
    adv = trr_plus_plus([r.reward for r in rows], [r.group for r in rows], [r.role for r in rows], counts)
  advantages = np.zeros((packed.tokens.shape[0],), np.float32)
  advantages[:len(rows)] = adv
  batch = packed.as_dict()
  batch["advantages"] = advantages
  return batch


def split_key(key, n: int):
  return list(jax.random.split(key, n))
