"""Host-side batching: prompt buckets, left padding, and micro-batches under a memory budget.

Shapes seen by the jitted prefill/decode are (prompt rows, bucket length): the bucket length is one
of `bucket_lengths`, and the prompt rows are a power of two capped at the micro-batch's prompt count,
so for a fixed batch size compilations are bounded by the number of length buckets, and in general
by (#length buckets) x (#row sizes), never by the number of batches.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.sampling.config import DEFAULT_BUCKETS, SamplingConfig


def bucket_length(n: int, buckets: tuple[int, ...]) -> int:
  """The smallest bucket that holds n tokens."""
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"prompt of {n} tokens is longer than the largest bucket {buckets[-1]}")


def bytes_per_row(cfg: ModelConfig, prompt_len: int, max_new: int) -> int:
  """Rough device bytes one row needs: its KV cache, prefill activations and per-step temporaries."""
  itemsize = np.dtype(cfg.dtype).itemsize
  slots = prompt_len + max_new
  cache = 2 * cfg.num_hidden_layers * slots * cfg.num_key_value_heads * cfg.head_dim * itemsize
  prefill = prompt_len * (4 * cfg.hidden_size + 3 * cfg.intermediate_size
                          + cfg.num_attention_heads * slots) * 4
  vocab = 4 * cfg.vocab_size * 4  # logits, scaled logits, noise, log-softmax
  return cache + prefill + vocab + 2 * max_new * 4


def _split(n: int, parts: int) -> int:
  """n heads per device when split over `parts` devices (whole heads only; else replicated)."""
  return n // parts if parts > 1 and n % parts == 0 else n


def bytes_per_slot(cfg: ModelConfig, cache_length: int, cache_dtype: str, tensor: int = 1) -> int:
  """Device bytes one continuous-batching slot needs on one device: its KV cache row and per-step
  temporaries (attention scores and probabilities over the cache, vocab-sized logits). With a
  `tensor`-way split the KV heads and attention heads divide by it where they divide evenly."""
  kv_heads = _split(cfg.num_key_value_heads, tensor)
  cache = 2 * cfg.num_hidden_layers * cache_length * kv_heads * cfg.head_dim
  scores = 2 * _split(cfg.num_attention_heads, tensor) * cache_length * 4
  return cache * np.dtype(cache_dtype).itemsize + scores + 4 * cfg.vocab_size * 4


def slots_for_budget(cfg: ModelConfig, cache_length: int, cache_dtype: str, budget_bytes: int,
                     max_prompt_len: int, tensor: int = 1, prefill_rows: int = 1) -> int:
  """How many slots fit on one device in `budget_bytes` after reserving a prefill of `prefill_rows`
  prompts of max_prompt_len tokens (at least 1 or an error)."""
  reserve = prefill_rows * bytes_per_row(cfg, max_prompt_len, 0)
  per_slot = bytes_per_slot(cfg, cache_length, cache_dtype, tensor)
  slots = (budget_bytes - reserve) // per_slot
  if slots < 1:
    raise ValueError(f"memory budget of {budget_bytes} bytes holds no decode slot of cache length "
                     f"{cache_length} ({per_slot} bytes + {reserve} reserved)")
  return int(slots)


def bytes_per_page(cfg: ModelConfig, page_size: int, cache_dtype: str, tensor: int = 1) -> int:
  """Device bytes one KV page costs on one device (paged engine): its keys and values in every layer
  plus the attention scores a decode step computes over it (2 x heads x page_size float32)."""
  kv_heads = _split(cfg.num_key_value_heads, tensor)
  cache = 2 * cfg.num_hidden_layers * page_size * kv_heads * cfg.head_dim * np.dtype(cache_dtype).itemsize
  return cache + 2 * _split(cfg.num_attention_heads, tensor) * page_size * 4


def paged_slot_overhead(cfg: ModelConfig, page_columns: int) -> int:
  """Per-slot bytes of the paged engine outside the pool: vocab-sized logits and its page-table entries."""
  return 4 * cfg.vocab_size * 4 + 4 * page_columns


def paged_layout_for_budget(cfg: ModelConfig, budget_bytes: int, page_size: int, cache_dtype: str,
                            max_prompt_len: int, row_columns: float, max_row_columns: int, tensor: int = 1,
                            prefill_rows: int = 1) -> tuple[int, int]:
  """(slots, pool pages) on one device for the paged engine: the pool takes what the budget leaves
  after a prefill of `prefill_rows` prompts and the slots' own temporaries, and the slots are as many
  as rows of `row_columns` expected columns (prompt + the expected part of the budget) fill that pool.
  Rows longer than expected take pages from the pool as they grow (the engine preempts the youngest
  row when it runs out); the pool holds at least one row of `max_row_columns` (else an error)."""
  reserve = prefill_rows * bytes_per_row(cfg, max_prompt_len, 0)
  page = bytes_per_page(cfg, page_size, cache_dtype, tensor)
  per_row = -(-int(row_columns) // page_size) * page + paged_slot_overhead(cfg, max_row_columns // page_size + 1)
  slots = (budget_bytes - reserve) // per_row
  pages = (budget_bytes - reserve - slots * paged_slot_overhead(cfg, max_row_columns // page_size + 1)) // page
  if slots < 1 or pages - 1 < -(-max_row_columns // page_size):
    raise ValueError(f"memory budget of {budget_bytes} bytes holds no paged decode row of {max_row_columns} "
                     f"columns ({page} bytes a page of {page_size}, {reserve} reserved)")
  return int(slots), int(pages)


CPU_MEMORY_BUDGET = 2 << 30  # bytes: the slots' share of host memory when jax reports no device limit


def device_memory_budget(devices, fraction: float = 0.5, cpu_default: int = CPU_MEMORY_BUDGET) -> int:
  """Per-device bytes for decode slots: `fraction` of the least free memory among `devices`
  (bytes_limit - bytes_in_use, where jax reports them: GPU and TPU), else `cpu_default`.

  Measured when the engine is built, after the run's params and optimizer state are placed; the
  fraction leaves the rest for the train step's activations and the sampler's weight copy."""
  free = []
  for device in devices:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
      return cpu_default
    free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  return int(fraction * min(free))


def prompt_buckets(max_prompt_tokens: int, max_new_tokens: int = 0,
                   ladder: tuple[int, ...] = DEFAULT_BUCKETS) -> tuple[int, ...]:
  """Prompt buckets for a loop whose prompts are cut to max_prompt_tokens: the ladder (doubled past its
  end until it holds max_prompt_tokens + max_new_tokens, for id prompts that continue a generated
  segment) plus max_prompt_tokens itself, so the longest kept prompt (e.g. AZR's 6144) pads to its
  own length, not to the next power of two."""
  if max_prompt_tokens < 1:
    raise ValueError(f"max_prompt_tokens={max_prompt_tokens} is less than 1")
  ladder = list(ladder)
  while ladder[-1] < max_prompt_tokens + max_new_tokens:
    ladder.append(2 * ladder[-1])
  return tuple(sorted(set(ladder) | {int(max_prompt_tokens)}))


def rows_per_call(cfg: ModelConfig, prompt_len: int, config: SamplingConfig) -> int:
  """Most rows (prompts x samples) one device call may hold."""
  rows = config.micro_batch_size
  if config.memory_budget_bytes is not None:
    rows = min(rows, config.memory_budget_bytes // bytes_per_row(cfg, prompt_len, config.max_new_tokens))
  return max(rows, 1)


def pow2_at_least(n: int) -> int:
  """The smallest power of two >= n (1 for n <= 1)."""
  return 1 << (max(n, 1) - 1).bit_length()


def pow2_at_most(n: int) -> int:
  """The largest power of two <= n (1 for n <= 1)."""
  return 1 << (max(n, 1).bit_length() - 1)


@dataclasses.dataclass
class MicroBatch:
  """Prompts decoded together: padded ids/mask (P, L), their global indices, and live-row flags."""
  prompt_index: np.ndarray  # (P,) int32, 0 for padding rows
  live: np.ndarray          # (P,) bool
  input_ids: np.ndarray     # (P, L) int32
  mask: np.ndarray          # (P, L) int32


def _pad_rows(prompt_ids, chunk, length, per_call, pad_id) -> MicroBatch:
  p = min(pow2_at_least(len(chunk)), per_call)
  ids = np.full((p, length), pad_id, np.int32)
  mask = np.zeros((p, length), np.int32)
  for r, i in enumerate(chunk):
    n = len(prompt_ids[i])
    ids[r, length - n:] = prompt_ids[i]
    mask[r, length - n:] = 1
  index = np.zeros((p,), np.int32)
  index[:len(chunk)] = chunk
  return MicroBatch(index, np.arange(p) < len(chunk), ids, mask)


def plan(prompt_ids: list[list[int]], cfg: ModelConfig, config: SamplingConfig, pad_id: int) -> list[MicroBatch]:
  """Splits prompts (sorted by length, so rows of a call have similar lengths) into micro-batches.

  Each micro-batch is padded to the bucket of its longest prompt. Prompts of different buckets share a
  call rather than splitting into smaller calls: extra prompt padding costs prefill only, while an
  extra call (or padding rows) costs every decode step and another compilation.
  """
  for ids in prompt_ids:
    bucket_length(len(ids), config.bucket_lengths)  # fail before any work
  order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
  per_call = lambda length: max(1, rows_per_call(cfg, length, config) // config.n_samples)
  batches, chunk = [], []
  for i in order:
    length = bucket_length(len(prompt_ids[i]), config.bucket_lengths)  # the longest so far
    if chunk and len(chunk) + 1 > per_call(length):
      last = bucket_length(len(prompt_ids[chunk[-1]]), config.bucket_lengths)
      batches.append(_pad_rows(prompt_ids, chunk, last, per_call(last), pad_id))
      chunk = []
    chunk.append(i)
  last = bucket_length(len(prompt_ids[chunk[-1]]), config.bucket_lengths)
  batches.append(_pad_rows(prompt_ids, chunk, last, per_call(last), pad_id))
  return batches
