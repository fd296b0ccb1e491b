"""compassplay_jax.infra.gc_policy: full collections become rare, young cycles are still freed at once.

The churn runs in a fresh interpreter: CPython starts a full collection only once the objects made
since the last one reach a quarter of the old ones, so a pytest worker's large heap would hide the
defaults' full collections (in the full suite a worker saw 1 where a fresh process sees 5)."""
import json
import pathlib
import subprocess
import sys

from compassplay_jax.infra import gc_policy

REPO = pathlib.Path(__file__).resolve().parents[1]
CHURN = r"""
import gc, json, sys, weakref
from compassplay_jax.infra import gc_policy

class Node:
  def __init__(self):
    self.me = self  # a reference cycle: only the cyclic collector frees it

def churn(objects):
  # Collections per generation while a growing heap of long-lived objects is built among short-lived
  # cycles (what tracing does), and how many of 100 cycles made halfway through are still alive.
  counts = {0: 0, 1: 0, 2: 0}
  def count(phase, info):
    if phase == "start":
      counts[info["generation"]] += 1
  gc.collect()
  gc.callbacks.append(count)
  heap, halfway = [], []
  for i in range(objects):
    heap.append([i])  # long-lived
    node = Node()
    if objects // 2 <= i < objects // 2 + 100:
      halfway.append(weakref.ref(node))
    del node
  gc.callbacks.remove(count)
  return {"counts": counts, "alive": sum(ref() is not None for ref in halfway)}

out = {"default_thresholds": gc.get_threshold(), "default": churn(300_000)}
gc_policy.defer_full_collections()
out["deferred_thresholds"] = gc.get_threshold()
out["deferred"] = churn(300_000)
gc.disable()
out["disabled"] = churn(300_000)
print(json.dumps(out))
"""


def test_full_collections_come_a_hundred_times_less_often():
  proc = subprocess.run([sys.executable, "-c", CHURN], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout)
  young, middle, _ = out["default_thresholds"]
  assert out["deferred_thresholds"] == [young, middle, gc_policy.FULL_COLLECTION_EVERY]
  default, deferred = out["default"], out["deferred"]
  assert default["counts"]["2"] >= 3, default
  assert deferred["counts"]["2"] == 0, deferred
  assert abs(deferred["counts"]["0"] - default["counts"]["0"]) <= 0.05 * default["counts"]["0"], (default, deferred)
  # Short-lived cycles are still freed by the young collections, with no full collection at all...
  assert deferred["alive"] == 0, deferred
  # ...which is the collector's doing: with it off they all live.
  assert out["disabled"]["alive"] == 100, out["disabled"]
