"""`ContinuousEngine`: continuous batching over a fixed number of decode slots (device side: slots.py).

Host loop: fill every free slot from the queue (prefill the new prompts among the admitted rows
together, one batched call per prompt bucket, then insert each sample into a slot), decode a chunk
of up to `chunk_tokens` steps on device (ending early once `refill_threshold` slots are free while
requests wait), read the new tokens, check stop strings and finished rows, free their slots (and
report each finished row to `on_finish`), repeat until the queue is empty and every slot is done.

Shapes are fixed by (slots, cache_length, chunk_tokens), the prefill batch (P rows, a power of two,
times the mesh's batch divisor; L a prompt bucket) and the attention window (cache_length, /2, /4 ...
>= 64), so compilations are bounded by 2 x (#buckets used) x (#prefill sizes) + 1 + (#windows)
however many requests come.

On a mesh (sharding.AXES) the slots are split over the batch axes (data, fsdp) and the KV heads
over tensor; params follow the partition rules (slots.SlotPrograms). The host loop is the same.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from compassplay_jax.sampling import batching, pages as pages_lib, paged_slots, slots as slots_lib
from compassplay_jax.sampling import paged_kernels
from compassplay_jax.sampling.paged_kernels import blocks_for, flat_blocks
from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.generate import GenerationResult, as_prng_key, resolve_eos_ids, resolve_pad_id, graphdef_config
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.sampling.rollout_engine import RolloutEngine, as_requests
from compassplay_jax.sampling.stops import StopFinder

QUEUE_ORDERS = ("arrival", "longest_first")
REFILLS = ("continuous", "static")
KV_LAYOUTS = ("dense", "paged", "auto")
OnFinish = Callable[[int, np.ndarray, "str | None", str], None]
# Shrinking stops at this many slots per batch device: below it a decode step costs about the same,
# and every slot count is another decode program per attention window.
SHRINK_FLOOR = 4


@dataclasses.dataclass
class EngineStats:
  """Counters of the last (or running) generate call. useful_slot_steps / slot_steps is the fraction
  of decode work that produced a kept token (token 0 comes from the prefill, not a decode step)."""
  slots: int = 0
  cache_length: int = 0
  decode_calls: int = 0
  decode_steps: int = 0
  slot_steps: int = 0
  useful_slot_steps: int = 0
  prefills: int = 0       # prefill calls
  prefill_rows: int = 0   # prompt rows they ran, padding included
  prompts: int = 0        # distinct prompts prefilled
  inserts: int = 0        # samples put into slots
  windows: dict = dataclasses.field(default_factory=dict)  # attention window -> decode calls
  slot_sizes: dict = dataclasses.field(default_factory=dict)  # slots (after shrinking) -> decode calls
  # Paged engine (kv_layout="paged"): pool pages (trash page excluded), the most held at once, rows
  # preempted for pages (restarted later: same tokens), and page bucket -> decode calls.
  pages: int = 0
  peak_pages: int = 0
  preempted: int = 0
  page_buckets: dict = dataclasses.field(default_factory=dict)

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
  text: str | None = None
  columns: int = 0  # the prompt bucket: cache columns before token 0


@dataclasses.dataclass
class _Prefill:
  """One batched prefill's device result and how many of its samples still wait for a slot."""
  prefix: slots_lib.Prefix
  waiting: int
  requests: list


