"""Verification that overlaps decoding: check jobs start as soon as their rows finish.

The rollout engine calls `on_finish(row, ...)` when a row is final (sampling/rollout_engine.py); the
loop passes each row to `BackgroundChecks.on_row`, and once all rows of an item are in (a candidate's
n solve samples, a solver rollout, a problem's k proofs) a worker thread runs the item's sandbox or
Lean job while the device keeps decoding the others. After generation the caller hands over every
row again from the result (`finish`: rows already in are kept) and collects the results in item
order, so an engine that never calls the hook gives the same results, only without the overlap.

`busy_s` is the checker's wall time with at least one job running: the step's sandbox / Lean phase
time, which overlaps the generate phase (step.run_step's `overlap` metric).
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Sequence


class BackgroundChecks:
  """Runs `check(item, row_values)` for items on `workers` threads, started as their rows finish."""

  def __init__(self, check: Callable[[Any], Any], items: Sequence, rows_per_item: int, workers: int = 1):
    self.check, self.items, self.rows_per_item = check, list(items), rows_per_item
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                           thread_name_prefix="overlapped-checks")
    self._futures: dict[int, concurrent.futures.Future] = {}
    self._rows: dict[int, dict[int, Any]] = {}
    self._lock = threading.Lock()
    self._active, self._since, self.busy_s = 0, 0.0, 0.0

  def on_row(self, row: int, value) -> None:
    """A finished row (its global index) and what the item's check needs of it; the item's check
    starts once all its rows are in."""
    item = row // self.rows_per_item
    with self._lock:
      rows = self._rows.setdefault(item, {})
      rows[row % self.rows_per_item] = value
      ready = len(rows) == self.rows_per_item and item not in self._futures
    if ready:
      self.submit(item)

  def submit(self, item: int) -> None:
    with self._lock:
      if item in self._futures:
        return
      self._futures[item] = self._executor.submit(self._timed, item)

  def _timed(self, item: int):
    with self._lock:
      if self._active == 0:
        self._since = time.time()
      self._active += 1
    try:
      return self.check(self.items[item], self.rows_of(item))
    finally:
      with self._lock:
        self._active -= 1
        if self._active == 0:
          self.busy_s += time.time() - self._since

  def rows_of(self, item: int) -> list:
    """The values on_row received for an item, in row order (empty when none reported)."""
    rows = self._rows.get(item, {})
    return [rows[j] for j in sorted(rows)]

  def finish(self, rows: dict[int, Any], items: Sequence[int]) -> list:
    """The checks' results for `items` (in that order) once every row of theirs is in: `rows` (global
    row -> value, from the generation result) fills any row the hook did not report."""
    for row, value in rows.items():
      item = row // self.rows_per_item
      with self._lock:
        known = row % self.rows_per_item in self._rows.get(item, {})
      if not known:
        self.on_row(row, value)
    return [self._futures[item].result() for item in items]

  def close(self) -> None:
    self._executor.shutdown(wait=True)

  def __enter__(self) -> "BackgroundChecks":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
