"""The sweep command: a grid of reward names × seeds (× config values) of one config, one work directory per cell.

  python -m compassplay_jax.cli.sweep --config=configs/coding.py:tiny --rewards=compassplay_cos,difficulty \\
      --seeds=0,1 --root=runs/sweep1 [--set train.learning_rate=1e-5 ...] [--grid train.learning_rate=1e-5,1e-6]
  ... --print-commands     # one `python -m compassplay_jax.main ...` line per unfinished cell, for a scheduler

Each cell is an ordinary work directory of the main command (<root>/<arm>/seed_<n>): run locally one after
another, a cell resumes from its last checkpoint, and a cell whose last checkpoint reached `steps` is
skipped. <root>/sweep.json lists the cells and their arms for `python -m compassplay_jax.cli.report <root>`.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import pathlib
import shlex
import subprocess
import sys
import time

from compassplay_jax.rewards.proposer_rewards import REWARD_FNS

SWEEP_FILE = "sweep.json"
RESERVED = {"reward.name": "--rewards", "seed": "--seeds"}


class SweepError(ValueError):
  """Bad sweep input: printed as one line."""


@dataclasses.dataclass
class Cell:
  arm: str  # reward name, plus the cell's grid values
  reward: str
  seed: int
  overrides: dict[str, str]  # --set and grid values, dotted config key -> command-line text
  dir: str  # relative to the root

  def command(self, config_spec: str, root: pathlib.Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "compassplay_jax.main", f"--config={config_spec}", f"--workdir={root / self.dir}",
            f"--config.reward.name={self.reward}", f"--config.seed={self.seed}",
            *[f"--config.{key}={value}" for key, value in self.overrides.items()]]


def load_config(spec: str):
  """The ConfigDict of 'path/to/config.py[:variant]' (as the main command builds it)."""
  path, _, variant = spec.partition(":")
  if not pathlib.Path(path).is_file():
    raise SweepError(f"--config: no such file {path!r}")
  module_spec = importlib.util.spec_from_file_location(f"_sweep_config_{pathlib.Path(path).stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant)


def _parse_value(key: str, text: str, current, flag: str = "--set"):
  """Checks that `text` parses as the type of the field it overrides (the main command parses it again)."""
  try:
    if isinstance(current, bool):
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
  except ValueError:
    raise SweepError(f"{flag} {key}={text}: not a {type(current).__name__}") from None
  return text


def apply_override(config, key: str, text: str, flag: str = "--set") -> None:
  """Sets config.<key> from its command-line text; an unknown key or a value of the wrong type is a SweepError."""
  if key in RESERVED:
    raise SweepError(f"{flag} {key}: use {RESERVED[key]} for it (it is a sweep axis)")
  node = config
  parts = key.split(".")
  for depth, part in enumerate(parts):
    if not hasattr(node, "keys") or part not in node.keys():
      where = "config" + "".join(f".{p}" for p in parts[:depth])
      raise SweepError(f"{flag} {key}: unknown config key ({where} has no field {part!r})")
    if depth < len(parts) - 1:
      node = node[part]
  leaf = parts[-1]
  value = _parse_value(key, text, node[leaf], flag)
  node[leaf] = value  # an existing field: allowed on a locked ConfigDict, type-checked by it


def _split_assignment(flag: str, text: str) -> tuple[str, str]:
  key, sep, value = text.partition("=")
  if not sep or not key.strip():
    raise SweepError(f"{flag} {text!r}: want KEY=VALUE (a dotted config key, e.g. train.learning_rate=1e-5)")
  return key.strip(), value


def make_cells(rewards, seeds, sets: dict[str, str], grid: dict[str, list[str]]) -> list[Cell]:
  """The grid in a fixed order: reward, then grid values, then seed."""
  cells = []
  grid_keys = list(grid)
  for reward in rewards:
    for combo in itertools.product(*[grid[k] for k in grid_keys]):
      values = dict(zip(grid_keys, combo))
      arm = ",".join([reward] + [f"{k}={v}" for k, v in values.items()])
      arm_dir = arm.replace(",", "__").replace("/", "_")
      for seed in seeds:
        cells.append(Cell(arm, reward, seed, {**sets, **values}, f"{arm_dir}/seed_{seed}"))
  return cells


def last_checkpoint(workdir: pathlib.Path) -> int | None:
  """The newest committed checkpoint step of a work directory (Orbax renames a step's folder into place
  only when it is complete; temporary folders have non-numeric names)."""
  ckpt = workdir / "checkpoints"
  steps = [int(p.name) for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()] if ckpt.is_dir() else []
  return max(steps, default=None)


def cell_steps(config_spec: str, cell: Cell) -> int:
  config = load_config(config_spec)
  for key, value in cell.overrides.items():
    apply_override(config, key, value)
  return int(config.steps)


def write_sweep_file(root: pathlib.Path, config_spec: str, cells: list[Cell]) -> None:
  """<root>/sweep.json: the union of the cells of every sweep command run on this root."""
  path = root / SWEEP_FILE
  known = json.loads(path.read_text())["cells"] if path.is_file() else []
  merged = {c["dir"]: c for c in known}
  merged.update({c.dir: {**dataclasses.asdict(c), "config": config_spec} for c in cells})
  root.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"cells": list(merged.values())}, indent=2) + "\n")


def run_cell(command: list[str], log_path: pathlib.Path) -> int:
  """Runs one cell's main command, its output both shown and appended to <cell>/sweep.log."""
  log_path.parent.mkdir(parents=True, exist_ok=True)
  with open(log_path, "a", encoding="utf-8") as log:
    log.write(f"$ {shlex.join(command)}\n")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
      for line in proc.stdout:
        sys.stdout.write("  " + line)
        log.write(line)
      return proc.wait()
    except BaseException:
      proc.terminate()  # an interrupted sweep leaves no orphan run behind
      proc.wait()
      raise


