"""The device side of continuous batching: a fixed set of decode slots over one KV cache.

Slot b is one row of a (slots, S) KV cache. A request's sample enters a slot by copying its prompt's
KV (from a batched prefill, left-padded to a bucket of length L) into columns [0, L) of that row;
its generated tokens then go to the row's own next column (`write_at`), so rows of different ages
decode side by side (the decoder takes a per-row cache index). Besides `init_slots`, three device
functions, whose shapes depend only on (slots, S, chunk), the prefill batch (P, L), the sample count
and the attention window, never on the number of requests:

  prefill_prompts(params, ids (P, L), mask, requests (P,), key) -> Prefix    one program per (P, L)
  insert(state, prefix, admit, key) -> state                                one program per (P, L)
  decode_chunk(params, state, host_done, refill_at, window) -> (state, Emitted)  one per window

The prefill also draws token 0 of every sample of its prompts (P x n draws, once per prompt), so
`insert` only copies: a cache row per admitted sample (a loop over the admitted count, not over
every slot) and a few scalars.

A row's token t is drawn with fold_in(fold_in(fold_in(key, request), sample), t), exactly the static
sampler's key for (prompt request, sample, step t): draws do not depend on which slot a row lands in
or when it starts.

`SlotPrograms(mesh)` jits these with explicit shardings on a (data, fsdp, tensor) mesh: slots and
prefill rows over the batch axes (data, fsdp), KV-cache heads over `tensor` (where they divide it),
params by sharding.PARAM_RULES, small per-call inputs replicated. Without a mesh the same functions
are jitted plainly (one device). `cast_params` makes the compute-dtype copy of the weights once per
policy update, so the decode loop itself converts no weight.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from compassplay_jax.infra import sharding as sh
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import KVCache, default_positions
from compassplay_jax.sampling.config import SamplerParams
from compassplay_jax.sampling.token_select import select_tokens, step_keys


class Prefix(NamedTuple):
  """P prompts after one batched prefill, kept until each of their samples has entered a slot."""
  cache: list            # per-layer KVCache (P, L, kv_heads, head_dim)
  first_col: jax.Array   # (P,) int32: L - prompt length (the left padding)
  position: jax.Array    # (P,) int32: prompt length = position id of completion token 0
  tokens: jax.Array      # (P, n) int32 token 0 of each sample
  logprobs: jax.Array    # (P, n) float32 its log-prob


class Admit(NamedTuple):
  """Which samples enter which slots in one `insert` (arrays of length slots; the first `count` used)."""
  slot: np.ndarray     # (B,) int32 destination slot
  row: np.ndarray      # (B,) int32 the prompt's row in the Prefix
  request: np.ndarray  # (B,) int32 the request (for the row's PRNG key)
  sample: np.ndarray   # (B,) int32 the sample number
  budget: np.ndarray   # (B,) int32 the row's max new tokens
  count: np.ndarray    # () int32


class SlotState(NamedTuple):
  """Everything the decode loop carries. B slots, S cache columns, W = chunk + 1."""
  cache: list              # per-layer KVCache (B, S, kv_heads, head_dim)
  first_col: jax.Array     # (B,) int32 first valid cache column of the row
  write_at: jax.Array      # (B,) int32 cache column where `last_token` is written when fed
  positions: jax.Array     # (B,) int32 position id of `last_token`
  last_token: jax.Array    # (B,) int32 the row's latest sampled token
  count: jax.Array         # (B,) int32 tokens the row has sampled
  budget: jax.Array        # (B,) int32 the row's max new tokens
  done: jax.Array          # (B,) bool finished (or never filled)
  keys: jax.Array          # (B, ...) the row's PRNG key
  out_tokens: jax.Array    # (B, W) int32 tokens sampled since the host last read
  out_logprobs: jax.Array  # (B, W) float32 their log-probs
  out_count: jax.Array     # (B,) int32 how many of out_tokens are new


class Emitted(NamedTuple):
  """What one decode_chunk hands the host (small: (B, W))."""
  tokens: jax.Array
  logprobs: jax.Array
  count: jax.Array
  done: jax.Array
  steps: jax.Array  # () int32 decode iterations this call ran


def _is_eos(tokens, eos_ids):
  if not eos_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32))


def _row_keys(key, request, sample):
  """fold_in(fold_in(key, request), sample) for (K,) requests and samples."""
  per_request = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, request)
  return jax.vmap(jax.random.fold_in)(per_request, sample)


def init_slots(key, *, cfg: ModelConfig, slots: int, length: int, chunk: int, cache_dtype: str) -> SlotState:
  """All slots empty (done). key: a PRNG key of the type the rows will use (sets the keys' layout)."""
  shape = (slots, length, cfg.num_key_value_heads, cfg.head_dim)
  cache = [KVCache(jnp.zeros(shape, cache_dtype), jnp.zeros(shape, cache_dtype))
           for _ in range(cfg.num_hidden_layers)]
  zeros = jnp.zeros((slots,), jnp.int32)
  return SlotState(cache=cache, first_col=zeros, write_at=zeros, positions=zeros, last_token=zeros,
                   count=zeros, budget=zeros, done=jnp.ones((slots,), bool),
                   keys=jnp.stack([key] * slots), out_tokens=jnp.zeros((slots, chunk + 1), jnp.int32),
                   out_logprobs=jnp.zeros((slots, chunk + 1), jnp.float32), out_count=zeros)


def prefill_prompts(graphdef, params, input_ids, prompt_mask, requests, key, *, n_samples: int,
                    sampler: SamplerParams, cache_dtype: str) -> Prefix:
  """Runs P left-padded prompts (P, L) into a cache of exactly L columns and draws token 0 of each
  of their n samples from the last token's logits (padding rows: any request number; never inserted)."""
  model = nnx.merge(graphdef, params)
  p, l = input_ids.shape
  cache = model.init_cache(p, l, jnp.dtype(cache_dtype))
  logits, cache = model(input_ids, prompt_mask, default_positions(prompt_mask), cache=cache, cache_index=0,
                        last_only=True)
  n = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)
  sample = jnp.tile(jnp.arange(n_samples, dtype=jnp.int32), p)
  keys = _row_keys(key, jnp.repeat(requests, n_samples), sample)
  tokens, logprobs = select_tokens(jnp.repeat(logits[:, -1], n_samples, axis=0), step_keys(keys, jnp.int32(0)),
                                   sampler)
  return Prefix(cache=cache, first_col=l - n, position=n, tokens=tokens.reshape(p, n_samples),
                logprobs=logprobs.reshape(p, n_samples))


