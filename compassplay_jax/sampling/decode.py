"""The device side of generation: a jitted prefill and a jitted `lax.while_loop` decode.

Both are pure functions of (graphdef, params, ...) with the sampler knobs static. The decode state
(KV cache included) is donated from call to call so XLA updates the cache in place. A decode call runs
until `stop_at` tokens exist or every row is done; `generate` calls it once when there are no stop
strings, or once per `stop_check_every` tokens when it must check stop strings on the host.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from compassplay_jax.models.decoder import default_positions
from compassplay_jax.sampling.config import SamplerParams
from compassplay_jax.sampling.token_select import select_tokens, step_keys


class DecodeState(NamedTuple):
  """Everything the decode loop carries. B rows (prompts x samples), N = max new tokens."""
  step: jax.Array       # () int32: index of the next token to sample
  tokens: jax.Array     # (B, N) int32 sampled tokens (pad after a row ends)
  logprobs: jax.Array   # (B, N) float32 their log-probs (0 after a row ends)
  lengths: jax.Array    # (B,) int32 tokens sampled while the row was live (eos included)
  done: jax.Array       # (B,) bool
  hit_eos: jax.Array    # (B,) bool: the row ended on an eos id
  cache: list           # per-layer KVCache, S = prompt bucket + N slots
  mask: jax.Array       # (B, S) int32 valid cache slots
  positions: jax.Array  # (B,) int32 position of the last sampled token
  keys: jax.Array       # (B, ...) one PRNG key per row


def _row_keys(key, prompt_index, n_samples):
  """Key of (prompt i, sample j) = fold_in(fold_in(key, i), j): independent of batching."""
  per_prompt = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, prompt_index)
  sample = jnp.arange(n_samples, dtype=jnp.int32)
  grid = jax.vmap(lambda k: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(k, sample))(per_prompt)
  return grid.reshape((-1,) + grid.shape[2:])


def _record(state: DecodeState, tokens, logprobs, eos_ids, pad_id) -> DecodeState:
  """Writes step `state.step`'s tokens; rows already done get (pad, 0) and stay unchanged."""
  live = ~state.done
  tokens = jnp.where(live, tokens, pad_id)
  logprobs = jnp.where(live, logprobs, 0.0)
  is_eos = live & jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(live)
  return state._replace(
      step=state.step + 1,
      tokens=jax.lax.dynamic_update_slice(state.tokens, tokens[:, None], (0, state.step)),
      logprobs=jax.lax.dynamic_update_slice(state.logprobs, logprobs[:, None], (0, state.step)),
      lengths=state.lengths + live.astype(jnp.int32),
      done=state.done | is_eos,
      hit_eos=state.hit_eos | is_eos)


@functools.partial(jax.jit, static_argnames=("graphdef", "n_samples", "max_new_tokens", "sampler",
                                             "eos_ids", "pad_id"))
def prefill(graphdef, params, input_ids, prompt_mask, prompt_index, row_live, key, *, n_samples: int,
            max_new_tokens: int, sampler: SamplerParams, eos_ids: tuple[int, ...], pad_id: int) -> DecodeState:
  """Runs the left-padded prompts (P, L) once, copies the cache n_samples times, samples token 0.

  prompt_index (P,): global prompt numbers (for the keys); row_live (P,): False for padding rows.
  """
  model = nnx.merge(graphdef, params)
  p, l = input_ids.shape
  s = l + max_new_tokens
  mask = jnp.zeros((p, s), jnp.int32).at[:, :l].set(prompt_mask.astype(jnp.int32))
  positions = default_positions(prompt_mask)
  cache = model.init_cache(p, s)
  logits, cache = model(input_ids, mask, positions, cache=cache, cache_index=0, last_only=True)
  rep = lambda x: jnp.repeat(x, n_samples, axis=0)
  b = p * n_samples
  state = DecodeState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.full((b, max_new_tokens), pad_id, jnp.int32),
      logprobs=jnp.zeros((b, max_new_tokens), jnp.float32),
      lengths=jnp.zeros((b,), jnp.int32),
      done=~rep(row_live),
      hit_eos=jnp.zeros((b,), bool),
      cache=jax.tree.map(rep, cache),
      mask=rep(mask),
      positions=rep(positions[:, -1]),
      keys=_row_keys(key, prompt_index, n_samples))
  tokens, logprobs = select_tokens(rep(logits[:, -1]), step_keys(state.keys, state.step), sampler)
  return _record(state, tokens, logprobs, eos_ids, pad_id)


@functools.partial(jax.jit, static_argnames=("graphdef", "sampler", "eos_ids", "pad_id"), donate_argnums=(2,))
def decode(graphdef, params, state: DecodeState, stop_at, host_done, *, sampler: SamplerParams,
           eos_ids: tuple[int, ...], pad_id: int) -> DecodeState:
  """Samples tokens state.step .. min(stop_at, N) - 1, stopping early once every row is done.

  host_done (B,) bool marks rows the host ended (stop strings) since the last call.
  """
  model = nnx.merge(graphdef, params)
  n = state.tokens.shape[1]
  prompt_len = state.mask.shape[1] - n
  stop_at = jnp.minimum(stop_at, n)

  def cond(st: DecodeState):
    return (st.step < stop_at) & ~jnp.all(st.done)

  def body(st: DecodeState):
    slot = prompt_len + st.step - 1  # where the previous token goes in the cache
    last = jax.lax.dynamic_slice_in_dim(st.tokens, st.step - 1, 1, axis=1)
    mask = jax.lax.dynamic_update_slice(st.mask, jnp.ones((st.mask.shape[0], 1), jnp.int32), (0, slot))
    positions = st.positions + 1
    logits, cache = model(last, mask, positions[:, None], cache=st.cache, cache_index=slot, last_only=True)
    st = st._replace(cache=cache, mask=mask, positions=positions)
    tokens, logprobs = select_tokens(logits[:, -1], step_keys(st.keys, st.step), sampler)
    return _record(st, tokens, logprobs, eos_ids, pad_id)

  state = state._replace(done=state.done | host_done)
  return jax.lax.while_loop(cond, body, state)


def compile_counts() -> dict[str, int]:
  """How many distinct compilations each jitted entry point holds (tests bound these)."""
  return {"prefill": prefill._cache_size(), "decode": decode._cache_size()}
