"""`ContinuousEngine`: continuous batching over a fixed number of decode slots (device side: slots.py).

Host loop: fill every free slot from the queue (prefill the request's prompt once, then insert each
of its samples into a slot), decode a chunk of up to `chunk_tokens` steps on device (ending early
once `refill_threshold` slots are free while requests wait), read the new tokens, check stop strings
and finished rows, free their slots, repeat until the queue is empty and every slot is done.

Shapes are fixed by (slots, cache_length, chunk_tokens), the prompt bucket and the attention window
(cache_length, /2, /4 ... >= 64), so compilations are bounded by 2 x (#prompt buckets used) + 1 +
(#windows) however many requests come.
"""
from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from compassplay_jax.sampling import batching, slots as slots_lib
from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.generate import GenerationResult, _as_key, _eos_ids, _pad_id, graphdef_config
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.sampling.rollout_engine import RolloutEngine, as_requests
from compassplay_jax.sampling.stops import StopFinder

QUEUE_ORDERS = ("longest_first", "arrival")
REFILLS = ("continuous", "static")


@dataclasses.dataclass
class EngineStats:
  """Counters of the last generate call. useful_slot_steps / slot_steps is the fraction of decode
  work that produced a kept token (token 0 comes from the prefill, not a decode step)."""
  slots: int = 0
  cache_length: int = 0
  decode_calls: int = 0
  decode_steps: int = 0
  slot_steps: int = 0
  useful_slot_steps: int = 0
  prefills: int = 0
  inserts: int = 0
  windows: dict = dataclasses.field(default_factory=dict)  # attention window -> decode calls

  @property
  def utilisation(self) -> float:
    return self.useful_slot_steps / max(self.slot_steps, 1)


@dataclasses.dataclass
class _Row:
  request: int
  sample: int
  budget: int
  finder: StopFinder
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  reason: str | None = None


