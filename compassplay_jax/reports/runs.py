"""Reading run directories for the reports: metrics.jsonl, config.json, eval/step_*/results.json, sweep.json."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from compassplay_jax.evals import report as eval_report
from compassplay_jax.evals.benchmarks import BENCHMARKS
from compassplay_jax.infra.metrics import read_metrics
from compassplay_jax.reports import paper_columns

SWEEP_FILE = "sweep.json"
BASE_STEP = 0  # the evaluation before the first step: the base model


class ReportError(ValueError):
  """Bad input to the report: printed as one line."""


@dataclasses.dataclass
class Run:
  path: pathlib.Path
  setting: str
  arm: str  # the compared condition: the reward name, plus a sweep's grid values
  seed: int
  records: list[dict]  # metrics.jsonl, one dict per step
  accuracy: dict[int, dict[str, float]]  # eval step (0: the base model) -> {benchmark or mean: accuracy in [0, 1]}

  @property
  def last_step(self) -> int:
    return max((int(r["step"]) for r in self.records), default=0)

  def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a scalar metric over the steps that logged it."""
    pairs = [(r["step"], r[key]) for r in self.records if isinstance(r.get(key), (int, float))]
    return np.asarray([p[0] for p in pairs], np.float64), np.asarray([p[1] for p in pairs], np.float64)

  def accuracy_series(self, key: str, base: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(steps, accuracies) of a benchmark or mean key; base=False leaves out the step-0 evaluation."""
    steps = sorted(s for s, accs in self.accuracy.items()
                   if accs.get(key) is not None and (base or s != BASE_STEP))
    return np.asarray(steps, np.float64), np.asarray([self.accuracy[s][key] for s in steps], np.float64)


def _accuracy_from_results(history: dict[int, dict]) -> dict[int, dict[str, float]]:
  out = {}
  for step, result in history.items():
    accs = {name: r["accuracy"] for name, r in result.get("benchmarks", {}).items() if r.get("total")}
    out[step] = {**accs, **paper_columns.step_means(accs)}
  return out


def _accuracy_from_metrics(records: list[dict]) -> dict[int, dict[str, float]]:
  """eval/<benchmark> keys of metrics.jsonl (steps without an eval/step_<n>/results.json), with the means."""
  known = set(BENCHMARKS) | paper_columns.PAPER_BENCHMARKS
  out = {}
  for record in records:
    accs = {k[len("eval/"):]: float(v) for k, v in record.items()
            if k.startswith("eval/") and k[len("eval/"):] in known
            and isinstance(v, (int, float)) and not math.isnan(v)}
    if accs:
      out[int(record["step"])] = {**accs, **paper_columns.step_means(accs)}
  return out


def load_run(path, arm: str | None = None) -> Run:
  path = pathlib.Path(path)
  if not (path / "metrics.jsonl").is_file():
    raise ReportError(f"{path}: no metrics.jsonl (not a run directory, or the run has not logged a step)")
  config_path = path / "config.json"
  if not config_path.is_file():
    raise ReportError(f"{path}: no config.json (run directories are written by compassplay_jax.main)")
  try:
    config = json.loads(config_path.read_text())
    records = read_metrics(path)
  except json.JSONDecodeError as e:
    raise ReportError(f"{path}: unreadable JSON ({e})") from e
  # results.json where the eval folder has it, else the eval/<benchmark> metrics of that step
  accuracy = {**_accuracy_from_metrics(records), **_accuracy_from_results(eval_report.load_history(path))}
  return Run(path=path, setting=config.get("setting", "unknown"), arm=arm or config["reward"]["name"],
             seed=int(config.get("seed", 0)), records=records, accuracy=accuracy)


def find_runs(paths) -> tuple[list[Run], list[str]]:
  """The runs under each path: a sweep root (its sweep.json names the cells and their arms), a run
  directory, or any folder holding run directories. Returns (runs, notes about cells without metrics)."""
  runs, notes = [], []
  for path in map(pathlib.Path, paths):
    if not path.is_dir():
      raise ReportError(f"{path}: no such directory")
    if (path / SWEEP_FILE).is_file():
      sweep = json.loads((path / SWEEP_FILE).read_text())
      for cell in sweep["cells"]:
        workdir = path / cell["dir"]
        if (workdir / "metrics.jsonl").is_file():
          runs.append(load_run(workdir, cell["arm"]))
        else:
          notes.append(f"{workdir}: no metrics yet (cell not run)")
    elif (path / "metrics.jsonl").is_file():
      runs.append(load_run(path))
    else:
      found = sorted(p.parent for p in path.rglob("metrics.jsonl"))
      if not found:
        raise ReportError(f"{path}: no metrics.jsonl in it or below it")
      runs += [load_run(p) for p in found]
  return runs, notes


def group_by_arm(runs: list[Run]) -> dict[str, dict[str, list[Run]]]:
  """{setting: {arm: runs sorted by seed}}, arms in first-seen order."""
  groups: dict[str, dict[str, list[Run]]] = {}
  for run in runs:
    groups.setdefault(run.setting, {}).setdefault(run.arm, []).append(run)
  for arms in groups.values():
    for arm_runs in arms.values():
      arm_runs.sort(key=lambda r: r.seed)
  return groups


def duplicate_seeds(arm_runs: list[Run]) -> list[str]:
  """Notes for seeds that appear in more than one run of an arm (e.g. runs differing in a config value
  that is not part of the arm's name): each is counted as a separate seed."""
  by_seed: dict[int, list[str]] = {}
  for run in arm_runs:
    by_seed.setdefault(run.seed, []).append(str(run.path))
  return [f"arm {arm_runs[0].arm!r}: seed {seed} appears in {len(paths)} runs ({', '.join(paths)}); "
          "each counts as a seed (name the arms with a sweep's sweep.json to tell them apart)"
          for seed, paths in by_seed.items() if len(paths) > 1]
