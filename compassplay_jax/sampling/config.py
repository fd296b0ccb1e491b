"""`SamplingConfig`: everything that decides what `generate` samples and how it batches."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

# Steps of 1.5x past 128 (as the train and cosine buckets): a 150-token prompt pads to 192, not 256
# (the demo's prompts: prefill ran 53% real tokens with the 256 bucket).
DEFAULT_BUCKETS = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


class SamplerParams(NamedTuple):
  """The token-selection knobs, hashable so they can be a static jit argument."""
  temperature: float
  top_p: float
  top_k: int


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to sample.

  temperature: 0 is greedy. Log-probs are always of the full tempered distribution (T=1 when greedy).
  top_p: nucleus mass in (0, 1]; 1 disables it. top_k: 0 disables it.
  n_samples: completions per prompt; they share one prefill.
  stop_strings: generation for a row ends at the token whose decoded text first contains one; the
    returned text keeps the stop string and is cut right after it (docs/sampling.md).
  eos_ids: ids that end a row; None means the tokenizer's (models.tokenizer.eos_token_ids).
  bucket_lengths: prompts are left-padded to the smallest bucket that fits (bounds compilations).
  micro_batch_size: most rows (prompts x samples) decoded together in one device call.
  memory_budget_bytes: if set, also caps rows so the KV cache and per-row temporaries fit.
  stop_check_every: tokens decoded on device between host stop-string checks.
  """
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 512
  n_samples: int = 1
  stop_strings: tuple[str, ...] = ()
  eos_ids: tuple[int, ...] | None = None
  bucket_lengths: tuple[int, ...] = DEFAULT_BUCKETS
  micro_batch_size: int = 32
  memory_budget_bytes: int | None = None
  stop_check_every: int = 16

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature} is negative")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} is not in (0, 1]")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k} is negative")
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens} is less than 1")
    if self.n_samples < 1:
      raise ValueError(f"n_samples={self.n_samples} is less than 1")
    if self.micro_batch_size < 1:
      raise ValueError(f"micro_batch_size={self.micro_batch_size} is less than 1")
    if self.stop_check_every < 1:
      raise ValueError(f"stop_check_every={self.stop_check_every} is less than 1")
    if not self.bucket_lengths or any(b < 1 for b in self.bucket_lengths):
      raise ValueError(f"bucket_lengths={self.bucket_lengths} must be positive lengths")
    if any(not s for s in self.stop_strings):
      raise ValueError("stop_strings contains an empty string")
    # Lists from YAML/CLI become tuples so the config stays hashable.
    object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
    object.__setattr__(self, "bucket_lengths", tuple(sorted(set(self.bucket_lengths))))
    if self.eos_ids is not None:
      object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  @property
  def sampler(self) -> SamplerParams:
    return SamplerParams(float(self.temperature), float(self.top_p), int(self.top_k))

  def replace(self, **changes) -> "SamplingConfig":
    return dataclasses.replace(self, **changes)
