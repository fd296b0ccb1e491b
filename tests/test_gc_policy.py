"""compassplay_jax.gc_policy: full collections become rare, young cycles are still freed at once."""
import gc
import weakref

import pytest

from compassplay_jax import gc_policy


class _Node:
  def __init__(self):
    self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def thresholds():
  saved = gc.get_threshold()
  yield
  gc.set_threshold(*saved)


def _churn(objects: int) -> tuple[dict[int, int], list]:
  """Collections per generation while a growing heap of long-lived objects is built among short-lived
  cycles (what tracing does); also weak references to 100 short-lived cycles made halfway through."""
  counts = {0: 0, 1: 0, 2: 0}

  def count(phase, info):
    if phase == "start":
      counts[info["generation"]] += 1
  gc.collect()
  gc.callbacks.append(count)
  try:
    heap, halfway = [], []
    for i in range(objects):
      heap.append([i])  # long-lived
      node = _Node()
      if objects // 2 <= i < objects // 2 + 100:
        halfway.append(weakref.ref(node))
      del node
  finally:
    gc.callbacks.remove(count)
  return counts, halfway


def test_full_collections_come_a_hundred_times_less_often(thresholds):
  gc.set_threshold(700, 10, 10)  # CPython's defaults
  default, _ = _churn(300_000)
  gc_policy.defer_full_collections()
  assert gc.get_threshold() == (700, 10, gc_policy.FULL_COLLECTION_EVERY)
  deferred, halfway = _churn(300_000)
  assert default[2] >= 3, default
  assert deferred[2] == 0, deferred
  assert deferred[0] == pytest.approx(default[0], rel=0.05)  # young collections as before
  # Short-lived cycles are still freed by the young collections, with no full collection at all.
  assert all(ref() is None for ref in halfway), sum(ref() is not None for ref in halfway)
