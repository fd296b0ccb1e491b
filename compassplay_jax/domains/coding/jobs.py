"""Builds sandbox call jobs for the coding checks (no execution here).

Every program runs under the sandbox's restricted runtime (`verifiers/sandbox_rules.py`) and every
value comes back as plain data (`verifiers/sandbox_values.py`); `values.py` turns it into gold and
canonical texts in the trainer. A check's gold value and an answer never share a job.
"""
import dataclasses
from typing import Sequence

from compassplay_jax.verifiers import sandbox

# None: the pool's SandboxLimits.timeout_s (AZR uses 10 s, the default).
CHECK_TIMEOUT_S = None
# AZR's determinism check: two calls on freshly built arguments.
GOLD_CALLS = 2


def gold_output_job(program: str, args: str, timeout_s=CHECK_TIMEOUT_S) -> sandbox.CallJob:
  """f(args) twice; the input may use the program's plain-data globals."""
  return sandbox.CallJob(program=program, entries=(("call", args, GOLD_CALLS),), names=True,
                         timeout_s=timeout_s)


def gold_outputs_job(program: str, inputs: Sequence[str],
                     timeout_s=CHECK_TIMEOUT_S) -> sandbox.CallJob:
  """f(x) twice for each input x (induction validation)."""
  return sandbox.CallJob(program=program, entries=tuple(("call", a, GOLD_CALLS) for a in inputs),
                         names=True, timeout_s=timeout_s)


def second_gold_job(job: sandbox.CallJob) -> sandbox.CallJob:
  """The same gold job in the worker's second interpreter (its own hash seed and address layout):
  a gold counts only if these calls return the same values too."""
  return dataclasses.replace(job, second_interpreter=True)


def values_job(value_texts: Sequence[str], timeout_s=CHECK_TIMEOUT_S) -> sandbox.CallJob:
  """Each text evaluated as a plain value expression (no program: gold texts, deduction answers)."""
  return sandbox.CallJob(program=None, entries=tuple(("value", t, 1) for t in value_texts),
                         timeout_s=timeout_s)


def answer_call_job(program: str, args: str, timeout_s=CHECK_TIMEOUT_S) -> sandbox.CallJob:
  """f(answer) once for an abduction answer (it may use the program's plain-data globals)."""
  return sandbox.CallJob(program=program, entries=(("call", args, 1),), names=True,
                         timeout_s=timeout_s)


def answer_calls_job(program: str, inputs: Sequence[str],
                     timeout_s=CHECK_TIMEOUT_S) -> sandbox.CallJob:
  """The solver's f on each hidden input (induction; the inputs use no names of the program)."""
  return sandbox.CallJob(program=program, entries=tuple(("call", a, 1) for a in inputs),
                         timeout_s=timeout_s)
