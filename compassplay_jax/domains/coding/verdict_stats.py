"""Counts of verdict reasons (valid, invalid, wrong, error) for the training metrics.

Validation and checking never raise on model output; each failure is a verdict with a reason:
`validate_proposal` returns it, `checking.check_many_reasons` returns one per answer. The step that
asked counts them (`tally`) under (stage, reason category), so a run's metrics show how often
proposals were invalid and why, and how often checks hit errors. Nothing is kept between calls.
"""
import collections
import re
from typing import Iterable


def category(reason: str) -> str:
  """The stable part of a reason: text before the first ':', '(' or quote (no model text in keys)."""
  head = re.sub(r"'[^']*'|\"[^\"]*\"", "?", reason)
  head = re.sub(r"\d+", "#", re.split(r"[:(]", head, maxsplit=1)[0]).strip()
  return head[:60] or "unknown"


def tally(stage: str, reasons: Iterable[str]) -> collections.Counter:
  """{"<stage>/<category>": count} of the reasons ("validation/syntax error": 3, "checking/wrong": 5)."""
  return collections.Counter(f"{stage}/{category(r)}" for r in reasons)
