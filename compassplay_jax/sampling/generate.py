"""`generate`: prompts in, completions with log-probs and finish reasons out.

Host work per micro-batch: one prefill call, then one decode call (no stop strings) or one decode
call per `stop_check_every` tokens (stop strings, checked by `StopFinder` in between). Tokens never
cross to the host one at a time.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.models.decoder import model_config
from compassplay_jax.sampling import batching, decode
from compassplay_jax.sampling.config import SamplingConfig
from compassplay_jax.sampling.prompts import encode_prompts
from compassplay_jax.sampling.stops import StopFinder

FINISH_REASONS = ("eos", "stop", "length")


@dataclasses.dataclass
class GenerationResult:
  """One row per (prompt, sample), prompt-major: row = prompt_index * n_samples + sample_index.

  tokens[r]: completion ids (the eos id included when the row ended on eos; cut after the stop token).
  logprobs[r]: float32 log-prob of each completion token under the full tempered distribution.
  texts[r]: decoded completion without special tokens, cut right after a stop string (kept).
  """
  prompt_index: np.ndarray
  sample_index: np.ndarray
  prompt_tokens: list[np.ndarray]
  tokens: list[np.ndarray]
  logprobs: list[np.ndarray]
  lengths: np.ndarray
  finish_reasons: list[str]
  texts: list[str] | None

  def __len__(self) -> int:
    return len(self.tokens)


def as_prng_key(key):
  """A typed PRNG key from an int seed; keys pass through."""
  return jax.random.key(key) if isinstance(key, int) else key


def resolve_eos_ids(tokenizer, config: SamplingConfig) -> tuple[int, ...]:
  """The ids that end a row: config.eos_ids if given, else the tokenizer's."""
  if config.eos_ids is not None:
    return config.eos_ids
  if tokenizer is None:
    raise ValueError("eos_ids must be given in SamplingConfig when there is no tokenizer")
  from compassplay_jax.models.tokenizer import eos_token_ids
  return eos_token_ids(tokenizer)


def resolve_pad_id(tokenizer, eos_ids) -> int:
  """The tokenizer's pad id, else the first eos id, else 0."""
  pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
  return int(pad if pad is not None else (eos_ids[0] if eos_ids else 0))


def _run_micro_batch(graphdef, params, mb: batching.MicroBatch, key, config: SamplingConfig,
                     eos_ids, pad_id, finder: StopFinder, fns=decode, key_index=None):
  """Decodes one micro-batch; returns host arrays (tokens, logprobs, lengths, reasons) per row."""
  static = dict(sampler=config.sampler, eos_ids=eos_ids, pad_id=pad_id)
  key_ids = mb.prompt_index if key_index is None else key_index[mb.prompt_index]
  state = fns.prefill(graphdef, params, jnp.asarray(mb.input_ids), jnp.asarray(mb.mask),
                         jnp.asarray(key_ids), jnp.asarray(mb.live), key,
                         n_samples=config.n_samples, max_new_tokens=config.max_new_tokens, **static)
  n, rows = config.max_new_tokens, mb.input_ids.shape[0] * config.n_samples
  host_done = ~np.repeat(mb.live, config.n_samples)
  stop_len = np.zeros((rows,), np.int32)  # > 0 where a stop string ended the row
  chunk = config.stop_check_every if finder.stop_strings else n
  checked = 0
  while True:
    step = int(state.step)
    state = fns.decode(graphdef, params, state, jnp.int32(min(n, step + chunk)), jnp.asarray(host_done),
                          **static)
    step = int(state.step)
    done = np.asarray(state.done)
    if finder.stop_strings:
      tokens, lengths = np.asarray(state.tokens), np.asarray(state.lengths)
      for r in np.flatnonzero(~host_done):
        t = finder.first_stop(tokens[r, :lengths[r]], checked, int(lengths[r]))
        if t is not None:
          stop_len[r], host_done[r] = t + 1, True
      checked = step
    if step >= n or np.all(done | host_done):
      break
  tokens, logprobs = np.asarray(state.tokens), np.asarray(state.logprobs)
  lengths, hit_eos = np.asarray(state.lengths).copy(), np.asarray(state.hit_eos)
  reasons = np.where(hit_eos, "eos", "length").astype(object)
  stopped = stop_len > 0
  lengths[stopped], reasons[stopped] = stop_len[stopped], "stop"
  return tokens, logprobs, lengths, reasons


