"""Evaluation outputs: the accuracy table (JSON and markdown), per-item predictions, and the history plot.

Layout: <workdir>/eval/step_<N>/{results.json, results.md, predictions.jsonl}.
"""
import json
import math
import pathlib
import re
from typing import Sequence

from compassplay_jax.evals.benchmarks import BENCHMARKS, EXTRA, IN_DOMAIN, OUT_OF_DOMAIN

MEANS = {IN_DOMAIN: "in_domain_mean", OUT_OF_DOMAIN: "out_of_domain_mean"}


def step_dir(workdir, step: int) -> pathlib.Path:
  return pathlib.Path(workdir) / "eval" / f"step_{int(step)}"


def summarize(correct_by_benchmark: dict[str, Sequence[bool]], step: int | None = None) -> dict:
  """Per-benchmark accuracy plus the paper's in-domain and out-of-domain means (AIME is in neither)."""
  summary = {"step": step, "benchmarks": {}}
  for name, correct in correct_by_benchmark.items():
    spec = BENCHMARKS[name]
    total = len(correct)
    summary["benchmarks"][name] = {
        "display_name": spec.display_name, "domain": spec.domain, "correct": int(sum(correct)),
        "total": total, "accuracy": sum(correct) / total if total else float("nan")}
  for domain, key in MEANS.items():
    members = [n for n, r in summary["benchmarks"].items() if r["domain"] == domain and r["total"]]
    summary[key] = (sum(summary["benchmarks"][n]["accuracy"] for n in members) / len(members)
                    if members else None)
    summary[key + "_of"] = members  # Which benchmarks the mean covers: the paper's means need all.
  return summary


def _pct(value) -> str:
  return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def markdown_table(summary: dict) -> str:
  lines = [f"## Evaluation at step {summary.get('step')}", "",
           "| benchmark | domain | accuracy (%) | correct / total |", "|---|---|---:|---:|"]
  for result in summary["benchmarks"].values():
    lines.append(f"| {result['display_name']} | {result['domain']} | {_pct(result['accuracy'])} "
                 f"| {result['correct']} / {result['total']} |")
  for domain, key in MEANS.items():
    covered = ", ".join(BENCHMARKS[n].display_name for n in summary[key + "_of"]) or "none"
    lines.append(f"| **{key.replace('_', ' ')}** | {domain} | **{_pct(summary[key])}** | {covered} |")
  extra = [r["display_name"] for r in summary["benchmarks"].values() if r["domain"] == EXTRA]
  if extra:
    lines += ["", f"{', '.join(extra)}: reported, not part of either mean."]
  return "\n".join(lines) + "\n"


def write_step_results(out_dir, summary: dict, predictions: Sequence[dict]) -> pathlib.Path:
  """Writes results.json, results.md and predictions.jsonl into `out_dir`; returns it."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
  (out_dir / "results.md").write_text(markdown_table(summary))
  with open(out_dir / "predictions.jsonl", "w", encoding="utf-8") as f:
    for row in predictions:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  return out_dir


def load_history(run_dir) -> dict[int, dict]:
  """step -> results.json of one run; `run_dir` is a workdir or its eval/ folder."""
  run_dir = pathlib.Path(run_dir)
  eval_dir = run_dir / "eval" if (run_dir / "eval").is_dir() else run_dir
  history = {}
  for path in eval_dir.glob("step_*/results.json"):
    match = re.fullmatch(r"step_(\d+)", path.parent.name)
    if match:
      history[int(match.group(1))] = json.loads(path.read_text())
  return history


def _series(histories: list[dict[int, dict]], key: str):
  """Steps and per-run values of one panel (a benchmark name or a mean key); NaN where a run lacks it."""
  steps = sorted({s for h in histories for s in h})
  values = []
  for history in histories:
    row = []
    for step in steps:
      result = history.get(step, {})
      value = result.get(key) if key in MEANS.values() else result.get("benchmarks", {}).get(key, {}).get("accuracy")
      row.append(float("nan") if value is None else 100 * value)
    values.append(row)
  return steps, values


def plot_history(run_dirs: Sequence, out_png) -> pathlib.Path:
  """Accuracy against step, one panel per benchmark and mean; several runs (seeds) give mean ± s.d.

  The final quarter of the step range is shaded: that window is where the paper's numbers are read.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  histories = [load_history(d) for d in run_dirs]
  if not any(histories):
    raise FileNotFoundError(f"plot_history: no eval/step_*/results.json under {', '.join(map(str, run_dirs))}")
  names = [n for n in BENCHMARKS if any(n in r.get("benchmarks", {}) for h in histories for r in h.values())]
  panels = names + [k for k in MEANS.values() if any(r.get(k) is not None for h in histories for r in h.values())]
  cols = min(4, len(panels))
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
  for ax, key in zip(axes.flat, panels):
    steps, values = _series(histories, key)
    values = np.array(values)
    with np.errstate(all="ignore"):
      mean = np.nanmean(values, axis=0)
      std = np.nanstd(values, axis=0, ddof=1) if len(histories) > 1 else None
    ax.plot(steps, mean, marker="o", markersize=3)
    if std is not None:
      ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    if len(steps) > 1:
      ax.axvspan(steps[0] + 0.75 * (steps[-1] - steps[0]), steps[-1], color="grey", alpha=0.15)
    title = BENCHMARKS[key].display_name if key in BENCHMARKS else key.replace("_", " ")
    ax.set_title(title + (f" (n={len(histories)} runs)" if len(histories) > 1 else ""), fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy (%)")
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.tight_layout()
  out_png = pathlib.Path(out_png)
  out_png.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
  return out_png