class ContinuousEngine(RolloutEngine):
  """Continuous batching: when a row ends (eos, stop string, its own budget) its slot takes the next
  waiting (request, sample).

  slots: decode slots; or None with memory_budget_bytes: as many as fit (batching.slots_for_budget).
  cache_length: columns per slot (prompt bucket + budget must fit); None: the smallest power of two
    holding the call's largest (bucket + budget), so it changes rarely.
  chunk_tokens: most decode steps per device call (host checks stop strings between calls).
  refill_threshold: a chunk ends early once this many slots are free while requests wait.
  order: "longest_first" admits requests by descending budget (stable), so the last rows to start
    are short ones and slots drain together; "arrival" keeps the given order. Results are always in
    request order, and draws do not depend on the order.
  cache_dtype: KV cache dtype; None follows the model config's compute dtype (bf16 on accelerators).
  refill: "continuous", or "static" (refill only once every slot is free: static batching on the same
    kernels and memory, the baseline of experiments/bench_rollouts.py).
  """

  def __init__(self, graphdef, tokenizer, params=None, *, slots: int | None = None,
               memory_budget_bytes: int | None = None, cache_length: int | None = None, chunk_tokens: int = 8,
               refill_threshold: int = 1, order: str = "longest_first", cache_dtype: str | None = None,
               refill: str = "continuous"):
    if slots is None and memory_budget_bytes is None:
      raise ValueError("ContinuousEngine needs slots or memory_budget_bytes")
    if slots is not None and slots < 1:
      raise ValueError(f"slots={slots} is less than 1")
    if chunk_tokens < 1:
      raise ValueError(f"chunk_tokens={chunk_tokens} is less than 1")
    if refill_threshold < 1:
      raise ValueError(f"refill_threshold={refill_threshold} is less than 1")
    if order not in QUEUE_ORDERS:
      raise ValueError(f"order {order!r} is not one of {QUEUE_ORDERS}")
    if refill not in REFILLS:
      raise ValueError(f"refill {refill!r} is not one of {REFILLS}")
    self.refill = refill
    self.graphdef, self.tokenizer, self.params = graphdef, tokenizer, params
    self._cache_dtype = cache_dtype
    self.slots, self.memory_budget_bytes, self.cache_length = slots, memory_budget_bytes, cache_length
    self.chunk_tokens, self.refill_threshold, self.order = chunk_tokens, refill_threshold, order
    self.stats = EngineStats()
    self._state = None  # SlotState reused across calls (its cache buffers are donated call to call)

  def update_params(self, params) -> None:
    self.params = params

  def _shape(self, need: int, max_bucket: int) -> tuple[int, int]:
    length = self.cache_length or 1 << (need - 1).bit_length()
    if need > length:
      raise ValueError(f"a request needs {need} cache columns (prompt bucket + max_new_tokens) but "
                       f"cache_length is {length}")
    slots = self.slots
    if slots is None:
      slots = batching.slots_for_budget(self.model_config, length, self.cache_dtype, self.memory_budget_bytes,
                                        max_bucket)
    return slots, length

  def generate(self, requests, config: SamplingConfig, key) -> GenerationResult:
    if self.params is None:
      raise ValueError("ContinuousEngine has no params: call update_params first")
    self.model_config = graphdef_config(self.graphdef, self.params)
    self.cache_dtype = str(jnp.dtype(self._cache_dtype or self.model_config.dtype))
    requests = as_requests(requests)
    prompt_ids = encode_prompts(self.tokenizer, [r.prompt for r in requests])
    eos_ids = _eos_ids(self.tokenizer, config)
    pad_id = _pad_id(self.tokenizer, eos_ids)
    buckets = [batching.bucket_length(len(ids), config.bucket_lengths) for ids in prompt_ids]
    budgets = [r.budget(config) for r in requests]
    slots, length = self._shape(max(b + n for b, n in zip(buckets, budgets)), max(buckets))
    finders = {s: StopFinder(self.tokenizer, s) for s in {r.stops(config) for r in requests}}
    key = _as_key(key)
    n = config.n_samples
    rows = [_Row(i, j, budgets[i], finders[requests[i].stops(config)]) for i in range(len(requests))
            for j in range(n)]
    order = range(len(requests))
    if self.order == "longest_first":
      order = sorted(order, key=lambda i: -budgets[i])
    queue = collections.deque(i * n + j for i in order for j in range(n))

    state, self._state = self._state, None  # donated below; kept again at the end
    if state is None or state.out_tokens.shape != (slots, self.chunk_tokens + 1) or \
        state.cache[0].k.shape[1] != length or state.keys.dtype != key.dtype:
      state = None  # free the old cache before allocating the new one
      state = slots_lib.init_slots(key, cfg=self.model_config, slots=slots, length=length,
                                   chunk=self.chunk_tokens, cache_dtype=self.cache_dtype)
    stats = EngineStats(slots=slots, cache_length=length)
    static = dict(sampler=config.sampler, eos_ids=eos_ids)
    prefixes: dict[int, list] = {}  # request -> [Prefix, samples not yet inserted]
    in_slot: list[int | None] = [None] * slots
    host_done = np.zeros((slots,), bool)
    checked = [0] * len(rows)
    windows = slots_lib.windows(length)
    while True:
      batch_busy = self.refill == "static" and any(r is not None for r in in_slot)
      for b in range(slots):
        if in_slot[b] is not None or not queue or batch_busy:
          continue
        r = queue.popleft()
        row = rows[r]
        if row.request not in prefixes:
          prefixes[row.request] = [self._prefill(prompt_ids[row.request], buckets[row.request], pad_id), n]
          stats.prefills += 1
        entry = prefixes[row.request]
        state = slots_lib.insert(state, entry[0], np.int32(b), key, np.int32(row.request), np.int32(row.sample),
                                 np.int32(row.budget), **static)
        stats.inserts += 1
        entry[1] -= 1
        if not entry[1]:
          del prefixes[row.request]
        in_slot[b], host_done[b] = r, False
      if all(r is None for r in in_slot):
        break
      refill_at = self.refill_threshold if queue and self.refill == "continuous" else slots + 1
      # Columns any live row reaches this chunk: its prompt bucket + tokens so far + the chunk.
      reach = max(buckets[rows[r].request] + max(len(rows[r].tokens), 1) + self.chunk_tokens
                  for r in in_slot if r is not None)
      window = min(w for w in windows if w >= min(reach, length))
      state, emitted = slots_lib.decode_chunk(self.graphdef, self.params, state, host_done.copy(),
                                              np.int32(refill_at), window=window, **static)
      tokens, logprobs, count, done, steps = jax.device_get(emitted)
      host_done[:] = False
      stats.decode_calls += 1
      stats.windows[window] = stats.windows.get(window, 0) + 1
      stats.decode_steps += int(steps)
      stats.slot_steps += int(steps) * slots
      for b, r in enumerate(in_slot):
        if r is None:
          continue
        row = rows[r]
        row.tokens.extend(tokens[b, :count[b]].tolist())
        row.logprobs.extend(logprobs[b, :count[b]].tolist())
        if self._finish(row, checked[r], eos_ids) or done[b]:
          if row.reason is None:
            row.reason = "eos" if row.tokens[-1] in eos_ids else "length"
          in_slot[b] = None
          host_done[b] = not done[b]  # a stop-string row the device still thinks is live
        checked[r] = len(row.tokens)
    self._state = state
    stats.useful_slot_steps = sum(len(row.tokens) - 1 for row in rows)
    self.stats = stats
    return self._result(rows, prompt_ids, n)

  def precompile(self, config: SamplingConfig, prompt_buckets, key=0) -> None:
    """Compiles every program a `generate` call with prompts in these buckets and budgets up to
    config.max_new_tokens can need (prefill and insert per bucket, decode per window), so a timed or
    latency-sensitive call compiles nothing. Runs no decode steps."""
    if self.params is None:
      raise ValueError("ContinuousEngine has no params: call update_params first")
    self.model_config = graphdef_config(self.graphdef, self.params)
    self.cache_dtype = str(jnp.dtype(self._cache_dtype or self.model_config.dtype))
    eos_ids = _eos_ids(self.tokenizer, config)
    pad_id = _pad_id(self.tokenizer, eos_ids)
    key = _as_key(key)
    slots, length = self._shape(max(prompt_buckets) + config.max_new_tokens, max(prompt_buckets))
    state = slots_lib.init_slots(key, cfg=self.model_config, slots=slots, length=length,
                                 chunk=self.chunk_tokens, cache_dtype=self.cache_dtype)
    static = dict(sampler=config.sampler, eos_ids=eos_ids)
    for bucket in sorted(set(prompt_buckets)):
      prefix = self._prefill([pad_id], bucket, pad_id)
      state = slots_lib.insert(state, prefix, np.int32(0), key, np.int32(0), np.int32(0), np.int32(1), **static)
    all_done = np.ones((slots,), bool)
    for window in slots_lib.windows(length):
      state, _ = slots_lib.decode_chunk(self.graphdef, self.params, state, all_done, np.int32(slots + 1),
                                        window=window, **static)
    self._state = jax.block_until_ready(state)

  def _prefill(self, ids, bucket: int, pad_id: int):
    padded = np.full((1, bucket), pad_id, np.int32)
    mask = np.zeros((1, bucket), np.int32)
    padded[0, bucket - len(ids):], mask[0, bucket - len(ids):] = ids, 1
    return slots_lib.prefill_prompt(self.graphdef, self.params, padded, mask, cache_dtype=self.cache_dtype)

  @staticmethod
  def _finish(row: _Row, checked: int, eos_ids) -> bool:
    """Cuts a row at the first stop string among its new tokens; True when one was found."""
    if not row.finder.stop_strings:
      return False
    t = row.finder.first_stop(np.asarray(row.tokens), checked, len(row.tokens))
    if t is None:
      return False
    del row.tokens[t + 1:], row.logprobs[t + 1:]
    row.reason = "stop"
    return True

  def _result(self, rows: list[_Row], prompt_ids, n: int) -> GenerationResult:
    texts = None
    if self.tokenizer is not None:
      texts = []
      for row in rows:
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        texts.append(row.finder.cut(text) if row.reason == "stop" else text)
    index = np.arange(len(rows))
    return GenerationResult(
        prompt_index=index // n, sample_index=index % n,
        prompt_tokens=[np.asarray(prompt_ids[row.request], np.int32) for row in rows],
        tokens=[np.asarray(row.tokens, np.int32) for row in rows],
        logprobs=[np.asarray(row.logprobs, np.float32) for row in rows],
        lengths=np.asarray([len(row.tokens) for row in rows], np.int32),
        finish_reasons=[row.reason for row in rows], texts=texts)
