"""The proposer's gradient-alignment signal: g_ref at the current params and per-candidate cosines.

A candidate x̃ is scored through the solver's loss on one verified solution of it: the sequence
(solver prompt of x̃, verified solver completion), loss on the completion tokens only. The device
work runs through the engine (engine.py): g_ref keeps the params' sharding, candidates' rows are
split over (data, fsdp).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from compassplay_jax import distributed
from compassplay_jax.selfplay.sequences import LENGTH_BUCKETS, PackedBatch, pack

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


def reference_gradient(engine, params, reference: PackedBatch, pad_id: int = 0):
  """g_ref at `params` over the reference set (a mean over its sequences), sharded like the params."""
  n = reference.tokens.shape[0]
  b = _rows(engine, reference, pad_id, 0, n, -(-n // engine.batch_divisor) * engine.batch_divisor)
  return engine.reference_gradient(params, b["tokens"], b["loss_mask"], b["attention_mask"])


def candidate_cosines(engine, params, g_ref, prompt_ids, solution_ids, pad_id: int, *, max_len: int,
                      fixed_rows: bool = False, buckets: Sequence[int] = LENGTH_BUCKETS) -> dict[str, np.ndarray]:
  """Cosines (and raw inner products / squared norms) of each candidate's loss gradient with g_ref.

  Candidates go through the fused (or direct) pass engine.settings.reward_micro_batch at a time: its
  activation memory grows with candidates x length^2 (attention), so it is bounded here. fixed_rows
  and coarse `buckets` (sequences.TRAIN_BUCKETS) trade a few padding rows for fewer compilations.
  """
  n = len(prompt_ids)
  micro_batch = engine.settings.reward_micro_batch  # a multiple of data*fsdp (EngineSettings.fitted)
  out = {"cosines": [], "inner_products": [], "sq_norms": []}
  packed = pack(prompt_ids, solution_ids, pad_id, max_len=max_len, buckets=buckets)
  # Padded candidate counts (padding rows score 0 and are dropped): with fixed_rows always
  # `micro_batch`, so each length bucket is one compiled shape; else a power of two up to it.
  rows = micro_batch if fixed_rows else next((r for r in _CANDIDATE_ROWS if r >= min(n, micro_batch)), micro_batch)
  rows = -(-rows // engine.batch_divisor) * engine.batch_divisor
  for start in range(0, n, rows):
    end = min(start + rows, n)
    b = _rows(engine, packed, pad_id, start, end, rows)
    result = engine.cosines(params, g_ref, b["tokens"], b["loss_mask"], b["attention_mask"])
    for key in out:
      out[key].append(distributed.to_host(getattr(result, key))[:end - start])
  return {k: np.concatenate(v) if v else np.zeros((0,), np.float32) for k, v in out.items()}
