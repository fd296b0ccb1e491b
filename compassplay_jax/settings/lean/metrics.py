"""The Lean iteration's own metrics, from its records (no state changed). The shared ones (valid, format
and in-band rates, cos_valid_mean, ...) are selfplay/records.step_metrics' of the candidate records."""
from __future__ import annotations

from typing import Any

import numpy as np

from compassplay_jax.runtime import config_base
from compassplay_jax.infra.metrics import histogram
from compassplay_jax.settings.lean.budget import cap_counts


def iteration_metrics(config, plan, proposals, verified, scores, outcomes, weights, *, n_try: int, n_conj_long: int,
                      copies) -> dict[str, Any]:
  """outcomes: the ConjectureOutcomes with SGS's band and advantages; weights: every proof attempt's
  solver weight; copies: the conjectures trained down as copies."""
  checks = verified.record
  n_t, rates = len(plan.targets), checks.rates
  trained = [o for o in outcomes if o.sgs_band]
  return {
      "lean/seeds_supplied": plan.supplied, "lean/targets_attempted": n_t,
      "lean/conjectures": len(outcomes), "lean/conjectures_eligible": int(scores.eligible.sum()),
      "lean/cosines_computed": sum(c is not None for c in scores.cosine),
      "lean/sgs_band_rate": float(np.mean([o.sgs_band for o in outcomes])) if outcomes else 0.0,
      "reward/solver": float(np.mean(rates[:n_t])) if n_t else 0.0,
      "lean/conjecture_solve_rate": float(np.mean(rates[n_t:])) if len(rates) > n_t else 0.0,
      # The paper's rates: over the conjectures SGS's band trains this iteration.
      "copy_rate": float(np.mean([o.copy for o in trained])) if trained else 0.0,
      "rename_rate": float(np.mean([o.rename for o in trained])) if trained else 0.0,
      "lean/system_errors": checks.system_errors,  # checks the checker failed (re-queued), this host
      "lean/solver_rows": int(np.count_nonzero(weights)), "lean/proofs_try_zeroed": n_try,
      "lean/proofs_length_penalized": int(np.sum(weights < 0)), "lean/conjectures_length_penalized": n_conj_long,
      "lean/copies_trained_down": int(np.sum(copies)),
      # SGS's filters (lean.dedup_conjectures, lean.max_total_tokens): conjectures dropped before proving as
      # duplicates; sampled rows (conjectures and proofs) whose budget the prompt-plus-generation cap
      # lowered, and those it ended.
      "lean/conjectures_deduplicated": int(sum(o.duplicate for o in outcomes)),
      **_cap_metrics(config, proposals.gen, checks.prove_gen),
      **_reward_length_metrics(config, verified, scores),
      "solve_rate_histogram": histogram(rates.tolist()),
      "tokens/generated": int(sum(np.sum(g.lengths) for g in (proposals.gen, checks.prove_gen) if g is not None)),
  }


def _cap_metrics(config, *gens) -> dict[str, int]:
  capped = cut = 0
  for gen in gens:
    c, x = cap_counts(gen, config.sampling.max_new_tokens, config.lean.max_total_tokens)
    capped, cut = capped + c, cut + x
  return {"lean/generations_capped": capped, "lean/generations_cut_by_cap": cut}


def _reward_length_metrics(config, verified, scores) -> dict[str, int]:
  """Reward sequences (g(x̃) of each conjecture paid by a cosine, and the g_ref they were compared with)
  longer than the reward length lose their completion's end: counted, so it is never silent."""
  reward_max, reference_tokens = config_base.reward_sequence_len(config), verified.record.reference_tokens
  paid = [c for c, cos in zip(verified.candidates, scores.cosine) if cos is not None and c.solution is not None]
  lengths = ([len(c.solution[0]) + len(c.solution[1]) for c in paid]
             + [reference_tokens[n] for n in {c.reference for c in paid} if n in reference_tokens])
  return {"lean/reward_sequences": len(lengths), "lean/reward_truncated": int(sum(n > reward_max for n in lengths))}
