"""The device side of continuous batching: a fixed set of decode slots over one KV cache.

Slot b is one row of a (slots, S) KV cache. A request's sample enters a slot by copying its prompt's
KV (from a one-prompt prefill, left-padded to a bucket of length L) into columns [0, L) of that row;
its generated tokens then go to the row's own next column (`write_at`), so rows of different ages
decode side by side (the decoder takes a per-row cache index). Besides `init_slots`, three jitted
functions, whose shapes depend only on (slots, S, chunk), the prompt bucket L and the attention
window, never on the number of requests:

  prefill_prompt(params, ids (1, L), mask (1, L)) -> Prefix         one compile per bucket
  insert(state, prefix, slot, key, request, sample, budget) -> state one compile per bucket (donated)
  decode_chunk(params, state, host_done, refill_at, window) -> (state, Emitted)  one compile per window

A row's token t is drawn with fold_in(fold_in(fold_in(key, request), sample), t), exactly the static
sampler's key for (prompt request, sample, step t): draws do not depend on which slot a row lands in
or when it starts.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import KVCache, default_positions
from compassplay_jax.sampling.config import SamplerParams
from compassplay_jax.sampling.token_select import select_tokens, step_keys


class Prefix(NamedTuple):
  """One prompt after prefill, shared by its samples until all have entered a slot."""
  cache: list            # per-layer KVCache (1, L, kv_heads, head_dim)
  logits: jax.Array      # (1, V) float32 logits after the last prompt token
  first_col: jax.Array   # () int32: L - prompt length (the left padding)
  position: jax.Array    # () int32: prompt length = position id of completion token 0


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


@functools.partial(jax.jit, static_argnames=("cfg", "slots", "length", "chunk", "cache_dtype"))
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


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_dtype"))
def prefill_prompt(graphdef, params, input_ids, prompt_mask, *, cache_dtype: str) -> Prefix:
  """Runs one left-padded prompt (1, L) into a cache of exactly L columns; logits of the last token."""
  model = nnx.merge(graphdef, params)
  l = input_ids.shape[1]
  cache = model.init_cache(1, l, jnp.dtype(cache_dtype))
  logits, cache = model(input_ids, prompt_mask, default_positions(prompt_mask), cache=cache, cache_index=0,
                        last_only=True)
  n = jnp.sum(prompt_mask, dtype=jnp.int32)
  return Prefix(cache=cache, logits=logits[:, -1], first_col=l - n, position=n)


@functools.partial(jax.jit, static_argnames=("sampler", "eos_ids"), donate_argnums=(0,))
def insert(state: SlotState, prefix: Prefix, slot, key, request, sample, budget, *, sampler: SamplerParams,
           eos_ids: tuple[int, ...]) -> SlotState:
  """Puts sample `sample` of request `request` into `slot`: copies the prompt's KV into the row's
  columns [0, L), draws its token 0 from the prefill logits, and arms the row with its budget."""
  row_key = jax.random.fold_in(jax.random.fold_in(key, request), sample)
  tokens, logprobs = select_tokens(prefix.logits, step_keys(row_key[None], jnp.int32(0)), sampler)
  token, logprob = tokens[0], logprobs[0]
  cache = [KVCache(jax.lax.dynamic_update_slice(c.k, p.k, (slot, 0, 0, 0)),
                   jax.lax.dynamic_update_slice(c.v, p.v, (slot, 0, 0, 0)))
           for c, p in zip(state.cache, prefix.cache)]
  length = prefix.cache[0].k.shape[1]
  return state._replace(
      cache=cache,
      first_col=state.first_col.at[slot].set(prefix.first_col),
      write_at=state.write_at.at[slot].set(length),
      positions=state.positions.at[slot].set(prefix.position),
      last_token=state.last_token.at[slot].set(token),
      count=state.count.at[slot].set(1),
      budget=state.budget.at[slot].set(budget),
      done=state.done.at[slot].set(_is_eos(token, eos_ids) | (budget <= 1)),
      keys=state.keys.at[slot].set(row_key),
      out_tokens=state.out_tokens.at[slot, 0].set(token),
      out_logprobs=state.out_logprobs.at[slot, 0].set(logprob),
      out_count=state.out_count.at[slot].set(1))


def windows(length: int, smallest: int = 64) -> tuple[int, ...]:
  """Attention windows decode_chunk may use for a cache of `length` columns: length, length/2, ...
  down to `smallest` (so at most log2(length / smallest) + 1 decode programs)."""
  out = [length]
  while out[-1] % 2 == 0 and out[-1] // 2 >= smallest:
    out.append(out[-1] // 2)
  return tuple(out)


@functools.partial(jax.jit, static_argnames=("graphdef", "sampler", "eos_ids", "window"), donate_argnums=(2,))
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
  b, width = state.out_tokens.shape
  rows = jnp.arange(b)
  cols = jnp.arange(window)

  def cond(carry):
    i, st = carry
    return (i < width - 1) & ~jnp.all(st.done) & (jnp.sum(st.done) < refill_at)

  def body(carry):
    i, st = carry
    live = ~st.done
    mask = (cols[None, :] >= st.first_col[:, None]).astype(jnp.int32)  # columns after write_at: causal
    logits, cache = model(st.last_token[:, None], mask, st.positions[:, None], cache=st.cache,
                          cache_index=st.write_at, last_only=True)
    tokens, logprobs = select_tokens(logits[:, -1], step_keys(st.keys, st.count), sampler)
    step = live.astype(jnp.int32)
    count = st.count + step
    st = st._replace(
        cache=cache,
        write_at=st.write_at + step,
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


def compile_counts() -> dict[str, int]:
  """Distinct compilations held by each jitted entry point (tests bound these)."""
  return {"init_slots": init_slots._cache_size(), "prefill_prompt": prefill_prompt._cache_size(),
          "insert": insert._cache_size(), "decode_chunk": decode_chunk._cache_size()}
