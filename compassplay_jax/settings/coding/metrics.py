"""The coding step's own metrics, per task type and overall, from the step's records (no state changed).

The shared ones (valid, format and in-band rates, cosine share, ...) are selfplay/records.step_metrics'
of the same records; these add the per-type view, the solver's side, copies and verdicts."""
from __future__ import annotations

from typing import Any

import numpy as np

from compassplay_jax.infra.metrics import histogram
from compassplay_jax.rewards import novelty
from compassplay_jax.selfplay import records as records_lib
from compassplay_jax.settings.coding import local_reference


def step_metrics(setting, plan, verified, scores, solver_rewards: dict, verdicts, tokens: int, times) -> dict[str, Any]:
  """`setting`: the CodingSelfPlay (task types, config, reward table); `verified.record`: its CodingChecks;
  verdicts: the step's verdict reason counts (verdict_stats.tally). metrics["candidates"]: the step's
  CandidateRecords."""
  types, checked = setting.task_types, verified.record
  records = records_lib.build(verified.candidates, scores, setting.scoring())
  metrics: dict[str, Any] = {"candidates": records}
  for t in types:
    metrics.update(_type_metrics(setting, plan, checked, records, t, solver_rewards[t]))
  for name in ("copy_rate", "rename_rate"):
    metrics[name] = float(np.mean([metrics[f"{t}/{name}"] for t in types]))
  metrics["reward/solver"] = float(np.mean([metrics[f"{t}/reward_solver"] for t in types]))
  if setting.local:
    metrics.update(_local_metrics(plan, checked, verified.candidates, records, scores, metrics))
  metrics["solve_rate_histogram"] = histogram([r.solve_rate for r in records if r.valid])
  # Why proposals were invalid and checks failed (the reasons validation and checking returned).
  metrics.update({f"verdicts/{k}": v for k, v in sorted(verdicts.items())})
  metrics["tokens/generated"] = tokens
  metrics["tokens_per_s"] = tokens / max(times.seconds.get("generate", 0.0), 1e-9)
  return metrics


def _type_metrics(setting, plan, checked, records, t: str, solver_rewards: list) -> dict[str, Any]:
  """One task type's rates and rewards, and its copies of the first shown reference."""
  members = [i for i, (group, _) in enumerate(checked.slots) if group == t]
  group = [records[i] for i in members]
  valid = [i for i in members if records[i].valid]
  metrics = {f"{t}/in_band_rate": records_lib.rate(group, "in_band"),
             f"{t}/valid_rate": records_lib.rate(group, "valid"),
             f"{t}/format_rate": records_lib.rate(group, "formatted"),
             f"{t}/reward_proposer": float(np.mean([r.reward for r in group])) if group else 0.0,
             f"{t}/reward_solver": float(np.mean(solver_rewards)) if solver_rewards else 0.0,
             f"{t}/solver_accuracy": (float(np.mean([r == setting.table.solver_right for r in solver_rewards]))
                                      if solver_rewards else 0.0)}
  cosines = [records[i].cosine for i in valid if records[i].cosine is not None]
  if cosines:
    metrics[f"{t}/cos_valid_mean"] = float(np.mean(cosines))
    band = [records[i].cosine for i in valid if records[i].in_band and records[i].cosine is not None]
    if band:
      metrics[f"{t}/cos_eligible_mean"] = float(np.mean(band))
  shown = [plan.references[t][checked.slots[i][1]] for i in valid]
  novelty_stats = novelty.batch_novelty_metrics([checked.program_texts[i] for i in valid],
                                                [refs[0] if refs else "" for refs in shown], "python")
  metrics[f"{t}/copy_rate"] = novelty_stats["copy_rate"]
  metrics[f"{t}/rename_rate"] = novelty_stats["rename_rate"]
  return metrics


def _local_metrics(plan, checked, candidates, records, scores, metrics) -> dict[str, Any]:
  """With the local reference: copy rates as Lean's (in band, against the seed; the report reads
  copy_rate), the valid candidates' rates kept beside them, and the g_ref path's counts."""
  out = {"copy_rate_valid": metrics["copy_rate"], "rename_rate_valid": metrics["rename_rate"]}
  seeds = [plan.seeds[t][j] for t, j in checked.slots]
  out.update(local_reference.copy_metrics([r.in_band for r in records], checked.program_texts, seeds))
  out["local/seed_references"] = len({c.reference for c, cos in zip(candidates, scores.cosine) if cos is not None})
  out["local/cosines_computed"] = sum(cos is not None for cos in scores.cosine)
  return out
