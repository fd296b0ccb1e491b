"""The coding step's metrics: per task type and overall, from the step's records (no state changed)."""
from __future__ import annotations

from typing import Any

import numpy as np

from compassplay_jax.metrics import histogram
from compassplay_jax.rewards import novelty
from compassplay_jax.rewards.proposer_rewards import in_band, uses_cosine
from compassplay_jax.selfplay import local_reference, summary


def step_metrics(setting, plan, verified, scores, solver_rewards: dict, verdicts, tokens: int, times) -> dict[str, Any]:
  """`setting`: the CodingSelfPlay (task types, config, reward table); `verified.record`: its CodingChecks;
  verdicts: the step's verdict reason counts (verdict_stats.tally)."""
  types, cfg = setting.task_types, setting.config
  candidates, checked = verified.candidates, verified.record
  scored = setting.reference is not None or (setting.local and uses_cosine(cfg.reward.name))
  metrics: dict[str, Any] = {}
  records = []
  for t in types:
    members = [i for i, (group, _) in enumerate(checked.slots) if group == t]
    group = [candidates[i] for i in members]
    n = len(group)
    valid = [i for i in members if candidates[i].valid]
    band = [i for i in valid if in_band(candidates[i].solve_rate)]
    if scored and valid:
      metrics[f"{t}/cos_valid_mean"] = float(np.mean([scores.cosine[i] or 0.0 for i in valid]))
      if band:
        metrics[f"{t}/cos_eligible_mean"] = float(np.mean([scores.cosine[i] or 0.0 for i in band]))
    for i in members:
      cand, eligible = candidates[i], bool(scores.eligible[i])
      records.append({
          "type": t, "solve_rate": cand.solve_rate, "cosine": scores.cosine[i] if scored and cand.valid else None,
          "reward": float(scores.reward[i]), "valid": cand.valid, "in_band": eligible,
          "jaccard": float(cand.jaccard),  # to the seed / nearest shown reference (copies: > 0.8)
          "paid_by": (("cosine" if uses_cosine(cfg.reward.name) else cfg.reward.name)
                      if eligible and cand.formatted else "gate")})
    metrics[f"{t}/in_band_rate"] = len(band) / max(n, 1)
    metrics[f"{t}/valid_rate"] = len(valid) / max(n, 1)
    metrics[f"{t}/format_rate"] = float(np.mean([cand.formatted for cand in group])) if group else 0.0
    metrics[f"{t}/reward_proposer"] = float(np.mean(scores.reward[members])) if n else 0.0
    rewards = solver_rewards[t]
    metrics[f"{t}/reward_solver"] = float(np.mean(rewards)) if rewards else 0.0
    metrics[f"{t}/solver_accuracy"] = (float(np.mean([r == setting.table.solver_right for r in rewards]))
                                       if rewards else 0.0)
    novelty_stats = novelty.batch_novelty_metrics(
        [checked.program_texts[i] for i in valid],
        [plan.references[t][checked.slots[i][1]][0] if plan.references[t][checked.slots[i][1]] else ""
         for i in valid], "python")
    metrics[f"{t}/copy_rate"] = novelty_stats["copy_rate"]
    metrics[f"{t}/rename_rate"] = novelty_stats["rename_rate"]
  for name in ("valid_rate", "in_band_rate", "copy_rate", "rename_rate"):
    metrics[name] = float(np.mean([metrics[f"{t}/{name}"] for t in types]))
  metrics["reward/proposer"] = float(np.mean([metrics[f"{t}/reward_proposer"] for t in types]))
  metrics["reward/solver"] = float(np.mean([metrics[f"{t}/reward_solver"] for t in types]))
  cos_means = [metrics[f"{t}/cos_valid_mean"] for t in types if f"{t}/cos_valid_mean" in metrics]
  if cos_means:
    metrics["cos_valid_mean"] = float(np.mean(cos_means))
  if setting.local:  # copy rates as Lean's (in-band vs the seed; the report reads copy_rate) + the g_ref path
    metrics["copy_rate_valid"], metrics["rename_rate_valid"] = metrics["copy_rate"], metrics["rename_rate"]
    seeds = [plan.seeds[t][j] for t, j in checked.slots]
    metrics.update(local_reference.copy_metrics(candidates, checked.program_texts, seeds))
    metrics["local/seed_references"] = len({c.reference for c, cos in zip(candidates, scores.cosine) if cos is not None})
    metrics["local/cosines_computed"] = sum(cos is not None for cos in scores.cosine)
  metrics["solve_rate_histogram"] = histogram([cand.solve_rate for cand in candidates if cand.valid])
  metrics["candidates"] = records
  metrics["in_band_count"] = sum(r["in_band"] for r in records)
  metrics["cos_paid_count"] = sum(r["paid_by"] == "cosine" for r in records)
  metrics["cos_share"] = summary.cosine_share(records)
  # Why proposals were invalid and checks failed (the reasons validation and checking returned).
  metrics.update({f"verdicts/{k}": v for k, v in sorted(verdicts.items())})
  metrics["tokens/generated"] = tokens
  metrics["tokens_per_s"] = tokens / max(times.seconds.get("generate", 0.0), 1e-9)
  return metrics
