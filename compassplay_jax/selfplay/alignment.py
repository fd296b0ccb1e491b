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

_CANDIDATE_ROWS = (4, 8, 16, 32, 64, 128, 256, 512)  # padded candidate counts: few compilations


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
                      chunk_size: int, max_len: int) -> dict[str, np.ndarray]:
  """Cosines (and raw inner products / squared norms) of each candidate's loss gradient with g_ref."""
  n = len(prompt_ids)
  if n == 0:
    empty = np.zeros((0,), np.float32)
    return {"cosines": empty, "inner_products": empty, "sq_norms": empty}
  rows = next((r for r in _CANDIDATE_ROWS if r >= n), int(np.ceil(n / 512) * 512))
  packed = pack(prompt_ids, solution_ids, pad_id, max_len=max_len)
  extra = rows - packed.tokens.shape[0]  # padding rows: no loss tokens, cosine 0, ignored
  tokens = np.pad(packed.tokens, ((0, extra), (0, 0)), constant_values=pad_id)
  loss_mask = np.pad(packed.loss_mask, ((0, extra), (0, 0)))
  attention = np.pad(packed.attention_mask, ((0, extra), (0, 0)))
  result = gradient_cosines_jit(graphdef, params, g_ref, tokens, loss_mask, attention, method=method,
                                chunk_size=chunk_size)
  return {"cosines": np.asarray(result.cosines)[:n], "inner_products": np.asarray(result.inner_products)[:n],
          "sq_norms": np.asarray(result.sq_norms)[:n]}
