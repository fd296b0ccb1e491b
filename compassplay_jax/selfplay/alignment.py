"""The proposer's gradient-alignment signal: g_ref at the current params and per-candidate cosines.

A candidate x̃ is scored through the solver's loss on one verified solution of it: the sequence
(solver prompt of x̃, verified solver completion), loss on the completion tokens only. The device
work runs through the engine (engine.py): g_ref keeps the params' sharding, candidates' rows are
split over (data, fsdp).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from compassplay_jax.infra import distributed
from compassplay_jax.selfplay.sequences import LENGTH_BUCKETS, PackedBatch, pack, packed_shape

_CANDIDATE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # padded candidate counts: few compilations


def pack_reference(tokenizer, prompts: Sequence[str], solutions: Sequence[str], max_len: int) -> PackedBatch:
  """Reference sequences: prompt text + gold solution text (loss on the solution tokens)."""
  from compassplay_jax.sampling.prompts import encode_prompts
  prompt_ids = encode_prompts(tokenizer, list(prompts))
  solution_ids = [tokenizer.encode(s, add_special_tokens=False) + [tokenizer.eos_token_id] for s in solutions]
  return pack(prompt_ids, solution_ids, tokenizer.pad_token_id, max_len=max_len)


def _rows(engine, packed: PackedBatch, pad_id: int, start: int, end: int, rows: int):
  """Rows [start, end) padded to `rows` (padding rows: no loss tokens, so they add nothing), placed."""
  extra = rows - (end - start)
  arrays = {name: np.pad(getattr(packed, name)[start:end], ((0, extra), (0, 0)), constant_values=value)
            for name, value in (("tokens", pad_id), ("loss_mask", 0), ("attention_mask", 0))}
  return engine.put_batch(arrays)


def _reference_rows(engine, reference: PackedBatch) -> int:
  n = reference.tokens.shape[0]
  return -(-n // engine.batch_divisor) * engine.batch_divisor


def reference_gradient(engine, params, reference: PackedBatch, pad_id: int = 0):
  """g_ref at `params` over the reference set (a mean over its sequences), sharded like the params."""
  b = _rows(engine, reference, pad_id, 0, reference.tokens.shape[0], _reference_rows(engine, reference))
  return engine.reference_gradient(params, b["tokens"], b["loss_mask"], b["attention_mask"])


def reference_gradient_ahead(engine, params, reference: PackedBatch) -> None:
  """Compiles reference_gradient's program for this reference set in the background (engine.ahead)."""
  engine.reference_gradient_ahead(params, _reference_rows(engine, reference), reference.tokens.shape[1])


def _cosine_passes(engine, prompt_ids, solution_ids, *, max_len: int, fixed_rows: bool, buckets):
  """(this process's rows per pass, processes' shares, column shape) of candidate_cosines' passes."""
  n = len(prompt_ids)
  micro_batch = engine.settings.reward_micro_batch  # a multiple of data*fsdp (EngineSettings.fitted)
  # Padded candidate counts (padding rows score 0 and are dropped): with fixed_rows always
  # `micro_batch`, so each length bucket is one compiled shape; else a power of two up to it.
  rows = micro_batch if fixed_rows else next((r for r in _CANDIDATE_ROWS if r >= min(n, micro_batch)), micro_batch)
  shares = distributed.Shares.of(n)
  per_call = engine.local_rows(-(-rows // shares.count))  # this process's rows of every pass
  shape = packed_shape([(len(p), len(c)) for p, c in zip(prompt_ids, solution_ids)], max_len=max_len,
                       buckets=buckets)
  return per_call, shares, shape


def candidate_cosines_ahead(engine, params, prompt_ids, solution_ids, *, max_len: int, fixed_rows: bool = False,
                            buckets: Sequence[int] = LENGTH_BUCKETS) -> None:
  """Compiles the pass candidate_cosines would run for these candidates in the background
  (engine.ahead): called where the candidates' shapes are known (or well guessed) early."""
  if len(prompt_ids):
    per_call, shares, shape = _cosine_passes(engine, prompt_ids, solution_ids, max_len=max_len,
                                             fixed_rows=fixed_rows, buckets=buckets)
    engine.cosines_ahead(params, per_call * shares.count, shape[0])


def candidate_cosines(engine, params, g_ref, prompt_ids, solution_ids, pad_id: int, *, max_len: int,
                      fixed_rows: bool = False, buckets: Sequence[int] = LENGTH_BUCKETS) -> dict[str, np.ndarray]:
  """Cosines (and raw inner products / squared norms) of each candidate's loss gradient with g_ref.

  Candidates go through the fused (or direct) pass engine.settings.reward_micro_batch at a time: its
  activation memory grows with candidates x length^2 (attention), so it is bounded here. fixed_rows
  and coarse `buckets` (sequences.TRAIN_BUCKETS) trade a few padding rows for fewer compilations.
  Across processes each one places only its share of the candidates (distributed.Shares) as its
  rows of every pass, all at the length bucket of the longest candidate, and reads the results of all.
  """
  n = len(prompt_ids)
  out = {"cosines": np.zeros((n,), np.float32), "inner_products": np.zeros((n,), np.float32),
         "sq_norms": np.zeros((n,), np.float32)}
  if n == 0:
    return out
  per_call, shares, shape = _cosine_passes(engine, prompt_ids, solution_ids, max_len=max_len,
                                           fixed_rows=fixed_rows, buckets=buckets)
  mine = list(shares.mine)
  packed = pack([prompt_ids[i] for i in mine], [solution_ids[i] for i in mine], pad_id, max_len=max_len,
                buckets=buckets, shape=shape)
  for start in range(0, max(shares.size, 1), per_call):
    end = min(start + per_call, len(mine))
    b = _local_rows(engine, packed, pad_id, min(start, end), end, per_call)
    result = engine.cosines(params, g_ref, b["tokens"], b["loss_mask"], b["attention_mask"])
    values = {key: distributed.to_host(getattr(result, key)) for key in out}
    for process in range(shares.count):  # each process's candidates of this pass, at its rows
      first, last = shares.bounds(process)
      members = range(first + start, min(first + start + per_call, last))
      rows_of = engine.process_rows(per_call * shares.count, process)[:len(members)]
      for key in out:
        out[key][list(members)] = values[key][rows_of]
  return out


def _local_rows(engine, packed: PackedBatch, pad_id: int, start: int, end: int, rows: int):
  """This process's rows [start, end) of `packed`, padded to `rows` (no loss tokens), as its rows of
  global arrays."""
  arrays = {name: np.pad(getattr(packed, name)[start:end], ((0, rows - (end - start)), (0, 0)),
                         constant_values=value)
            for name, value in (("tokens", pad_id), ("loss_mask", 0), ("attention_mask", 0))}
  return engine.put_local_rows(arrays, rows)