class ContinuousEngine(RolloutEngine):
  """Continuous batching: when a row ends (eos, stop string, its own budget) its slot takes the next
  waiting (request, sample).

  slots: most decode slots over the whole mesh (rounded up to a multiple of its batch divisor); or
    None with memory_budget_bytes: the device bytes the slots may use *per device* (KV cache and
    per-step temporaries, batching.slots_for_budget), times the batch devices. A call uses no more
    slots than its rows (rounded up to a power of two times the batch divisor), so small calls do
    not pay for empty slots.
  cache_length: columns per slot (prompt bucket + budget must fit); None: the smallest power of two
    holding the call's largest (bucket + budget), so it changes rarely.
  chunk_tokens: most decode steps per device call (host checks stop strings between calls).
  refill_threshold: a chunk ends early once this many slots are free while requests wait.
  order: "arrival" (default) admits requests in the given order, nothing known about their lengths;
    "longest_first" admits by descending budget (stable), for callers that know the budgets matter.
    Results are always in request order, and draws do not depend on the order.
  cache_dtype: KV cache dtype; None follows the model config's compute dtype (bf16 on accelerators).
  refill: "continuous", or "static" (refill only once every slot is free: static batching on the same
    kernels and memory, a baseline of experiments/bench_rollouts.py).
  mesh: a (data, fsdp, tensor) jax Mesh the slots, cache and params live on (None or one device: plain
    jit). Every array the engine makes lives on this mesh; it need not span jax.devices().
  max_prefill_tokens: most prompt tokens (rows x bucket, per batch device) one prefill call runs.
  shrink: once no request waits and the live rows fit a smaller power of two of slots (per batch
    device), move them there (repeatedly, down to shrink_floor per batch device), so the last rows of
    a call do not decode beside empty slots (slots.compact; each device keeps its own rows).
  kv_layout: "dense" (a cache row per slot), "paged" (a pool of page_size-column pages; num_pages,
    paged_fill: the pool's size, per batch shard on a mesh; docs/sampling.md "Paged KV cache"), or
    "auto": paged (docs/sampling.md, "Which layout").
  paged_attention: the paged decode's attention: "auto" (a Pallas kernel on GPU and TPU, the pure-JAX
    gather elsewhere), "gather", "pallas_gpu" or "pallas_tpu" (paged_kernels.py); paged_interpret runs
    a Pallas kernel in interpret mode (CPU tests).
  """

  def __init__(self, graphdef, tokenizer, params=None, *, slots: int | None = None,
               memory_budget_bytes: int | None = None, cache_length: int | None = None, chunk_tokens: int = 8,
               refill_threshold: int = 1, order: str = "arrival", cache_dtype: str | None = None,
               refill: str = "continuous", mesh=None, max_prefill_tokens: int = 2048, shrink: bool = True,
               shrink_floor: int = SHRINK_FLOOR, kv_layout: str = "dense", page_size: int = 16,
               num_pages: int | None = None, paged_fill: float = 0.5, paged_attention: str = "auto",
               paged_interpret: bool = False):
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
    if max_prefill_tokens < 1:
      raise ValueError(f"max_prefill_tokens={max_prefill_tokens} is less than 1")
    self.refill = refill
    self.graphdef, self.tokenizer = graphdef, tokenizer
    self._cache_dtype = cache_dtype
    self.slots, self.memory_budget_bytes, self.cache_length = slots, memory_budget_bytes, cache_length
    self.chunk_tokens, self.refill_threshold, self.order = chunk_tokens, refill_threshold, order
    if shrink_floor < 1:
      raise ValueError(f"shrink_floor={shrink_floor} is less than 1")
    self.max_prefill_tokens, self.shrink, self.shrink_floor = max_prefill_tokens, shrink, shrink_floor
    if kv_layout not in KV_LAYOUTS:
      raise ValueError(f"kv_layout {kv_layout!r} is not one of {KV_LAYOUTS}")
    if page_size < 1 or not 0 < paged_fill <= 1:
      raise ValueError(f"page_size={page_size} must be >= 1 and paged_fill={paged_fill} in (0, 1]")
    self.kv_layout, self.page_size, self.num_pages, self.paged_fill = kv_layout, page_size, num_pages, paged_fill
    if paged_attention not in paged_kernels.PAGED_ATTENTIONS:
      raise ValueError(f"paged_attention {paged_attention!r} is not one of {paged_kernels.PAGED_ATTENTIONS}")
    self.paged_attention = paged_kernels.backend_kernel() if paged_attention == "auto" else paged_attention
    self.paged_interpret = paged_interpret
    self.page_block = max(1, 64 // page_size)  # pages per attention block: 64 columns
    self.mesh = mesh
    self.programs = slots_lib.SlotPrograms(mesh, None)
    self.paged_programs = paged_slots.PagedPrograms(mesh, None)
    self.pool: pages_lib.PagePool | None = None  # the paged engine's last pool (tests read its accounting)
    self.stats = EngineStats()
    self.params = self._source = self.model_config = None
    self._state = None  # SlotState reused across calls (its cache buffers are donated call to call)
    if params is not None:
      self.update_params(params)

  # ---- weights -----------------------------------------------------------------------------------

  def update_params(self, params) -> None:
    """Keeps the compute-dtype copy of `params` (cast once here, laid out on the mesh), not the
    masters: the decode loop then converts no weight. The same object again is not re-cast."""
    if params is self._source:
      return
    self._source = None
    self.params = None  # drop the old copy before making the new one
    self.model_config = graphdef_config(self.graphdef, params)
    self.programs.head_dim = self.paged_programs.head_dim = self.model_config.head_dim
    self.params = self.programs.cast_params(params, self.model_config.dtype)
    self._source = params

  def release_memory(self) -> int:
    """Deletes the kept slot state (the KV cache and the per-slot buffers: the engine's own, donated
    call to call) and drops the weight copy (not deleted: where no cast was needed it may share the
    caller's arrays; it is freed once the caller drops it too). The next call allocates both again with
    the same shapes, so nothing recompiles. Returns the device bytes of what was held."""
    held = [x for x in jax.tree.leaves((self._state, self.params)) if isinstance(x, jax.Array) and not x.is_deleted()]
    released = sum(_device_bytes(x) for x in held)
    for x in jax.tree.leaves(self._state):
      if isinstance(x, jax.Array) and not x.is_deleted():
        x.delete()
    self._state = None
    self.params = self._source = None
    return released

  @property
  def cache_dtype(self) -> str:
    return str(jnp.dtype(self._cache_dtype or self.model_config.dtype))

  # ---- shapes ------------------------------------------------------------------------------------

  def _round(self, n: int) -> int:
    d = self.programs.batch_divisor
    return max(d, -(-n // d) * d)

  def prefill_rows_cap(self, bucket: int) -> int:
    """Most prompt rows one prefill call of this bucket runs (a power of two per batch device)."""
    per_device = max(1, self.max_prefill_tokens // bucket)
    return batching.pow2_at_most(per_device) * self.programs.batch_divisor

  def max_slots(self, cache_length: int, max_bucket: int) -> int:
    """The slot count the memory budget (or `slots`) allows for this cache length."""
    if self.slots is not None:
      return self._round(self.slots)
    prefill_rows = self.prefill_rows_cap(max_bucket) // self.programs.batch_divisor
    per_device = batching.slots_for_budget(self.model_config, cache_length, self.cache_dtype,
                                           self.memory_budget_bytes, max_bucket, tensor=self.programs.tensor_size,
                                           prefill_rows=prefill_rows)
    return per_device * self.programs.batch_divisor

  def _shape(self, need: int, max_bucket: int, rows: int) -> tuple[int, int]:
    length = self.cache_length or batching.pow2_at_least(need)
    if need > length:
      raise ValueError(f"a request needs {need} cache columns (prompt bucket + max_new_tokens) but "
                       f"cache_length is {length}")
    slots = min(self.max_slots(length, max_bucket), self._round(batching.pow2_at_least(rows)))
    return slots, length

  def _prefill_size(self, prompts: int, bucket: int) -> int:
    return min(self._round(batching.pow2_at_least(prompts)), self.prefill_rows_cap(bucket))

  def uses_pages(self) -> bool:
    """Whether calls decode over a page pool: kv_layout "paged", or "auto" (on any mesh). Measured on
    the loop workload (docs/sampling.md, "Which layout"): 1.69x the dense engine's useful tok/s at a
    budget where pages fit twice the slots, and 1.72x at one where both hold every row (paged decode
    reads only the filled pages, dense attends over a power-of-two window); on a mesh each device
    holds its slots' pages (PagedPrograms), so the same holds per device."""
    return self.kv_layout in ("paged", "auto")

  def _ensure_state(self, key, slots: int, length: int):
    state, self._state = self._state, None  # donated below; kept again at the end
    if not isinstance(state, slots_lib.SlotState):  # none yet, or the paged layout's (kv_layout="auto")
      state = None
    if state is None or state.out_tokens.shape != (slots, self.chunk_tokens + 1) or \
        state.cache[0].k.shape[1] != length or state.keys.dtype != key.dtype or \
        state.cache[0].k.dtype != jnp.dtype(self.cache_dtype):
      state = None  # free the old cache before allocating the new one
      state = self.programs.init_slots(key, cfg=self.model_config, slots=slots, length=length,
                                       chunk=self.chunk_tokens, cache_dtype=self.cache_dtype)
    return state

  # ---- generation --------------------------------------------------------------------------------

  def generate(self, requests, config: SamplingConfig, key, on_finish: OnFinish | None = None) -> GenerationResult:
    """config.n_samples completions per request. on_finish(row, tokens, text, finish_reason), if given,
    is called on the host for each row as soon as it is final (its slot released), before this returns;
    rows are prompt-major indices as in the result."""
    if self.params is None:
      raise ValueError("ContinuousEngine has no params: call update_params first")
    requests = as_requests(requests)
    prompt_ids = encode_prompts(self.tokenizer, [r.prompt for r in requests])
    if self.uses_pages():
      return self._generate_paged(requests, config, key, on_finish, prompt_ids)
    eos_ids = resolve_eos_ids(self.tokenizer, config)
    pad_id = resolve_pad_id(self.tokenizer, eos_ids)
    buckets = [batching.bucket_length(len(ids), config.bucket_lengths) for ids in prompt_ids]
    budgets = [r.budget(config) for r in requests]
    n = config.n_samples
    slots, length = self._shape(max(b + m for b, m in zip(buckets, budgets)), max(buckets), len(requests) * n)
    finders = {s: StopFinder(self.tokenizer, s) for s in {r.stops(config) for r in requests}}
    key = as_prng_key(key)
    rows = [_Row(i, j, budgets[i], finders[requests[i].stops(config)], columns=buckets[i])
            for i in range(len(requests)) for j in range(n)]
    order = range(len(requests))
    if self.order == "longest_first":
      order = sorted(order, key=lambda i: -budgets[i])
    queue = collections.deque(i * n + j for i in order for j in range(n))

    state = self._ensure_state(key, slots, length)
    stats = self.stats = EngineStats(slots=slots, cache_length=length)
    prefilled: dict[int, tuple[_Prefill, int]] = {}  # request -> (its prefill, its row there)
    in_slot: list[int | None] = [None] * slots
    host_done = np.zeros((slots,), bool)
    checked = [0] * len(rows)
    windows = slots_lib.windows(length)
    while True:
      if not (self.refill == "static" and any(r is not None for r in in_slot)):
        # Free slots round-robin over the batch shards, so each device gets its share of the rows
        # (and the drain can shrink every shard alike).
        local = slots // self.programs.batch_divisor
        free = sorted((b for b in range(slots) if in_slot[b] is None), key=lambda b: (b % local, b // local))
        taken = [queue.popleft() for _ in range(min(len(free), len(queue)))]
        if taken:
          state = self._admit(state, taken, free, rows, prompt_ids, buckets, prefilled, key, config, eos_ids, pad_id)
          for b, r in zip(free, taken):
            in_slot[b], host_done[b] = r, False
      if all(r is None for r in in_slot):
        break
      if self.shrink and not queue and self.refill == "continuous":
        state, in_slot, host_done = self._shrink(state, in_slot, host_done)
        slots = len(in_slot)
      refill_at = self.refill_threshold if queue and self.refill == "continuous" else slots + 1
      # Columns any live row reaches this chunk: its prompt bucket + tokens so far + the chunk.
      reach = max(rows[r].columns + max(len(rows[r].tokens), 1) + self.chunk_tokens for r in in_slot if r is not None)
      window = min(w for w in windows if w >= min(reach, length))
      state, emitted = self.programs.decode_chunk(self.graphdef, self.params, state, host_done.copy(),
                                                  np.int32(refill_at), sampler=config.sampler, eos_ids=eos_ids,
                                                  window=window)
      stats.windows[window] = stats.windows.get(window, 0) + 1
      self._collect(emitted, in_slot, rows, checked, host_done, eos_ids, on_finish)
    self._state = state
    stats.useful_slot_steps = sum(len(row.tokens) - 1 for row in rows)
    return self._result(rows, prompt_ids, n)

  def _admit(self, state, taken, free, rows, prompt_ids, buckets, prefilled, key, config, eos_ids, pad_id,
             copies=None, waiting=None):
    """Prefills the prompts of `taken` rows that have none yet (one batched call per bucket, at most
    prefill_rows_cap rows each), then inserts every taken row into its free slot (one call per prefill
    the rows come from). copies(handle, entries) -> paged_slots.Copies: the paged engine's insert."""
    self._prefill_new(taken, rows, prompt_ids, buckets, prefilled, key, config, pad_id, waiting)
    groups: dict[int, tuple[_Prefill, list]] = {}  # id(prefill) -> (prefill, [(slot, row)])
    for b, r in zip(free, taken):
      handle = prefilled[rows[r].request][0]
      groups.setdefault(id(handle), (handle, []))[1].append((b, r))
    for handle, entries in groups.values():
      admit = self.programs.admit_arrays(state.done.shape[0])
      for k, (b, r) in enumerate(entries):
        row = rows[r]
        admit.slot[k], admit.row[k] = b, prefilled[row.request][1]
        admit.request[k], admit.sample[k], admit.budget[k] = row.request, row.sample, row.budget
      admit = admit._replace(count=np.int32(len(entries)))
      if copies is None:
        state = self.programs.insert(state, handle.prefix, admit, key, eos_ids=eos_ids)
      else:
        state = self.paged_programs.insert_paged(state, handle.prefix, admit, copies(handle, entries), key,
                                                 eos_ids=eos_ids)
      self.stats.inserts += len(entries)
      handle.waiting -= len(entries)
      if not handle.waiting:  # every sample of its prompts is in a slot: drop the prefix
        for i in handle.requests:
          del prefilled[i]
    return state

  def _prefill_new(self, taken, rows, prompt_ids, buckets, prefilled, key, config, pad_id, waiting=None):
    """Batched prefills of the prompts of `taken` rows that have none on device yet. waiting(request):
    how many of its samples the prefill serves (None: all n)."""
    stats = self.stats
    new = list(dict.fromkeys(rows[r].request for r in taken if rows[r].request not in prefilled))
    by_bucket: dict[int, list[int]] = {}
    for i in new:
      by_bucket.setdefault(buckets[i], []).append(i)
    for bucket, group in by_bucket.items():
      cap = self.prefill_rows_cap(bucket)
      for start in range(0, len(group), cap):
        part = group[start:start + cap]
        p = self._prefill_size(len(part), bucket)
        ids = np.full((p, bucket), pad_id, np.int32)
        mask = np.zeros((p, bucket), np.int32)
        index = np.zeros((p,), np.int32)
        for k, i in enumerate(part):
          ids[k, bucket - len(prompt_ids[i]):], mask[k, bucket - len(prompt_ids[i]):] = prompt_ids[i], 1
          index[k] = i
        prefix = self.programs.prefill_prompts(self.graphdef, self.params, ids, mask, index, key,
                                               n_samples=config.n_samples, sampler=config.sampler,
                                               cache_dtype=self.cache_dtype)
        served = config.n_samples * len(part) if waiting is None else sum(waiting(i) for i in part)
        handle = _Prefill(prefix, served, part)
        for k, i in enumerate(part):
          prefilled[i] = (handle, k)
        stats.prefills += 1
        stats.prefill_rows += p
        stats.prompts += len(part)

  # ---- the paged KV cache (kv_layout="paged": pages.py, paged_slots.py) ---------------------------

  def paged_layout(self, need: int, max_bucket: int, max_new: int, rows: int) -> tuple[int, int]:
    """(slots, pool pages with the trash pages) for a paged call whose rows need up to `need` columns;
    on a mesh the pool is split evenly over the batch shards (each shard's pages: its slots' share,
    its own trash page; num_pages counts per shard). With `slots`: the pool holds that many full rows
    (the dense cache's memory) unless num_pages says; with a memory budget (per device):
    batching.paged_layout_for_budget, rows expected to fill paged_fill of the budget. Either way no
    more slots than the call's rows (a power of two per shard)."""
    ps, d = self.page_size, self.programs.batch_divisor
    row_pages = pages_lib.pages_for(need, ps)
    if self.slots is not None:
      slots = self._round(self.slots)
      per_shard = self.num_pages or slots // d * row_pages + 1
    else:
      local, per_shard = batching.paged_layout_for_budget(
          self.model_config, self.memory_budget_bytes, ps, self.cache_dtype, max_bucket,
          max_bucket + self.paged_fill * max_new, need, tensor=self.programs.tensor_size,
          prefill_rows=self.prefill_rows_cap(max_bucket) // d)
      slots, per_shard = local * d, self.num_pages or per_shard
    if per_shard - 1 < row_pages:
      raise ValueError(f"a pool of {per_shard - 1} pages of {ps}" + (" per batch shard" if d > 1 else "")
                       + f" holds no row of {need} columns")
    slots = min(slots, self._round(batching.pow2_at_least(rows)))
    if self.num_pages is None:  # no more pages than the call's slots can hold at once, grown whole
      per_shard = min(per_shard, slots // d * row_pages + 1)
    return slots, per_shard * d

  def _ensure_paged(self, key, slots: int, num_pages: int):
    state, self._state = self._state, None
    if not isinstance(state, paged_slots.PagedState):  # none yet, or the dense layout's (kv_layout="auto")
      state = None
    if state is None or state.out_tokens.shape != (slots, self.chunk_tokens + 1) or \
        state.pages[0].k.shape[1:3] != (num_pages, self.page_size) or state.keys.dtype != key.dtype or \
        state.pages[0].k.dtype != jnp.dtype(self.cache_dtype):
      state = None
      state = self.paged_programs.init_paged(key, cfg=self.model_config, slots=slots, num_pages=num_pages,
                                             page_size=self.page_size, chunk=self.chunk_tokens,
                                             cache_dtype=self.cache_dtype)
    return state

  def _generate_paged(self, requests, config: SamplingConfig, key, on_finish, prompt_ids=None):
    """`generate` over a paged KV cache: a row holds pages for the columns it has reached (its prompt's
    full pages shared with its prompt's other samples), takes more before each chunk and returns all
    of them when it ends. When the pool runs short the youngest live row is preempted (its pages
    returned, the row queued again in front: it restarts with the same draws, so results do not
    change). Decode attends over the live rows' pages only (paged_slots.decode_paged)."""
    requests = as_requests(requests)
    if prompt_ids is None:
      prompt_ids = encode_prompts(self.tokenizer, [r.prompt for r in requests])
    eos_ids = resolve_eos_ids(self.tokenizer, config)
    pad_id = resolve_pad_id(self.tokenizer, eos_ids)
    buckets = [batching.bucket_length(len(ids), config.bucket_lengths) for ids in prompt_ids]
    budgets = [r.budget(config) for r in requests]
    n = config.n_samples
    need = max(b + m for b, m in zip(buckets, budgets))
    if self.cache_length is not None and need > self.cache_length:
      raise ValueError(f"a request needs {need} cache columns (prompt bucket + max_new_tokens) but "
                       f"cache_length is {self.cache_length}")
    slots, num_pages = self.paged_layout(need, max(buckets), max(budgets), len(requests) * n)
    ps, chunk = self.page_size, self.chunk_tokens
    finders = {s: StopFinder(self.tokenizer, s) for s in {r.stops(config) for r in requests}}
    key = as_prng_key(key)
    rows = [_Row(i, j, budgets[i], finders[requests[i].stops(config)], columns=len(prompt_ids[i]))
            for i in range(len(requests)) for j in range(n)]
    order = range(len(requests))
    if self.order == "longest_first":
      order = sorted(order, key=lambda i: -budgets[i])
    queue = collections.deque(i * n + j for i in order for j in range(n))
    queued = collections.Counter(rows[r].request for r in queue)
    state = self._ensure_paged(key, slots, num_pages)
    d = self.programs.batch_divisor  # pool shards: a row's pages live on its slot's batch shard
    pool = self.pool = pages_lib.PagePool(num_pages, ps, shards=d)
    tables = pages_lib.PageTables(pool)
    stats = self.stats = EngineStats(slots=slots, cache_length=need, pages=pool.capacity)
    prefilled: dict[int, tuple[_Prefill, int]] = {}
    # request -> {shard: its prompt's full pages there} (the prompt holds a reference to each)
    shared: dict[int, dict[int, list[int]]] = collections.defaultdict(dict)
    in_slot: list[int | None] = [None] * slots
    host_done = np.zeros((slots,), bool)
    checked = [0] * len(rows)
    width = paged_slots.write_columns(chunk, ps)

    def reach(r: int) -> int:  # columns row r holds through its next chunk
      row = rows[r]
      return max(row.columns, min(row.columns + max(len(row.tokens), 1) - 1 + chunk, row.columns + row.budget - 1))

    def shard(b: int) -> int:  # slots split over the batch shards in equal contiguous ranges
      return b // (len(in_slot) // d)

    def evict(b: int) -> None:
      r = in_slot[b]
      tables.finish(b)
      in_slot[b], host_done[b], checked[r] = None, True, 0
      row = rows[r]
      row.tokens.clear()
      row.logprobs.clear()
      queue.appendleft(r)
      queued[row.request] += 1
      if row.request in prefilled:
        prefilled[row.request][0].waiting += 1
      stats.preempted += 1

    while True:
      # Pages for every live row's next chunk, oldest first; when short, the youngest gives its back.
      live = sorted((b for b in range(len(in_slot)) if in_slot[b] is not None),
                    key=lambda b: -len(rows[in_slot[b]].tokens))
      for i, b in enumerate(live):
        while in_slot[b] is not None:
          try:
            tables.grow(b, reach(in_slot[b]))
            break
          except pages_lib.OutOfPages:
            younger = [c for c in live[i + 1:] if in_slot[c] is not None and shard(c) == shard(b)]
            evict(younger[-1] if younger else b)
      if not (self.refill == "static" and any(r is not None for r in in_slot)):
        # Free slots round-robin over the shards (each device gets its share of the rows); a row goes
        # to the next free slot whose shard has the pages for it.
        local = len(in_slot) // d
        free_slots = sorted((b for b in range(len(in_slot)) if in_slot[b] is None), key=lambda b: (b % local, b // local))
        free, taken, plan, reserved = [], [], {}, [0] * d
        for b in free_slots:
          if not queue:
            break
          row = rows[queue[0]]
          want = pages_lib.pages_for(reach(queue[0]), ps) - len(shared[row.request].get(shard(b), ()))
          if reserved[shard(b)] + want > pool.free_in(shard(b)):
            continue
          reserved[shard(b)] += want
          free.append(b)
          taken.append(queue.popleft())
        for b, r in zip(free, taken):
          row = rows[r]
          todo = []  # (pool page, prompt column) copies this admission needs
          prompt = shared[row.request]
          if shard(b) not in prompt:
            prompt[shard(b)] = tables.prompt_pages(row.columns, shard(b))
            todo += [(p, j * ps) for j, p in enumerate(prompt[shard(b)])]
          own = tables.admit(b, prompt[shard(b)], row.columns, shard(b))
          if row.columns % ps:
            todo.append((own[row.columns // ps], row.columns // ps * ps))
          tables.grow(b, reach(r))
          queued[row.request] -= 1
          if not queued[row.request]:  # the prompt's own references: its samples keep theirs
            for pages in shared.pop(row.request).values():
              pool.release(pages)
          plan[b] = todo
        if taken:
          in_taken = collections.Counter(rows[r].request for r in taken)

          def copies(handle, entries, plan=plan):
            out = paged_slots.Copies.empty(len(in_slot), handle.prefix.cache[0].k.shape[1], ps)
            k = 0
            for b, r in entries:
              prefix_row = prefilled[rows[r].request][1]
              first = handle.prefix.cache[0].k.shape[1] - rows[r].columns
              for page, col in plan[b]:
                out.page[k], out.row[k], out.col[k] = page, prefix_row, first + col
                k += 1
            return out._replace(count=np.int32(k))

          state = self._admit(state, taken, free, rows, prompt_ids, buckets, prefilled, key, config, eos_ids, pad_id,
                              copies=copies, waiting=lambda i: queued[i] + in_taken[i])
          for b, r in zip(free, taken):
            in_slot[b], host_done[b] = r, False
      if all(r is None for r in in_slot):
        if queue:
          raise RuntimeError(f"no row fits the pool of {pool.capacity} pages")
        break
      if self.shrink and not queue and self.refill == "continuous":
        def compact(st, keep, valid, old_local=len(in_slot) // d):
          # _shrink's keep is per shard (local slot numbers); the pages stay on their shard.
          keep = keep + np.arange(len(keep), dtype=keep.dtype) // (len(keep) // d) * old_local
          tables.move({int(keep[k]): k for k in range(len(keep)) if valid[k]})
          return self.paged_programs.compact_paged(st, keep, valid)
        state, in_slot, host_done = self._shrink(state, in_slot, host_done, compact=compact)
        slots = len(in_slot)
      free_now = sum(r is None for r in in_slot)
      refill_at = free_now + self.refill_threshold if queue and self.refill == "continuous" else slots + 1
      counts = np.zeros((slots,), np.int64)
      table = np.zeros((slots, max(len(t.pages) for t in tables.rows.values())), np.int32)
      write_pages = np.zeros((slots, width), np.int32)
      write_base = np.zeros((slots,), np.int32)
      for b, r in enumerate(in_slot):
        if r is None:
          continue
        held = tables.rows[b].pages
        counts[b] = pages_lib.pages_for(reach(r), ps)
        table[b, :len(held)] = held
        base = (rows[r].columns + max(len(rows[r].tokens), 1) - 1) // ps
        write_base[b] = base
        part = held[base:base + width]
        write_pages[b, :len(part)] = part
      if self.paged_attention == "gather":  # the live rows' pages, in blocks, padded to a bucket per shard
        local = slots // d
        parts = [(table[i * local:(i + 1) * local], counts[i * local:(i + 1) * local]) for i in range(d)]
        bucket = paged_slots.page_bucket(max(blocks_for(c, self.page_block) for _, c in parts))
        pages_read = tuple(np.concatenate(x) for x in zip(*(flat_blocks(t, c, bucket, ps, self.page_block)
                                                             for t, c in parts)))
      else:  # a kernel reads each row's own pages up to its length: one table width per call
        bucket = paged_kernels.table_width(pages_lib.pages_for(need, ps))
        pages_read = (np.pad(table, ((0, 0), (0, bucket - table.shape[1]))),)
      stats.peak_pages = max(stats.peak_pages, pool.used)
      state, emitted = self.paged_programs.decode_paged(
          self.graphdef, self.params, state, host_done.copy(), np.int32(refill_at), write_pages, write_base,
          *pages_read, sampler=config.sampler, eos_ids=eos_ids, attention=self.paged_attention,
          interpret=self.paged_interpret)
      stats.page_buckets[bucket] = stats.page_buckets.get(bucket, 0) + 1
      self._collect(emitted, in_slot, rows, checked, host_done, eos_ids, on_finish, freed=tables.finish)
    self._state = state
    stats.useful_slot_steps = sum(len(row.tokens) - 1 for row in rows)
    return self._result(rows, prompt_ids, n)

  def _collect(self, emitted, in_slot, rows, checked, host_done, eos_ids, on_finish, freed=None) -> None:
    """Reads one decode chunk back (both layouts): the counters, each live row's new tokens and
    log-probs; a row that ended (eos, its budget, a stop string) is released and its slot freed
    (freed(slot): the paged engine returns the slot's pages)."""
    tokens, logprobs, count, done, steps = jax.device_get(emitted)
    host_done[:] = False
    stats, slots = self.stats, len(in_slot)
    stats.decode_calls += 1
    stats.slot_sizes[slots] = stats.slot_sizes.get(slots, 0) + 1
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
        if freed is not None:
          freed(b)
        self._release(r, row, on_finish)
      checked[r] = len(row.tokens)

  def _shrink(self, state, in_slot, host_done, compact=None):
    """Moves the live rows into fewer slots once they fit a smaller power of two per batch shard
    (a budget's 43 slots -> 32 -> 16 ...; at least shrink_floor): each shard keeps its own live rows,
    so the new count is the batch divisor x the power of two holding the fullest shard."""
    d = self.programs.batch_divisor
    local = len(in_slot) // d
    shards = [[b for b in range(i * local, (i + 1) * local) if in_slot[b] is not None] for i in range(d)]
    need = max(batching.pow2_at_least(max(len(x) for x in shards)), self.shrink_floor)
    if need >= local:  # (a slot count from the memory budget need not be a power of two: 43 -> 32)
      return state, in_slot, host_done
    keep = np.zeros((d * need,), np.int32)
    valid = np.zeros((d * need,), bool)
    new_in_slot: list[int | None] = [None] * (d * need)
    for i, live in enumerate(shards):
      for k, b in enumerate(live):
        keep[i * need + k], valid[i * need + k], new_in_slot[i * need + k] = b - i * local, True, in_slot[b]
    # Rows the host ended (stop strings) are not live: they stay behind, and no new slot needs host_done.
    return (compact or self.programs.compact)(state, keep, valid), new_in_slot, np.zeros((d * need,), bool)

  def _release(self, r: int, row: _Row, on_finish: OnFinish | None) -> None:
    if self.tokenizer is not None:
      text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
      row.text = row.finder.cut(text) if row.reason == "stop" else text
    if on_finish is not None:
      on_finish(r, np.asarray(row.tokens, np.int32), row.text, row.reason)

  def precompile(self, config: SamplingConfig, prompt_buckets, key=0, rows: int | None = None) -> None:
    """Compiles every program a `generate` call of `rows` rows (None: as many as the slots allow),
    prompts in these buckets and budgets up to config.max_new_tokens can need (prefill and insert per
    bucket and prefill size, decode per window and slot count, compact per pair of slot counts), so a
    timed or latency-sensitive call compiles nothing. Runs no decode steps."""
    if self.params is None:
      raise ValueError("ContinuousEngine has no params: call update_params first")
    if self.uses_pages():
      return self._precompile_paged(config, prompt_buckets, key, rows)
    eos_ids = resolve_eos_ids(self.tokenizer, config)
    pad_id = resolve_pad_id(self.tokenizer, eos_ids)
    key = as_prng_key(key)
    length = self.cache_length or batching.pow2_at_least(max(prompt_buckets) + config.max_new_tokens)
    most = self.max_slots(length, max(prompt_buckets))
    slots, length = self._shape(max(prompt_buckets) + config.max_new_tokens, max(prompt_buckets),
                                most if rows is None else rows)
    self._state = None
    state = self._ensure_state(key, slots, length)
    # New prompts admitted at once: each brings n samples into free slots, so at most slots / n
    # (rounded up; a prompt whose samples straddle two admissions was prefilled in the first).
    most_prompts = -(-slots // config.n_samples)
    for bucket in sorted(set(prompt_buckets)):
      sizes = sorted({self._prefill_size(c, bucket) for c in range(1, most_prompts + 1)})
      for p in sizes:
        prefix = self.programs.prefill_prompts(
            self.graphdef, self.params, np.full((p, bucket), pad_id, np.int32), np.ones((p, bucket), np.int32),
            np.zeros((p,), np.int32), key, n_samples=config.n_samples, sampler=config.sampler,
            cache_dtype=self.cache_dtype)
        state = self.programs.insert(state, prefix, self.programs.admit_arrays(slots), key, eos_ids=eos_ids)
    sizes = self._shrink_sizes(slots)
    # One size at a time (at most two caches alive, as when a call shrinks): its decode programs, then
    # its compactions to every smaller size, keeping the next size's state.
    for i, size in enumerate(sizes):
      all_done = np.ones((size,), bool)
      for window in slots_lib.windows(length):
        state, _ = self.programs.decode_chunk(self.graphdef, self.params, state, all_done, np.int32(size + 1),
                                              sampler=config.sampler, eos_ids=eos_ids, window=window)
      if i == 0:
        self._state = jax.block_until_ready(state)  # what a call of `rows` rows starts from
      smaller = None
      for target in sizes[i + 1:]:
        out = self.programs.compact(state, np.zeros((target,), np.int32), np.zeros((target,), bool))
        smaller = out if smaller is None else smaller
      state = jax.block_until_ready(smaller) if smaller is not None else None

  def _shrink_sizes(self, slots: int) -> list[int]:
    """Every slot count the drain's shrinking can reach from `slots`, largest first."""
    d = self.programs.batch_divisor
    sizes = [slots]
    if self.shrink:
      p = batching.pow2_at_least(slots // d)
      while p > self.shrink_floor:
        p //= 2
        if p * d < slots:
          sizes.append(d * p)
    return sizes

  def _precompile_paged(self, config: SamplingConfig, prompt_buckets, key, rows) -> None:
    """`precompile` for the paged layout: the pool of a call whose longest row needs (largest bucket +
    max_new_tokens) columns (a call needing fewer gets a smaller pool unless num_pages is set, so set it
    where calls vary), prefill and insert per bucket and prefill size, decode per slot count and page
    bucket (gather: every bucket the live blocks can reach, paged_slots.page_bucket; a kernel: the
    table width), compact per pair of slot counts."""
    eos_ids = resolve_eos_ids(self.tokenizer, config)
    pad_id = resolve_pad_id(self.tokenizer, eos_ids)
    key = as_prng_key(key)
    top = max(prompt_buckets)
    need = top + config.max_new_tokens
    slots, num_pages = self.paged_layout(need, top, config.max_new_tokens, 1 << 30 if rows is None else rows)
    self._state = None
    state = self._ensure_paged(key, slots, num_pages)
    ps, d = self.page_size, self.programs.batch_divisor
    most_prompts = -(-slots // config.n_samples)
    for bucket in sorted(set(prompt_buckets)):
      for p in sorted({self._prefill_size(c, bucket) for c in range(1, most_prompts + 1)}):
        prefix = self.programs.prefill_prompts(
            self.graphdef, self.params, np.full((p, bucket), pad_id, np.int32), np.ones((p, bucket), np.int32),
            np.zeros((p,), np.int32), key, n_samples=config.n_samples, sampler=config.sampler,
            cache_dtype=self.cache_dtype)
        none = paged_slots.Copies.empty(slots, prefix.cache[0].k.shape[1], ps)
        state = self.paged_programs.insert_paged(state, prefix, self.programs.admit_arrays(slots), none, key,
                                                 eos_ids=eos_ids)
    row_pages, per_shard = pages_lib.pages_for(need, ps), num_pages // d
    width = paged_slots.write_columns(self.chunk_tokens, ps)
    sizes = self._shrink_sizes(slots)
    for i, size in enumerate(sizes):
      local = size // d
      if self.paged_attention == "gather":  # blocks of one shard: its rows' pages, at most its pool's
        most = min(local * -(-row_pages // self.page_block), -(-(per_shard - 1) // self.page_block) + local)
        reads = [(np.zeros((d * b, self.page_block), np.int32), np.full((d * b,), local, np.int32),
                  np.zeros((d * b,), np.int32)) for b in sorted({paged_slots.page_bucket(n) for n in range(most + 1)})]
      else:
        reads = [(np.zeros((size, paged_kernels.table_width(row_pages)), np.int32),)]
      for pages_read in reads:
        state, _ = self.paged_programs.decode_paged(
            self.graphdef, self.params, state, np.ones((size,), bool), np.int32(size + 1),
            np.zeros((size, width), np.int32), np.zeros((size,), np.int32), *pages_read, sampler=config.sampler,
            eos_ids=eos_ids, attention=self.paged_attention, interpret=self.paged_interpret)
      smaller = None
      for target in sizes[i + 1:]:
        out = self.paged_programs.compact_paged(state, np.zeros((target,), np.int32), np.zeros((target,), bool))
        smaller = out if smaller is None else smaller
      state = jax.block_until_ready(smaller) if smaller is not None else None
    # The smaller states share the pool, which their decodes donated: a call allocates a fresh pool
    # (init_paged is compiled).
    self._state = None

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
    index = np.arange(len(rows))
    return GenerationResult(
        prompt_index=index // n, sample_index=index % n,
        prompt_tokens=[np.asarray(prompt_ids[row.request], np.int32) for row in rows],
        tokens=[np.asarray(row.tokens, np.int32) for row in rows],
        logprobs=[np.asarray(row.logprobs, np.float32) for row in rows],
        lengths=np.asarray([len(row.tokens) for row in rows], np.int32),
        finish_reasons=[row.reason for row in rows],
        texts=None if self.tokenizer is None else [row.text for row in rows])


def _device_bytes(x: jax.Array) -> int:
  """Bytes of x's shards on their devices (a replicated array counts once per device)."""
  return sum(shard.data.nbytes for shard in x.addressable_shards)
