"""SGS's conjecture deduplication: exact string match, before any conjecture is proved.

SGS (github.com/LukeBailey181/sgs at 64d2de4, sgs/pipeline/step1_data_gen.py:443-452) seeds a set
with the `theorem` string of every target statement of the iteration, then walks the extracted
conjectures in order and keeps one only if its string is not in the set yet (adding it):
a conjecture equal to a target, or to an earlier conjecture of the same iteration, is dropped
(step1_data_gen.py:522 then proves and trains only the kept ones). The key is the extracted string
itself (sgs/utils/prompts.py:184-221: the last ```lean4 block up to its `:= by`, stripped): no
whitespace normalisation, no renaming, the theorem name included, so `theorem foo ...` and
`theorem bar ...` with the same signature are both kept.
"""
from collections.abc import Iterable, Sequence


def sgs_duplicates(conjectures: Sequence[str | None], targets: Iterable[str]) -> list[bool]:
  """Per conjecture: True when SGS drops it, i.e. its string equals a target statement's or an
  earlier kept conjecture's (exact match). None (no conjecture extracted) is never a duplicate and
  never enters the set, as SGS drops those before deduplicating (step1_data_gen.py:429-441)."""
  seen = set(targets)
  dropped = []
  for text in conjectures:
    duplicate = text is not None and text in seen
    if text is not None:
      seen.add(text)
    dropped.append(duplicate)
  return dropped
