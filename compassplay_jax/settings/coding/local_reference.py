"""The coding setting's local reference (config.reward.reference = "local"; docs/coding_tasks.md).

The Lean loop compares a conjecture's gradient with g_ref = the gradient of the solver's verified
proof of the seed it was conditioned on (settings/lean). This is the same reference for coding:

  seed     the FIRST reference program shown to the proposer (configs/coding.py:local_demo shows
           exactly one, num_references = 1, so the proposer is conditioned on one seed as Lean's
           conjecturer is); for induction, the buffer task whose program is shown.
  g_ref    the gradient of the solver's loss on the seed task's verified solution: the solver prompt
           of the seed task (the one its own solve-rate samples get) and, as completion, the seed's
           gold answer written as the solver's response (CodingSelfPlay.gold_completion, the same
           text the loop uses for g(x̃) when no sample is right). The buffer entry's answer was
           verified by running its program in the sandbox when it joined the buffer, and for
           deduction the verified answer is unique, so this is the solver's verified solution
           without sampling it again (a 135M solver is rarely right: sampling would leave most seeds
           without a reference).

Candidates conditioned on the same seed share its key, so selfplay/step.score computes each
distinct seed's g_ref once per step (engine.reference_gradient) and every candidate's cosine
against its own seed's g_ref: the Lean code path (one g_ref per reference key), not a copy of it.
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from compassplay_jax.rewards import novelty

EXTERNAL = "external"  # g_ref from the reference set (config.reward.reference_path), one for all candidates
LOCAL = "local"        # g_ref per seed: the solver's verified solution of the seed task
REFERENCES = (EXTERNAL, LOCAL)


def seed_key(task) -> str:
  """The reference key of a seed task: candidates conditioned on the same task share one g_ref."""
  return json.dumps([task.type, task.program, task.input, task.output])


def needed(candidates) -> set:
  """Reference keys some valid candidate is compared with (step.score scores valid candidates only)."""
  return {c.reference for c in candidates if c.reference is not None and c.valid}


def seed_references(setting, seeds: dict, candidates, max_len: int) -> dict:
  """{seed key: PackedBatch of (the seed's solver prompt, its verified solution)} for the seeds that
  candidates need. `setting`: a CodingSelfPlay (its solver prompts and gold completions)."""
  from compassplay_jax.sampling.prompts import encode_prompts
  from compassplay_jax.selfplay.sequences import pack
  keys = sorted(needed(candidates))
  if not keys:
    return {}
  tasks = [seeds[k] for k in keys]
  prompt_ids = encode_prompts(setting.tokenizer, setting.solver_prompts(tasks))
  return {k: pack([p], [setting.gold_completion(t)], setting.tokenizer.pad_token_id, max_len=max_len)
          for k, p, t in zip(keys, prompt_ids, tasks)}


def copy_metrics(in_band: Sequence[bool], programs: Sequence[str], seeds: Sequence, language: str = "python") -> dict:
  """Lean's copy metrics (settings/lean) over the in-band candidates (records.CandidateRecord.in_band)
  that have a seed: copy_rate (token-Jaccard to the seed > novelty.COPY_THRESHOLD), rename_rate
  (canonically equal, not identical), exact_copy_rate (the same token sequence). Same names as Lean's,
  so the report's copy-rate figure and table read coding runs too."""
  pairs = [(p, s.program) for band, p, s in zip(in_band, programs, seeds) if s is not None and band]
  stats = novelty.batch_novelty_metrics([p for p, _ in pairs], [s for _, s in pairs], language)
  exact = [novelty.is_identical(p, s, language) for p, s in pairs]
  return {"copy_rate": stats["copy_rate"], "rename_rate": stats["rename_rate"],
          "exact_copy_rate": float(np.mean(exact)) if exact else 0.0, "local/in_band_with_seed": len(pairs)}
