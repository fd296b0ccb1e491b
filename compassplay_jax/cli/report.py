"""The report command: the paper's figures and tables from a sweep root or run directories.

  python -m compassplay_jax.cli.report runs/sweep1 [--baseline=difficulty] [--out=DIR]
  python -m compassplay_jax.cli.report runs/a runs/b runs/c --copy-at=100 --window=150:200

Writes, per setting (coding, lean) under DIR (default <first path>/report):
  <setting>/<figure>.png + .json (the plotted numbers) and <setting>/<table>.md + .json for everything the
  runs' metrics support (the paper's two accuracy tables: accuracy_in_domain, accuracy_out_of_domain),
  and report.md: what was written, and for the rest "not supported by these runs: <why>".
Runs are grouped into arms by reward name (a sweep's grid values too) and seeds; docs/experiments.md.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from compassplay_jax.reports import figures, paper_columns, runs as runs_lib, tables


def _window(text: str):
  try:
    start, end = (float(x) for x in text.split(":"))
  except ValueError:
    raise argparse.ArgumentTypeError(f"--window: want START:END iterations, got {text!r}") from None
  return start, end


def write_report(paths, out, baseline="difficulty", copy_at=None, window=None, log=print) -> list[str]:
  """Writes every supported figure and table; returns the lines of report.md."""
  runs, notes = runs_lib.find_runs(paths)
  if not runs:
    raise runs_lib.ReportError(f"no run with metrics under {', '.join(map(str, paths))}")
  out = pathlib.Path(out)
  lines = ["# Report", "", f"Runs: {len(runs)} from {', '.join(map(str, paths))}; baseline: {baseline}", ""]
  lines += [f"- {note}" for note in notes]
  accuracy_names = [t.name for t in paper_columns.PAPER_TABLES] + [tables.OTHER_ACCURACY]
  builders = {name: (lambda arms, name=name: tables.accuracy_table(arms, name, baseline)) for name in accuracy_names}
  builders.update({"ablation": lambda arms: tables.ablation_table(arms, baseline, copy_at, window),
                   "iterations_to_reach": lambda arms: tables.reach_table(arms, baseline),
                   "cost": tables.cost_table,
                   "copy_cosines": lambda arms: tables.copy_cosine_table(arms, window)})
  for setting, arms in runs_lib.group_by_arm(runs).items():
    arms = dict(sorted(arms.items(), key=lambda item: item[0] != baseline))  # the baseline's row first
    lines += ["", f"## {setting}", "",
              "Arms: " + "; ".join(f"{arm} (seeds {', '.join(str(r.seed) for r in rs)})" for arm, rs in arms.items()),
              ""]
    lines += [f"- warning: {note}" for arm_runs in arms.values() for note in runs_lib.duplicate_seeds(arm_runs)]
    for name, figure in figures.FIGURES.items():
      log(f"[report] {setting}: figure {name}")
      try:
        path = figure(arms, out / setting / f"{name}.png")
        lines.append(f"- figure `{name}`: [{setting}/{path.name}]({setting}/{path.name})")
      except tables.Unsupported as e:
        lines.append(f"- figure `{name}`: not supported by these runs: {e}")
    for name, build in builders.items():
      log(f"[report] {setting}: table {name}")
      try:
        table = build(arms)
      except tables.Unsupported as e:
        lines.append(f"- table `{name}`: not supported by these runs: {e}")
        continue
      (out / setting).mkdir(parents=True, exist_ok=True)
      (out / setting / f"{name}.md").write_text(tables.to_markdown(table))
      (out / setting / f"{name}.json").write_text(tables.to_json(table))
      lines.append(f"- table `{name}`: [{setting}/{name}.md]({setting}/{name}.md), {setting}/{name}.json")
  out.mkdir(parents=True, exist_ok=True)
  (out / "report.md").write_text("\n".join(lines) + "\n")
  return lines


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m compassplay_jax.cli.report", description=__doc__.split("\n")[0])
  parser.add_argument("paths", nargs="+", help="a sweep root, run directories, or folders holding them")
  parser.add_argument("--baseline", default="difficulty", help="the arm gain rows are measured against")
  parser.add_argument("--out", default=None, help="output folder (default: <first path>/report)")
  parser.add_argument("--copy-at", type=int, default=None,
                      help="iteration of the ablation table's copy rate (default: the last all runs reached)")
  parser.add_argument("--window", type=_window, default=None,
                      help="START:END iterations averaged for solved problems (default: the final quarter)")
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out) if args.out else pathlib.Path(args.paths[0]) / "report"
  try:
    lines = write_report(args.paths, out, args.baseline, args.copy_at, args.window)
  except runs_lib.ReportError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("\n".join(lines))
  print(f"[report] written to {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
