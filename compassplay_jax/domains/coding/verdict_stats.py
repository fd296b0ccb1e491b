"""Counts of every verdict reason (valid, invalid, wrong, error) for the training metrics.

Validation and checking never raise on model output; each failure is turned into a
verdict and counted here under (stage, reason category), so a run's metrics show
how often proposals were invalid and why, and how often checks hit errors.
"""
import collections
import re
import threading

_lock = threading.Lock()
_counts = collections.Counter()


def category(reason: str) -> str:
  """The stable part of a reason: text before the first ':', '(' or quote (no model text in keys)."""
  head = re.sub(r"'[^']*'|\"[^\"]*\"", "?", reason)
  head = re.sub(r"\d+", "#", re.split(r"[:(]", head, maxsplit=1)[0]).strip()
  return head[:60] or "unknown"


def count(stage: str, reason: str, n: int = 1) -> None:
  with _lock:
    _counts[f"{stage}/{category(reason)}"] += n


def snapshot(reset: bool = False) -> dict:
  """{"validation/syntax error": 3, "checking/wrong": 5, ...}; reset=True starts a new window."""
  with _lock:
    out = dict(_counts)
    if reset:
      _counts.clear()
  return out