def insert(state: SlotState, prefix: Prefix, admit: Admit, key, *, eos_ids: tuple[int, ...]) -> SlotState:
  """Puts admit.count samples into their slots: copies each one's prompt KV into its row's columns
  [0, L), sets token 0 (drawn by the prefill) and arms the row with its budget."""
  b = state.done.shape[0]
  l = prefix.cache[0].k.shape[1]

  def copy(i, cache):
    slot, row = admit.slot[i], admit.row[i]
    one = lambda c, p: jax.lax.dynamic_update_slice(
        c, jax.lax.dynamic_slice_in_dim(p, row, 1, axis=0), (slot, 0, 0, 0))
    return [KVCache(one(c.k, p.k), one(c.v, p.v)) for c, p in zip(cache, prefix.cache)]

  cache = jax.lax.fori_loop(0, admit.count, copy, state.cache)
  valid = jnp.arange(b) < admit.count
  slot = jnp.where(valid, admit.slot, b)  # entries past count scatter out of range: dropped
  token = prefix.tokens[admit.row, admit.sample]
  logprob = prefix.logprobs[admit.row, admit.sample]
  put = lambda arr, value: arr.at[slot].set(value, mode="drop")
  return state._replace(
      cache=cache,
      first_col=put(state.first_col, prefix.first_col[admit.row]),
      write_at=put(state.write_at, jnp.full((b,), l, jnp.int32)),
      positions=put(state.positions, prefix.position[admit.row]),
      last_token=put(state.last_token, token),
      count=put(state.count, jnp.ones((b,), jnp.int32)),
      budget=put(state.budget, admit.budget),
      done=put(state.done, _is_eos(token, eos_ids) | (admit.budget <= 1)),
      keys=put(state.keys, _row_keys(key, admit.request, admit.sample)),
      out_tokens=state.out_tokens.at[slot, 0].set(token, mode="drop"),
      out_logprobs=state.out_logprobs.at[slot, 0].set(logprob, mode="drop"),
      out_count=put(state.out_count, jnp.ones((b,), jnp.int32)))