def parse_args(argv):
  parser = argparse.ArgumentParser(prog="python -m compassplay_jax.cli.sweep", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="configs/<setting>.py[:variant]")
  parser.add_argument("--rewards", required=True, help=f"comma list of reward names ({', '.join(sorted(REWARD_FNS))})")
  parser.add_argument("--seeds", default="0", help="comma list of integer seeds")
  parser.add_argument("--root", required=True, help="the sweep's root folder; cells are <root>/<arm>/seed_<n>")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config value for every cell (repeatable)")
  parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                      help="a config key swept over comma-separated values (repeatable; one more grid axis each)")
  parser.add_argument("--print-commands", action="store_true",
                      help="print one main command per unfinished cell (for a cluster scheduler) instead of running")
  parser.add_argument("--python", default=None, help="interpreter in printed commands (default: this one)")
  return parser.parse_args(argv)


def plan(args):
  """(config spec with an absolute path, root, cells, steps per cell) from the arguments, all checked."""
  path, sep, variant = args.config.partition(":")
  config_spec = str(pathlib.Path(path).resolve()) + (sep + variant if sep else "")
  config = load_config(config_spec)
  rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
  unknown = [r for r in rewards if r not in REWARD_FNS]
  if not rewards or unknown:
    raise SweepError(f"--rewards: unknown reward {', '.join(map(repr, unknown)) or '(none given)'} "
                     f"(known: {', '.join(sorted(REWARD_FNS))})")
  try:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
  except ValueError:
    raise SweepError(f"--seeds {args.seeds!r}: want a comma list of integers") from None
  sets = dict(_split_assignment("--set", s) for s in args.set)
  grid = {k: [v for v in values.split(",") if v] for k, values in (_split_assignment("--grid", g) for g in args.grid)}
  for key, value in sets.items():
    apply_override(config, key, value)
  for key, values in grid.items():
    if not values:
      raise SweepError(f"--grid {key}=: no values")
    for value in values:
      apply_override(load_config(config_spec), key, value, "--grid")
  cells = make_cells(rewards, seeds, sets, grid)
  steps = {c.dir: cell_steps(config_spec, c) for c in cells} if grid else {c.dir: int(config.steps) for c in cells}
  return config_spec, pathlib.Path(args.root).resolve(), cells, steps


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    config_spec, root, cells, steps = plan(args)
  except SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  write_sweep_file(root, config_spec, cells)
  todo = [c for c in cells if (last_checkpoint(root / c.dir) or 0) < steps[c.dir]]
  if args.print_commands:
    for cell in todo:
      print(shlex.join(cell.command(config_spec, root, args.python or sys.executable)))
    print(f"[sweep] {len(todo)} of {len(cells)} cells unfinished; {root / SWEEP_FILE} lists them all",
          file=sys.stderr)
    return 0
  failed = []
  for i, cell in enumerate(cells, 1):
    done = last_checkpoint(root / cell.dir) or 0
    label = f"[sweep] cell {i}/{len(cells)} {cell.dir}"
    if done >= steps[cell.dir]:
      print(f"{label}: complete at step {done}, skipped", flush=True)
      continue
    print(f"{label}: {'resuming from step ' + str(done) if done else 'starting'} ({steps[cell.dir]} steps)", flush=True)
    t0 = time.time()
    try:
      code = run_cell(cell.command(config_spec, root), root / cell.dir / "sweep.log")
    except KeyboardInterrupt:
      print(f"\n[sweep] interrupted in {cell.dir}; rerun the same command to resume", file=sys.stderr)
      return 130
    status = "done" if code == 0 else f"FAILED (exit {code}; log {root / cell.dir / 'sweep.log'})"
    print(f"{label}: {status} in {time.time() - t0:.0f} s", flush=True)
    if code:
      failed.append(cell.dir)
  if failed:
    print(f"error: {len(failed)} of {len(cells)} cells failed: {', '.join(failed)}", file=sys.stderr)
    return 1
  print(f"[sweep] all {len(cells)} cells complete under {root}; report: python -m compassplay_jax.cli.report {root}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
