"""AZR's value semantics, computed in the trainer from the plain values a sandbox call job returns.

The sandbox returns what `f` returned as decoded plain data (`verifiers/sandbox_values.py`), never
text the program wrote. Everything that decides a verdict happens here, on that data:

- `gold_output(first, second, *others)`: AZR's determinism check (two calls must agree by `!=`
  and by `repr`), the cross-job check (`others`, the same calls in another interpreter with another
  hash seed and address layout, must be equal by `==`; no default repr's address in the value),
  then the gold text `repr(value).strip()`, truncated to 200 + '...' + 200 chars beyond
  400, and refused unless it is valid text (no lone surrogate can reach a prompt);
- `canonical(value)`: text that is equal for two values exactly when Python's `==` is for builtin
  data (1 == 1.0 == True, dict and set order ignored, list != tuple; NaN equals nothing).
"""
import math
import re
from typing import Optional, Tuple

from compassplay_jax.verifiers import sandbox
from compassplay_jax.verifiers import sandbox_values

TRUNCATE_CHARS = 400  # AZR: repr beyond 400 chars becomes s[:200] + "..." + s[-200:].
FAILED = "!"  # Canonical texts never start with "!"; failures always do.


def truncate(text: str, max_length: int = TRUNCATE_CHARS) -> str:
  if len(text) <= max_length:
    return text
  half = max_length // 2
  return text[:half] + "..." + text[-half:]


def is_text(value) -> bool:
  """True for a str that encodes as UTF-8 (no lone surrogates): safe to put in a prompt."""
  if not isinstance(value, str):
    return False
  try:
    value.encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def failure_reason(outcome) -> str:
  return f"error: {outcome.error_type}: {outcome.message[:200]}"


def gold_output(first, second, *others) -> Tuple[Optional[str], str]:
  """(gold text, "ok") for two outcomes of f on the same input in one job and `others`, its
  outcomes in a job of the second interpreter (another hash seed and address layout); or
  (None, reason). No others: AZR's check alone."""
  for outcome in (first, second):
    if isinstance(outcome, sandbox.Failure):
      return None, failure_reason(outcome)
  try:
    first_repr, second_repr = (sandbox_values.python_repr(first),
                               sandbox_values.python_repr(second))
    if (sandbox_values.python_value(first) != sandbox_values.python_value(second)
        or first_repr != second_repr):
      return None, "error: NonDeterministic: two calls with the same input returned different values"
  except (ValueError, TypeError, RecursionError, MemoryError) as e:
    return None, f"error: {type(e).__name__}: the value cannot be printed"
  reason = None
  for other in others:
    reason = reason or cross_job_reason(first, other)
  if reason is None and ADDRESS_RE.search(first_repr):
    reason = "error: NonDeterministic: the value shows an object's address"
  if reason is not None:
    return None, reason
  text = truncate(first_repr.strip())
  if not is_text(text):
    return None, "error: BadText: the gold output is not valid text"
  return text, "ok"


# A default repr (`<generator object ... at 0x7f...>`): its text differs from process to process.
ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+>")


def cross_job_reason(first, other) -> Optional[str]:
  """Why the value of the first job and of the second interpreter's job differ (None: equal by
  ==, the verdicts' equality; the order of a set of str follows the hash seed and may differ)."""
  if isinstance(other, sandbox.Failure):
    return ("error: NonDeterministic: in another process the call failed "
            f"({other.error_type[:80]})")
  if canonical(first) != canonical(other):
    return ("error: NonDeterministic: in another process (hash seed, address layout) the call "
            "returned a different value")
  return None


class _Incomparable(Exception):
  """NaN: never equal to anything, so it has no canonical text."""


def _number(value):
  kind = type(value)
  if kind is bool or kind is int:
    return f"n{int(value)}"
  if kind is float:
    if math.isnan(value):
      raise _Incomparable("nan")
    if math.isinf(value):
      return "finf" if value > 0 else "f-inf"
    if value == int(value):
      return f"n{int(value)}"
    return "f" + float.__repr__(value)
  if value.imag == 0:
    return _number(value.real)
  return "c(" + _number(value.real) + "," + _number(value.imag) + ")"


def _leaf(value):
  kind = type(value)
  if value is None:
    return "N"
  if value is Ellipsis:
    return "E"
  if kind in (bool, int, float, complex):
    return _number(value)
  if kind is str:
    return "s" + str.__repr__(value)
  if kind is bytes:
    return "b" + bytes.__repr__(value)
  if kind is range:
    return "r" + str((len(value), value.start if len(value) else 0,
                      value.step if len(value) > 1 else 0))
  raise _Incomparable(kind.__name__)


def _container(node, children):
  kind = node.kind
  if kind == "list":
    return "L[" + ",".join(children) + "]"
  if kind == "tuple":
    return "T(" + ",".join(children) + ")"
  if kind in ("set", "frozenset"):
    return "S{" + ",".join(sorted(children)) + "}"
  if kind == "deque":
    return "Q[" + ",".join(children) + "]"
  pairs = (children[i] + ":" + children[i + 1] for i in range(0, len(children), 2))
  return "D{" + ",".join(sorted(pairs)) + "}"


def canonical(outcome) -> str:
  """Canonical text of an outcome; a failure (or a NaN inside) gives '!Reason', which never
  equals anything."""
  if isinstance(outcome, sandbox.Failure):
    return FAILED + outcome.error_type
  try:
    return sandbox_values.fold(outcome, _leaf, _container)
  except _Incomparable:
    return FAILED + "NaN"
  except (ValueError, RecursionError, MemoryError) as e:
    return FAILED + type(e).__name__
