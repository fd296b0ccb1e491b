"""Checks CRUXEval and LiveCodeBench answers by running them in the sandbox.

Model text is never eval'd or exec'd in this process. For CRUXEval every answer becomes one sandbox job
whose program defines f plus the checking helpers below and whose expression returns True or False.
The helpers compare with a type-strict deep equality, so a value whose type only pretends to be equal
(an always-True __eq__, a list subclass) does not pass. LiveCodeBench programs run once per test; stdin
outputs are compared here as plain strings, functional results inside the sandbox after a JSON round trip.
"""
import dataclasses
import decimal
import re
from typing import Sequence

from compassplay_jax.evals.benchmarks import EvalItem

# Defined after the task code in every job, so the task cannot shadow them. Predictions are evaluated
# in copies of the globals, so a prediction cannot rebind them either.
_CHECK_HELPERS = r'''

def __cp_strict_eq(a, b):
  if type(a) is not type(b):
    return False
  if type(a) in (list, tuple):
    return len(a) == len(b) and all(__cp_strict_eq(x, y) for x, y in zip(a, b))
  if type(a) is dict:
    if len(a) != len(b):
      return False
    for key_a, value_a in a.items():
      matches = [key_b for key_b in b if __cp_strict_eq(key_a, key_b)]
      if len(matches) != 1 or not __cp_strict_eq(value_a, b[matches[0]]):
        return False
    return True
  if type(a) in (set, frozenset):
    return len(a) == len(b) and all(sum(__cp_strict_eq(x, y) for y in b) == 1 for x in a)
  if type(a) is float and a != a:
    return b != b  # nan equals nan here, as its repr does.
  return bool(a == b)


def __cp_check_output(gold_src, pred_src):
  gold = eval(gold_src, dict(globals()))
  pred = eval(compile(pred_src, "<prediction>", "eval"), dict(globals()))
  return __cp_strict_eq(gold, pred)


def __cp_check_input(gold_src, pred_src):
  import ast
  call = ast.parse("f(" + pred_src + ")", mode="eval")
  # The prediction must be an argument list: "1) or (True" would otherwise escape the call.
  if not (isinstance(call.body, ast.Call) and isinstance(call.body.func, ast.Name) and call.body.func.id == "f"):
    return False
  gold = eval(gold_src, dict(globals()))
  return __cp_strict_eq(gold, eval(compile(call, "<prediction>", "eval"), dict(globals())))


def __cp_json_eq(a, b):
  if isinstance(a, bool) or isinstance(b, bool):
    return type(a) is type(b) and a == b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return a == b
  if type(a) is not type(b):
    return False
  if type(a) is list:
    return len(a) == len(b) and all(__cp_json_eq(x, y) for x, y in zip(a, b))
  if type(a) is dict:
    return a.keys() == b.keys() and all(__cp_json_eq(a[k], b[k]) for k in a)
  return a == b


def __cp_check_call(method, args_src, expected_src):
  import json
  args = [json.loads(line) for line in args_src.split("\n") if line.strip()]
  result = getattr(Solution(), method)(*args)
  # The round trip turns tuples into lists and any int/str/list subclass into the plain type.
  got = json.loads(json.dumps(result))
  return __cp_json_eq(got, json.loads(expected_src))
'''

# The import header LiveCodeBench puts before every program.
_LCB_PRELUDE = """\
from string import *
from re import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from itertools import *
from functools import *
from operator import *
from typing import *
import string, re, collections, heapq, bisect, copy, math, itertools, functools, operator, sys, json
sys.setrecursionlimit(50000)
"""


@dataclasses.dataclass(frozen=True)
class CodeVerdict:
  correct: bool
  detail: str  # "passed", "wrong_answer", "no_answer", "timeout", "error: ValueError ...", ...


def _sandbox():
  # Imported lazily: the rest of the harness works without the sandbox module.
  from compassplay_jax.verifiers import sandbox  # pylint: disable=g-import-not-at-top
  return sandbox


def _failure_detail(result) -> str:
  if result.status == "ok":
    return "wrong_answer"
  if result.status == "error":
    message = (result.error_message or "").strip().splitlines()
    return f"error: {result.error_type or ''} {message[-1] if message else ''}".strip()
  return result.status


def cruxeval_job(item: EvalItem, prediction: str, timeout_s: float):
  """The sandbox job that returns True iff `prediction` answers the CRUXEval item."""
  check = "__cp_check_output" if item.kind == "cruxeval_o" else "__cp_check_input"
  code = f"{item.code}\n{_CHECK_HELPERS}\n__cp_gold_src = {item.output!r}\n__cp_pred_src = {prediction!r}\n"
  return _sandbox().Job(code=code, expr=f"{check}(__cp_gold_src, __cp_pred_src)", timeout_s=timeout_s)