def generate(graphdef, params, tokenizer, prompts: Sequence[str] | Sequence[Sequence[int]],
             config: SamplingConfig, key, device_fns=None, key_index=None, on_finish=None) -> GenerationResult:
  """Samples `config.n_samples` completions for each prompt (text or token ids).

  graphdef, params: `nnx.split(model)`; params may be sharded over a mesh. key: a PRNG key (or int
  seed); the draws of (prompt i, sample j) depend only on (key, i, j), not on batching.
  tokenizer may be None for id prompts without stop strings (eos_ids must then be in config).
  device_fns: an object with `prefill` and `decode` like `decode`'s, e.g. `sharding.ShardedSampler(mesh)`
  to run them with explicit shardings on a mesh; None uses the plain jitted ones.
  key_index: the number each prompt's keys are folded with (default its position), so a caller that
  splits one request list into several calls (engine.StaticEngine) keeps each request's draws.
  on_finish: called as on_finish(row, tokens, text, finish_reason) for the rows of each micro-batch
  when it ends (rows prompt-major, as in the result), before this returns.
  """
  if not prompts:
    raise ValueError("prompts is empty")
  prompt_ids = encode_prompts(tokenizer, prompts)
  eos_ids = resolve_eos_ids(tokenizer, config)
  pad_id = resolve_pad_id(tokenizer, eos_ids)
  finder = StopFinder(tokenizer, config.stop_strings)
  key = as_prng_key(key)
  model_cfg = graphdef_config(graphdef, params)
  n_rows = len(prompt_ids) * config.n_samples
  out_tokens, out_lp = [None] * n_rows, [None] * n_rows
  out_len, out_reason = np.zeros((n_rows,), np.int32), [None] * n_rows
  texts = None if tokenizer is None else [None] * n_rows
  if key_index is not None:
    key_index = np.asarray(key_index, np.int32)
    if key_index.shape != (len(prompt_ids),):
      raise ValueError(f"key_index has shape {key_index.shape}, expected ({len(prompt_ids)},)")
  for mb in batching.plan(prompt_ids, model_cfg, config, pad_id):
    tokens, logprobs, lengths, reasons = _run_micro_batch(graphdef, params, mb, key, config, eos_ids, pad_id,
                                                          finder, device_fns or decode, key_index)
    for p in np.flatnonzero(mb.live):
      for j in range(config.n_samples):
        r, g = p * config.n_samples + j, int(mb.prompt_index[p]) * config.n_samples + j
        out_tokens[g], out_lp[g] = tokens[r, :lengths[r]].copy(), logprobs[r, :lengths[r]].copy()
        out_len[g], out_reason[g] = lengths[r], reasons[r]
        if tokenizer is not None:
          text = tokenizer.decode(out_tokens[g].tolist(), skip_special_tokens=True)
          texts[g] = finder.cut(text) if out_reason[g] == "stop" else text
        if on_finish is not None:
          on_finish(g, out_tokens[g], None if texts is None else texts[g], out_reason[g])
  rows = np.arange(n_rows)
  return GenerationResult(
      prompt_index=rows // config.n_samples, sample_index=rows % config.n_samples,
      prompt_tokens=[np.asarray(prompt_ids[i], np.int32) for i in rows // config.n_samples],
      tokens=out_tokens, logprobs=out_lp, lengths=out_len, finish_reasons=out_reason, texts=texts)


def graphdef_config(graphdef, params):
  """The ModelConfig of a split Decoder (needed for memory estimates)."""
  return model_config(graphdef, params)


def make_generate_fn(model, tokenizer, config: SamplingConfig | None = None,
                     key=0) -> Callable[[list[str]], list[str]]:
  """A `prompts -> completion texts` function for the eval harness (greedy unless config says else)."""
  config = config or SamplingConfig(temperature=0.0)
  if config.n_samples != 1:
    raise ValueError(f"make_generate_fn returns one text per prompt; n_samples={config.n_samples}")
  graphdef, params = nnx.split(model)

  def fn(prompts: list[str]) -> list[str]:
    return generate(graphdef, params, tokenizer, list(prompts), config, key).texts

  return fn
