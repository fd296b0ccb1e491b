"""Python's cyclic garbage collector, set for a process that traces and compiles JAX programs.

Tracing and lowering make millions of short-lived objects, so the young generations are collected
often; with CPython's defaults, every tenth collection of generation 1 is also a full collection
(once enough new objects have survived), and a full collection walks every object the process holds:
JAX's caches, the model, the data. Measured in four test files run in one process: 23 full collections
took 6.85 of 94.6 CPU-s (docs/testing.md). Full collections now come 100 times less often; the young
generations keep CPython's thresholds, so short-lived cycles are still freed at once. Processes that
run long (the main command, the pytest workers, the multi-host workers) call `defer_full_collections`
once at start-up.
"""
from __future__ import annotations

import gc

# Collections of generation 1 between two full collections (CPython's default: 10).
FULL_COLLECTION_EVERY = 1000


def defer_full_collections() -> None:
  """Keeps CPython's thresholds for generations 0 and 1; full collections FULL_COLLECTION_EVERY times
  fewer than by default (CPython also waits until a quarter of the old objects are new)."""
  young, middle, _ = gc.get_threshold()
  gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