def check_cruxeval(items: Sequence[EvalItem], predictions: Sequence[str], pool,
                   timeout_s: float = 10.0) -> list[CodeVerdict]:
  """CRUXEval-O: predicted value strictly equals the gold output; CRUXEval-I: f(predicted) does."""
  verdicts = [CodeVerdict(False, "no_answer")] * len(items)
  # An empty input is a real answer for a zero-argument f; an empty output never is.
  todo = [i for i, (item, p) in enumerate(zip(items, predictions)) if p.strip() or item.kind == "cruxeval_i"]
  results = pool.run_batch([cruxeval_job(items[i], predictions[i], timeout_s) for i in todo])
  for i, result in zip(todo, results):
    passed = result.ok and result.value_repr == "True"
    verdicts[i] = CodeVerdict(passed, "passed" if passed else _failure_detail(result))
  return verdicts


def _with_prelude(program: str) -> str:
  # `from __future__` imports must stay first in the module.
  future = [l for l in program.splitlines() if l.startswith("from __future__")]
  rest = [l for l in program.splitlines() if not l.startswith("from __future__")]
  return "\n".join(future + [_LCB_PRELUDE] + rest) + "\n"


def method_name(starter_code: str) -> str | None:
  match = re.search(r"def\s+(\w+)\s*\(\s*self", starter_code)
  return match.group(1) if match else None


def lcb_job(item: EvalItem, program: str, test_index: int, timeout_s: float):
  test = item.tests[test_index]
  code = _with_prelude(program)
  if test.testtype == "stdin":
    return _sandbox().Job(code=code, expr=None, stdin=test.input, timeout_s=timeout_s)
  expr = f"__cp_check_call({method_name(item.starter_code)!r}, {test.input!r}, {test.output!r})"
  return _sandbox().Job(code=code + _CHECK_HELPERS, expr=expr, timeout_s=timeout_s)


def _tokens(text: str) -> list[list[str]]:
  lines = [line.split() for line in text.splitlines()]
  while lines and not lines[-1]:
    lines.pop()
  return lines


def _same_token(a: str, b: str) -> bool:
  if a == b:
    return True
  try:  # "0.50" and "0.5" are the same number.
    return decimal.Decimal(a) == decimal.Decimal(b)
  except decimal.InvalidOperation:
    return False


def stdout_matches(got: str, expected: str) -> bool:
  """Line by line, token by token; trailing whitespace and trailing blank lines do not count."""
  got_lines, expected_lines = _tokens(got), _tokens(expected)
  return len(got_lines) == len(expected_lines) and all(
      len(g) == len(e) and all(_same_token(x, y) for x, y in zip(g, e))
      for g, e in zip(got_lines, expected_lines))


def _test_passed(item: EvalItem, test_index: int, result) -> bool:
  if not result.ok:
    return False
  if item.tests[test_index].testtype == "stdin":
    return stdout_matches(result.stdout or "", item.tests[test_index].output)
  return result.value_repr == "True"


def check_livecodebench(items: Sequence[EvalItem], programs: Sequence[str], pool,
                        timeout_s: float = 6.0) -> list[CodeVerdict]:
  """A program passes when it passes every test. Tests run in rounds, so a failing item stops early."""
  verdicts = [CodeVerdict(False, "no_answer")] * len(items)
  alive = []
  for i, (item, program) in enumerate(zip(items, programs)):
    if not program.strip():
      continue
    if any(t.testtype == "functional" for t in item.tests) and not method_name(item.starter_code):
      verdicts[i] = CodeVerdict(False, "error: no method in starter code")
      continue
    alive.append(i)
  test_index = 0
  while alive:
    results = pool.run_batch([lcb_job(items[i], programs[i], test_index, timeout_s) for i in alive])
    next_alive = []
    for i, result in zip(alive, results):
      item = items[i]
      if not _test_passed(item, test_index, result):
        detail = _failure_detail(result)
        verdicts[i] = CodeVerdict(False, f"test {test_index + 1}/{len(item.tests)}: {detail}")
      elif test_index + 1 == len(item.tests):
        verdicts[i] = CodeVerdict(True, "passed")
      else:
        next_alive.append(i)
    alive, test_index = next_alive, test_index + 1
  return verdicts
