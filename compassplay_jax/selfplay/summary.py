"""End-of-run view of the proposer's reward: the last step's candidates as a table, and a PNG.

The candidates are metrics["candidates"], one selfplay/records.CandidateRecord per proposal as JSON:
  {"type": "deduction", "solve_rate": 0.5, "cosine": 0.12 | None, "reward": 0.12, "valid": True,
   "in_band": True, "jaccard": 0.3, "paid_by": "cosine" | "gate" | "difficulty" | ..., "formatted": True,
   ...the setting's own fields}
"paid_by" says where the reward came from: the gradient cosine for in-band candidates under a
cosine reward, the gate (bad format / invalid / out of band) otherwise.
"""
from __future__ import annotations

import pathlib
from typing import Sequence

from compassplay_jax.selfplay import records as records_lib

PNG_NAME = "proposer_reward.png"


def cosine_share(candidates: Sequence[dict]) -> float:
  """records.cosine_share of metrics.jsonl's candidate records."""
  return records_lib.cosine_share([records_lib.CandidateRecord.from_json(c) for c in candidates])


def candidate_table(step: int, candidates: Sequence[dict]) -> str:
  """A small fixed-width table of one step's candidates, headed by its in-band count and cosine share."""
  records = [records_lib.CandidateRecord.from_json(c) for c in candidates]
  in_band = sum(r.in_band for r in records)
  lines = [f"  step {step}: {len(records)} candidates, {in_band} in band, "
           f"{100 * records_lib.cosine_share(records):.0f}% of proposer reward |r| paid by cosines",
           f"  {'type':<10} {'solve':>5} {'cosine':>7} {'reward':>7}  {'valid':<5} {'in-band':<7} paid by"]
  for r in records:
    cos = f"{r.cosine:+.3f}" if r.cosine is not None else "-"
    lines.append(f"  {r.type:<10} {r.solve_rate:>5.2f} {cos:>7} {r.reward:>+7.3f}  "
                 f"{'yes' if r.valid else 'no':<5} {'yes' if r.in_band else 'no':<7} {r.paid_by}")
  return "\n".join(lines)


def write_png(path: pathlib.Path, records: Sequence[dict]) -> pathlib.Path:
  """Left: cosine against solve rate of the last step's valid candidates (in band filled).
  Right: proposer reward, valid rate and in-band rate against step. `records` are metrics.jsonl lines."""
  import matplotlib
  import matplotlib.ticker
  matplotlib.use("Agg")  # files only, no display
  from matplotlib import pyplot as plt
  last = next((r for r in reversed(records) if r.get("candidates")), None)
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  if last is not None:
    scored = [c for c in last["candidates"] if c.get("cosine") is not None]
    for in_band, style in ((True, dict(color="tab:blue", label="in band (paid by cosine)")),
                           (False, dict(facecolors="none", edgecolors="tab:gray", label="out of band"))):
      pts = [c for c in scored if bool(c["in_band"]) == in_band]
      left.scatter([c["solve_rate"] for c in pts], [c["cosine"] for c in pts], **style)
    left.set_title(f"step {last['step']}: candidates")
    left.legend(loc="best", fontsize=8)
  left.set_xlabel("solve rate")
  left.set_ylabel("cosine(g(x), g_ref)")
  left.set_xlim(-0.05, 1.05)
  steps = [r["step"] for r in records]
  for key, label in (("reward/proposer", "proposer reward"), ("valid_rate", "valid rate"),
                     ("in_band_rate", "in-band rate")):
    right.plot(steps, [r.get(key, float("nan")) for r in records], marker="o", label=label)
  right.set_xlabel("step")
  right.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  right.set_title("proposer")
  right.legend(loc="best", fontsize=8)
  fig.tight_layout()
  path = pathlib.Path(path)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
