"""Per-step metrics: JSONL and TensorBoard event files (process 0 only), and a one-line summary."""
from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any

import numpy as np

from compassplay_jax.infra.tensorboard_events import EventFileWriter


def _scalar(value: Any):
  """A JSON/TensorBoard-friendly scalar, or None for values that are not scalars."""
  if isinstance(value, (bool, np.bool_)):
    return float(value)
  if isinstance(value, (int, float, np.integer, np.floating)):
    return float(value)
  if hasattr(value, "shape") and getattr(value, "shape", None) == ():
    return float(value)
  return None


class MetricsWriter:
  """Appends one JSON object per step to metrics.jsonl and scalars to TensorBoard event files."""

  def __init__(self, workdir: str | pathlib.Path, enabled: bool = True):
    self.enabled = enabled
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self._tb = None
    if enabled:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._tb = EventFileWriter(pathlib.Path(workdir) / "tensorboard")

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.enabled:
      return
    record, scalars = {"step": step, "time": time.time()}, {}
    for key, value in metrics.items():
      scalar = _scalar(value)
      if scalar is not None and math.isfinite(scalar):
        record[key] = scalars[key] = scalar
      elif isinstance(value, (list, tuple, dict, str)):
        record[key] = value
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      self._tb.add_scalars(step, scalars)
      self._tb.flush()

  def close(self):
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_value(workdir: str | pathlib.Path, key: str, default: float = 0.0) -> float:
  """The last logged value of `key` in metrics.jsonl (running totals continue from it on resume)."""
  for record in reversed(read_metrics(workdir)):
    if key in record:
      return float(record[key])
  return default


def truncate_metrics(workdir: str | pathlib.Path, last_step: int) -> None:
  """After a resume from `last_step`, drops lines of steps that were logged but not checkpointed,
  so metrics.jsonl never repeats a step."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return
  kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
  path.write_text("".join(line + "\n" for line in kept))


def histogram(values, bins=(0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0001)) -> list[int]:
  """Counts of values per bin (solve rates in [0, 1] by default)."""
  if len(values) == 0:
    return [0] * (len(bins) - 1)
  return np.histogram(np.asarray(values, np.float64), bins=bins)[0].tolist()


def summary_line(step: int, total: int, metrics: dict[str, Any], keys: list[tuple[str, str]]) -> str:
  """'step 3/10 | reward/proposer 0.12 | valid 0.50 | 12.3 s' from (label, key) pairs present in metrics."""
  parts = [f"step {step}/{total}"]
  for label, key in keys:
    if key in metrics and _scalar(metrics[key]) is not None:
      value = _scalar(metrics[key])
      parts.append(f"{label} {value:.3g}" if abs(value) < 1e4 else f"{label} {value:.0f}")
  return " | ".join(parts)
