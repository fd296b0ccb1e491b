"""Exact stop strings, checked on the host once per decode chunk (never per token).

A row stops at the first token t such that decode(completion[:t+1]) contains a stop string; its
tokens are cut after t and its text right after the stop string (the stop string is kept). The check
decodes a window that starts `lookback` tokens before the new tokens: a stop string of c characters
spans at most 4c tokens (4 UTF-8 bytes per character, at worst one byte per token), so any
occurrence that ends in the new tokens lies inside the window.
"""
from __future__ import annotations

import numpy as np


class StopFinder:
  """Finds where stop strings first appear in a growing completion."""

  def __init__(self, tokenizer, stop_strings: tuple[str, ...]):
    if stop_strings and tokenizer is None:
      raise ValueError("stop_strings need a tokenizer to decode completions")
    self._tokenizer = tokenizer
    self.stop_strings = tuple(stop_strings)
    self.lookback = 4 * max((len(s) for s in self.stop_strings), default=0) + 16

  def _decode(self, ids) -> str:
    return self._tokenizer.decode(list(map(int, ids)), skip_special_tokens=True)

  def _contains(self, ids) -> bool:
    text = self._decode(ids)
    return any(s in text for s in self.stop_strings)

  def first_stop(self, tokens: np.ndarray, start: int, end: int) -> int | None:
    """The first t in [start, end) whose prefix tokens[:t+1] contains a stop, given none before start."""
    if not self.stop_strings or start >= end:
      return None
    lo = max(0, start - self.lookback)
    if not self._contains(tokens[lo:end]):
      return None
    for t in range(start, end):
      if self._contains(tokens[lo:t + 1]):
        return t
    return None  # unreachable unless decode is not monotone in its prefix

  def cut(self, text: str) -> str:
    """Text up to and including the earliest-ending stop string (unchanged when there is none)."""
    ends = [text.find(s) + len(s) for s in self.stop_strings if s in text]
    return text[:min(ends)] if ends else text
