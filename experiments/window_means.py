"""Mean of chosen metrics over step windows, one row per run (for docs tables next to the report's).

  python experiments/window_means.py runs/local_ref --keys copy_rate,exact_copy_rate,in_band_rate \
      --windows 1:10,11:20,21:25
Prints a markdown table: run, window, then each key's mean over the steps in the window that logged it.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

from compassplay_jax.infra.metrics import read_metrics


def window_mean(records, key: str, start: int, end: int) -> float:
  values = [r[key] for r in records if start <= r["step"] <= end and isinstance(r.get(key), (int, float))]
  return sum(values) / len(values) if values else math.nan


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("root", help="a folder holding run directories (each with metrics.jsonl)")
  parser.add_argument("--keys", required=True, help="comma list of metric names")
  parser.add_argument("--windows", required=True, help="comma list of START:END step windows (inclusive)")
  args = parser.parse_args(argv)
  keys = args.keys.split(",")
  windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
  runs = sorted(p.parent for p in pathlib.Path(args.root).rglob("metrics.jsonl"))
  if not runs:
    print(f"window_means: no metrics.jsonl under {args.root}", file=sys.stderr)
    return 2
  print("| run | steps | " + " | ".join(keys) + " |")
  print("|---|---|" + "---:|" * len(keys))
  for run in runs:
    records = read_metrics(run)
    for start, end in windows:
      cells = [f"{window_mean(records, k, start, end):.3f}" for k in keys]
      print(f"| {run.relative_to(args.root)} | {start}–{end} | " + " | ".join(cells) + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
