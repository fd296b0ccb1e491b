"""JSON-lines files: one object per non-blank line, read one line at a time (some are gigabytes)."""
from __future__ import annotations

import json
import pathlib
from typing import Iterator

from compassplay_jax.core.errors import InputFormatError


def records(path: str | pathlib.Path, error: type[Exception] = InputFormatError,
            where: str | None = None) -> Iterator[tuple[int, dict]]:
  """(line number, object) per non-blank line. A line that is not JSON, or not an object, raises
  `error` naming `where` (default: the path) and the line."""
  where = str(path) if where is None else where
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise error(f"{where}:{lineno}: invalid JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise error(f"{where}:{lineno}: record is not a JSON object")
      yield lineno, row
