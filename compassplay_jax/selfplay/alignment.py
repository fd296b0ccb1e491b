"""The proposer's gradient-alignment signal: g_ref at the current params and per-candidate cosines.

A candidate x̃ is scored through the solver's loss on one verified solution of it: the sequence
(solver prompt of x̃, verified solver completion), loss on the completion tokens only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from compassplay_jax.rewards.cosines import gradient_cosines_jit
from compassplay_jax.rewards.reference import reference_gradient_jit
from compassplay_jax.selfplay.sequences import PackedBatch, pack

_CANDIDATE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # padded candidate counts: few compilations


def pack_reference(tokenizer, prompts: Sequence[str], solutions: Sequence[str], max_len: int) -> PackedBatch:
  """Reference sequences: prompt text + gold solution text (loss on the solution tokens)."""
  from compassplay_jax.sampling.prompts import encode_prompts
  prompt_ids = encode_prompts(tokenizer, list(prompts))
  solution_ids = [tokenizer.encode(s, add_special_tokens=False) + [tokenizer.eos_token_id] for s in solutions]
  return pack(prompt_ids, solution_ids, tokenizer.pad_token_id, max_len=max_len)


def reference_gradient(graphdef, params, reference: PackedBatch, micro_batch: int):
  return reference_gradient_jit(graphdef, params, reference.tokens, reference.loss_mask,
                                reference.attention_mask, micro_batch=min(micro_batch, reference.tokens.shape[0]))


def candidate_cosines(graphdef, params, g_ref, prompt_ids, solution_ids, pad_id: int, *, method: str,
                      chunk_size: int, max_len: int, micro_batch: int = 8) -> dict[str, np.ndarray]:
  """Cosines (and raw inner products / squared norms) of each candidate's loss gradient with g_ref.

  Candidates go through the fused (or direct) pass `micro_batch` at a time: its activation memory
  grows with candidates x length^2 (attention), so the caller bounds it here.
  """
  n = len(prompt_ids)
  out = {"cosines": [], "inner_products": [], "sq_norms": []}
  packed = pack(prompt_ids, solution_ids, pad_id, max_len=max_len)
  rows = next((r for r in _CANDIDATE_ROWS if r >= min(n, micro_batch)), micro_batch)  # few compiled shapes
  for start in range(0, n, rows):
    end = min(start + rows, n)
    extra = rows - (end - start)  # padding rows: no loss tokens, cosine 0, dropped below
    arrays = [np.pad(a[start:end], ((0, extra), (0, 0)), constant_values=c)
              for a, c in ((packed.tokens, pad_id), (packed.loss_mask, 0), (packed.attention_mask, 0))]
    result = gradient_cosines_jit(graphdef, params, g_ref, *arrays, method=method, chunk_size=chunk_size)
    for key in out:
      out[key].append(np.asarray(getattr(result, key))[:end - start])
  return {k: np.concatenate(v) if v else np.zeros((0,), np.float32) for k, v in out.items()}