def windows(length: int, smallest: int = 64) -> tuple[int, ...]:
  """Attention windows decode_chunk may use for a cache of `length` columns: length, length/2, ...
  down to `smallest` (so at most log2(length / smallest) + 1 decode programs)."""
  out = [length]
  while out[-1] % 2 == 0 and out[-1] // 2 >= smallest:
    out.append(out[-1] // 2)
  return tuple(out)


def decode_chunk(graphdef, params, state: SlotState, host_done, refill_at, *, sampler: SamplerParams,
                 eos_ids: tuple[int, ...], window: int) -> tuple[SlotState, Emitted]:
  """Decodes every live slot for up to `chunk` steps.

  Attention reads only the first `window` cache columns (static; one of `windows(S)`): the host picks
  the smallest window holding every live row's columns through this chunk, so short rows do not pay
  for the longest budget's cache length.

  Stops early when every slot is done, or when at least `refill_at` slots are free (the host passes
  a small number while requests wait, so a finished row's slot is refilled soon, and slots + 1 when
  the queue is empty). host_done (B,) ends rows the host stopped (stop strings).
  """
  model = nnx.merge(graphdef, params)
  cols = jnp.arange(window)

  def forward(st):
    mask = (cols[None, :] >= st.first_col[:, None]).astype(jnp.int32)  # columns after write_at: causal
    logits, cache = model(st.last_token[:, None], mask, st.positions[:, None], cache=st.cache,
                          cache_index=st.write_at, last_only=True)
    return logits[:, -1], st._replace(cache=cache, write_at=st.write_at + (~st.done).astype(jnp.int32))

  return decode_rows(state, host_done, refill_at, forward, sampler=sampler, eos_ids=eos_ids)


def decode_rows(state, host_done, refill_at, forward, *, sampler: SamplerParams, eos_ids: tuple[int, ...]):
  """The decode loop of both cache layouts (this module's dense slots, paged_slots' pages): up to
  `chunk` steps, stopping as decode_chunk says. forward(st) -> (logits (B, V) of each slot's last
  token, st with that token's KV written and the layout's write position advanced for live rows);
  the rest of a step is the same for both: each live row's next token drawn, counted and appended
  to the out buffers, rows ended on eos or their budget."""
  b, width = state.out_tokens.shape
  rows = jnp.arange(b)

  def cond(carry):
    i, st = carry
    return (i < width - 1) & ~jnp.all(st.done) & (jnp.sum(st.done) < refill_at)

  def body(carry):
    i, st = carry
    live = ~st.done
    logits, st = forward(st)
    tokens, logprobs = select_tokens(logits, step_keys(st.keys, st.count), sampler)
    step = live.astype(jnp.int32)
    count = st.count + step
    st = st._replace(
        positions=st.positions + step,
        last_token=jnp.where(live, tokens, st.last_token),
        count=count,
        done=st.done | (live & (_is_eos(tokens, eos_ids) | (count >= st.budget))),
        # Done rows write past their count; the host reads only out_tokens[b, :out_count[b]].
        out_tokens=st.out_tokens.at[rows, st.out_count].set(tokens, mode="drop"),
        out_logprobs=st.out_logprobs.at[rows, st.out_count].set(logprobs, mode="drop"),
        out_count=st.out_count + step)
    return i + 1, st

  state = state._replace(done=state.done | host_done)
  steps, state = jax.lax.while_loop(cond, body, (jnp.int32(0), state))
  emitted = Emitted(state.out_tokens, state.out_logprobs, state.out_count, state.done, steps)
  return state._replace(out_count=jnp.zeros_like(state.out_count)), emitted


def compact(state: SlotState, keep, valid) -> SlotState:
  """A state of len(keep) slots: slot k is old slot keep[k]; slots where `valid` is False are empty.

  The host shrinks the slots this way once no request waits and at most half of them are live, so
  the last rows of a call decode in a smaller batch instead of beside empty slots."""
  new = jax.tree.map(lambda x: x[keep], state)
  return new._replace(done=new.done | ~valid)


def cast_params(params, dtype):
  """Floating leaves in `dtype` (the decoder casts every weight to its compute dtype before use, so
  this copy gives the same results with no cast left in the decode loop)."""
  def one(x):
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
  return jax.tree.map(one, params)


def _shape(x) -> tuple:
  return (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", "")))


class _HostArgsPlaced:
  """A jitted program whose host (numpy) arguments are put on their shardings first: under several
  processes jit refuses numpy inputs with non-replicated shardings, even on a host-local mesh.
  `lower` is the jit's own (tests read the HLO)."""

  def __init__(self, jitted, in_shardings):
    self.jitted, self.in_shardings = jitted, in_shardings
    self.lower = jitted.lower

  def __call__(self, *args):
    put = lambda s, x: x if isinstance(x, jax.Array) else jax.device_put(x, s)
    return self.jitted(*jax.tree.map(put, self.in_shardings, args))


class SlotPrograms:
  """The slot functions jitted for one mesh, cached per (static knobs, input shapes).

  mesh: a (data, fsdp, tensor) mesh (sharding.AXES); every array these programs make lives on it:
  slots and prefill rows over (data, fsdp), cache heads over tensor where they divide it, params by
  the partition rules, admission arrays and scalars replicated. None: plain jits on one device.
  """

  def __init__(self, mesh=None, head_dim: int | None = None):
    if mesh is not None and mesh.size == 1:
      mesh = None  # one device: plain jit, nothing to lay out
    self.mesh, self.head_dim = mesh, head_dim
    self._jits: dict = {}
    self.compiles: dict[str, int] = {"init_slots": 0, "prefill_prompts": 0, "insert": 0, "decode_chunk": 0,
                                     "compact": 0, "cast_params": 0}

  @property
  def batch_divisor(self) -> int:
    return 1 if self.mesh is None else sh.batch_divisor(self.mesh)

  @property
  def tensor_size(self) -> int:
    return 1 if self.mesh is None else self.mesh.shape["tensor"]

  # ---- layouts -------------------------------------------------------------------------------------

  def _rows(self, tree):
    """Leading dim over (data, fsdp), caches' kv heads over tensor, scalars replicated."""
    return sh.decode_state_shardings(self.mesh, tree)

  def _repl(self, tree):
    return jax.tree.map(lambda _: sh.replicated(self.mesh), tree)

  def param_shardings(self, params):
    return sh.tree_shardings(params, self.mesh, self.head_dim)

  def _jit(self, name, sig, build):
    key = (name,) + sig
    if key not in self._jits:
      self._jits[key] = build()
      self.compiles[name] += 1
    return self._jits[key]

  # ---- programs ------------------------------------------------------------------------------------

  def init_slots(self, key, *, cfg: ModelConfig, slots: int, length: int, chunk: int, cache_dtype: str) -> SlotState:
    static = dict(cfg=cfg, slots=slots, length=length, chunk=chunk, cache_dtype=cache_dtype)

    def build():
      def init_slots_program(k):  # named: compile logs and profiles show the name
        return init_slots(k, **static)
      fn = init_slots_program
      if self.mesh is None:
        return jax.jit(fn)
      return _HostArgsPlaced(jax.jit(fn, in_shardings=sh.replicated(self.mesh),
                                     out_shardings=self._rows(jax.eval_shape(fn, key))), (sh.replicated(self.mesh),))
    return self._jit("init_slots", (tuple(sorted(static.items())), _shape(key)), build)(key)

  def prefill_prompts(self, graphdef, params, input_ids, prompt_mask, requests, key, *, n_samples: int,
                      sampler: SamplerParams, cache_dtype: str) -> Prefix:
    static = dict(n_samples=n_samples, sampler=sampler, cache_dtype=cache_dtype)
    args = (params, input_ids, prompt_mask, requests, key)

    def build():
      def prefill_prompts_program(*a):
        return prefill_prompts(graphdef, *a, **static)
      fn = prefill_prompts_program
      if self.mesh is None:
        return jax.jit(fn)
      rows = self._rows((input_ids, prompt_mask, requests))
      ins = (self.param_shardings(params), *rows, sh.replicated(self.mesh))
      return _HostArgsPlaced(sh.jit(fn, in_shardings=ins, out_shardings=self._rows(jax.eval_shape(fn, *args))), ins)
    sig = (graphdef, tuple(sorted(static.items())), tuple(_shape(x) for x in jax.tree.leaves(args)))
    return self._jit("prefill_prompts", sig, build)(*args)

  def insert(self, state: SlotState, prefix: Prefix, admit: Admit, key, *, eos_ids: tuple[int, ...]) -> SlotState:
    def build():
      def insert_program(st, pre, adm, k):
        return insert(st, pre, adm, k, eos_ids=eos_ids)
      fn = insert_program
      if self.mesh is None:
        return jax.jit(fn, donate_argnums=(0,))
      s_sh = self._rows(state)
      ins = (s_sh, self._rows(prefix), self._repl(admit), sh.replicated(self.mesh))
      return _HostArgsPlaced(jax.jit(fn, in_shardings=ins, out_shardings=s_sh, donate_argnums=(0,)), ins)
    sig = (eos_ids, tuple(_shape(x) for x in jax.tree.leaves((state, prefix, admit, key))))
    return self._jit("insert", sig, build)(state, prefix, admit, key)

  def decode_chunk(self, graphdef, params, state: SlotState, host_done, refill_at, *, sampler: SamplerParams,
                   eos_ids: tuple[int, ...], window: int) -> tuple[SlotState, Emitted]:
    return self.decode_chunk_jit(graphdef, params, state, host_done, refill_at, sampler=sampler, eos_ids=eos_ids,
                                 window=window)(params, state, host_done, refill_at)

  def decode_chunk_jit(self, graphdef, params, state, host_done, refill_at, *, sampler: SamplerParams,
                       eos_ids: tuple[int, ...], window: int):
    """The jitted `(params, state, host_done, refill_at) -> (state, Emitted)` for these shapes (the
    arguments may be ShapeDtypeStructs: tests lower it to read its HLO)."""
    static = dict(sampler=sampler, eos_ids=eos_ids, window=window)

    def build():
      def decode_chunk_program(p, st, hd, r):
        return decode_chunk(graphdef, p, st, hd, r, **static)
      fn = decode_chunk_program
      if self.mesh is None:
        return jax.jit(fn, donate_argnums=(1,))
      s_sh = self._rows(state)
      out = jax.eval_shape(fn, params, state, host_done, refill_at)
      ins = (self.param_shardings(params), s_sh, self._rows(host_done), sh.replicated(self.mesh))
      return _HostArgsPlaced(sh.jit(fn, in_shardings=ins, out_shardings=(s_sh, self._rows(out[1])),
                                     donate_argnums=(1,)), ins)
    sig = (graphdef, tuple(sorted(static.items())),
           tuple(_shape(x) for x in jax.tree.leaves((params, state, host_done, refill_at))))
    return self._jit("decode_chunk", sig, build)

  def compact(self, state: SlotState, keep: np.ndarray, valid: np.ndarray) -> SlotState:
    """`compact` on the mesh: keep and valid are (new slots,) and split like the slots, with local
    indices (each device keeps rows it holds: no KV row crosses devices)."""
    sig = tuple(_shape(x) for x in jax.tree.leaves((state, keep)))
    if self.mesh is None:
      return self._jit("compact", sig, lambda: jax.jit(compact))(state, keep, valid)

    def build():
      specs = jax.tree.map(lambda s: s.spec, self._rows(state))
      rows = P(sh.BATCH_AXES)
      local = jax.shard_map(compact, mesh=self.mesh, in_specs=(specs, rows, rows), out_specs=specs)
      split = NamedSharding(self.mesh, rows)
      return _HostArgsPlaced(jax.jit(local), (self._rows(state), split, split))
    return self._jit("compact", sig, build)(state, keep, valid)

  def cast_params(self, params, dtype: str):
    """The compute-dtype copy of `params`, laid out on the mesh (params already so are returned as
    they are: no copy)."""
    dtype = jnp.dtype(dtype)
    leaves = jax.tree.leaves(params)
    needs_cast = any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype for x in leaves)
    if self.mesh is None:
      if not needs_cast:
        return params
      fn = self._jit("cast_params", (str(dtype), tuple(_shape(x) for x in leaves)),
                     lambda: jax.jit(lambda p: cast_params(p, dtype)))
      return fn(params)
    shardings = self.param_shardings(params)
    devices = set(self.mesh.devices.flat)
    if any(getattr(x, "sharding", None) is None or set(x.sharding.device_set) != devices for x in leaves):
      params = jax.device_put(params, shardings)  # onto this mesh first (e.g. from a host or another mesh)
    if not needs_cast:
      return params  # the programs' in_shardings lay them out as the rules say
    fn = self._jit("cast_params", (str(dtype), tuple(_shape(x) for x in leaves)),
                   lambda: jax.jit(lambda p: cast_params(p, dtype), out_shardings=shardings))
    return fn(params)

  def compile_counts(self) -> dict[str, int]:
    """Distinct programs built per function (each jit holds one input signature: one compilation)."""
    return dict(self.compiles)

  def admit_arrays(self, slots: int) -> Admit:
    """An empty admission of `slots` entries (host arrays the engine fills)."""
    z = lambda: np.zeros((slots,), np.int32)
    return Admit(z(), z(), z(), z(), z(), np.int32(0))
