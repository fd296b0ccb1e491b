"""Checks CRUXEval and LiveCodeBench answers by running them in the sandbox.

Model text is never eval'd or exec'd in this process, and the gold answer never sits in a job that runs
model text: the gold value and the answer are turned into canonical text in separate jobs, and this
process compares the texts. An output prediction (CRUXEval-O, LCB-Execution) is credited as a value only:
this process parses it (never evaluates it) and refuses anything but literals and a few value
constructors (`value_only_problem`), and its job runs without the program, so `f(3)` or a name the
program defines cannot stand in for the value. For CRUXEval the canonical text is either AZR's `==`
(equality "azr": 1 == 1.0 == True, a tuple is not a list, set == frozenset, NaN equals nothing) or
type-strict (equality "strict": a tuple is not a list, 1.0 is not 1, True is not 1; NaN equals NaN as its
repr does); dict and set order never count, and values whose type is not a builtin data type (an
always-True __eq__, a list subclass) have none, so they never match.
LiveCodeBench programs run once per test; stdin outputs are compared here as plain strings, functional
results come back as JSON (a round trip, so tuples are lists) and are compared here with the expected JSON.
"""
import ast
import dataclasses
import decimal
import json
import re
from typing import Sequence

from compassplay_jax.evals.benchmarks import EvalItem

# Defined after the task code in every job, so the task cannot shadow them. Input predictions are
# evaluated in copies of the globals (output predictions in a namespace of their own, without the program),
# so a prediction cannot rebind them either (and gains nothing if it did: the comparison happens outside
# the sandbox).
_CHECK_HELPERS = r'''

def __cp_strict_canon(v, depth=0):
  if depth > 300:
    raise ValueError("value nested too deeply")
  t = type(v)
  sub = lambda x: __cp_strict_canon(x, depth + 1)
  if v is None:
    return "None"
  if t is bool:
    return "bool:" + ("True" if v else "False")
  if t is int:
    return "int:" + int.__repr__(v)
  if t is float:
    if v != v:
      return "float:nan"
    return "float:" + float.__repr__(v + 0.0)  # -0.0 + 0.0 == 0.0: equal floats, equal text.
  if t is complex:
    return "complex:" + sub(v.real) + "," + sub(v.imag)
  if t is str:
    return "str:" + str.__repr__(v)
  if t is bytes:
    return "bytes:" + bytes.__repr__(v)
  if t is list or t is tuple:
    return t.__name__ + "[" + ",".join([sub(x) for x in v]) + "]"
  if t is dict:
    return "dict{" + ",".join(sorted([sub(k) + ":" + sub(x) for k, x in dict.items(v)])) + "}"
  if t is set or t is frozenset:
    return t.__name__ + "{" + ",".join(sorted([sub(x) for x in v])) + "}"
  raise TypeError(t.__name__ + " is not a builtin data type")


class __cp_Unequal(Exception):
  pass


def __cp_azr_canon_tree(v, depth=0):
  # Equal texts exactly when Python's == says equal (AZR's test): numbers by exact value whatever their
  # type (True == 1 == 1.0 == 1+0j), a list is never a tuple, set == frozenset, str != bytes ==
  # bytearray, dict and set order ignored; NaN equals nothing (two evaluations never share a NaN object).
  if depth > 300:
    raise ValueError("value nested too deeply")
  t = type(v)
  sub = lambda x: __cp_azr_canon_tree(x, depth + 1)
  if v is None:
    return "None"
  if t is complex:
    if v.imag == 0:
      return sub(v.real)
    return "complex:" + sub(v.real) + "," + sub(v.imag)
  if t is bool or t is int or t is float:
    if t is float and v != v:
      raise __cp_Unequal()
    if t is float and v in (float("inf"), float("-inf")):
      return "num:" + ("inf" if v > 0 else "-inf")
    n, d = (int(v), 1) if t is not float else float.as_integer_ratio(v)
    return "num:" + format(n, "x") + "/" + format(d, "x")  # hex: no limit on digits
  if t is str:
    return "str:" + str.__repr__(v)
  if t is bytes or t is bytearray:
    return "bytes:" + bytes.__repr__(bytes(v))
  if t is list or t is tuple:
    return t.__name__ + "[" + ",".join([sub(x) for x in v]) + "]"
  if t is dict:
    return "dict{" + ",".join(sorted([sub(k) + ":" + sub(x) for k, x in dict.items(v)])) + "}"
  if t is set or t is frozenset:
    return "set{" + ",".join(sorted([sub(x) for x in v])) + "}"
  raise TypeError(t.__name__ + " is not a builtin data type")


def __cp_azr_canon(v):
  try:
    return __cp_azr_canon_tree(v)
  except __cp_Unequal:
    return "unequal:nan"


def __cp_canon(v, mode):
  return __cp_azr_canon(v) if mode == "azr" else __cp_strict_canon(v)


def __cp_canon_value(src, mode="strict"):
  return __cp_canon(eval(compile(src, "<value>", "eval"), dict(globals())), mode)


def __cp_canon_literal(src, mode="strict"):
  # An output prediction, already checked to be a value (value_only_problem) in the harness; its job has
  # no program in it, and the namespace holds only the value constructors the check allows.
  names = {"__builtins__": {}, "set": set, "frozenset": frozenset, "tuple": tuple, "list": list,
           "dict": dict, "float": float, "complex": complex, "inf": float("inf"), "nan": float("nan")}
  return __cp_canon(eval(compile(src, "<value>", "eval"), names), mode)


def __cp_canon_call(pred_src, mode="strict"):
  import ast
  call = ast.parse("f(" + pred_src + ")", mode="eval")
  # The prediction must be an argument list: "1) or (True" would otherwise escape the call.
  if not (isinstance(call.body, ast.Call) and isinstance(call.body.func, ast.Name) and call.body.func.id == "f"):
    raise SyntaxError("not an argument list")
  return __cp_canon(eval(compile(call, "<prediction>", "eval"), dict(globals())), mode)


def __cp_call_json(method, args_src):
  import json
  args = [json.loads(line) for line in args_src.split("\n") if line.strip()]
  result = getattr(Solution(), method)(*args)
  # The round trip turns tuples into lists and any int/str/list subclass into the plain type.
  return json.dumps(result)
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


# What an output prediction may be built from: literals (numbers, strings, bytes, True/False/None),
# tuple/list/set/dict displays of values, a sign before a number, a complex literal (1+2j), these
# constructors applied to at most one value (set(), frozenset({1}), float('inf')), and the names inf and
# nan (the repr of infinite and NaN floats). No other name, call, attribute, subscript, operator,
# comprehension, lambda, f-string, starred or ** item: the program and any name it defines are out of reach.
_VALUE_CALLS = frozenset({"set", "frozenset", "tuple", "list", "dict", "float", "complex"})
_VALUE_NAMES = frozenset({"inf", "nan"})


def _is_number(node) -> bool:
  """A number constant, inf or nan under any run of signs (a loop: a long run must not exhaust the stack)."""
  while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    node = node.operand
  return (isinstance(node, ast.Constant) and type(node.value) in (int, float, complex)) or (
      isinstance(node, ast.Name) and node.id in _VALUE_NAMES)


def value_only_problem(source: str) -> str | None:
  """None when `source` is a value written out (see _VALUE_CALLS), else why not. Parses, never evaluates."""
  try:
    tree = ast.parse(source, mode="eval")
  except Exception as e:  # pylint: disable=broad-except  (SyntaxError, MemoryError, RecursionError)
    return f"does not parse ({type(e).__name__})"
  stack = [tree.body]
  while stack:
    node = stack.pop()
    if isinstance(node, ast.Constant):
      continue
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
      stack.extend(node.elts)  # A Starred element is refused when popped.
    elif isinstance(node, ast.Dict):
      if any(k is None for k in node.keys):
        return "** in a dict"
      stack.extend(node.keys + node.values)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
      if not _is_number(node.operand):
        return "sign before a non-number"
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
      if not (_is_number(node.left) and isinstance(node.right, ast.Constant)
              and type(node.right.value) is complex):
        return "operator"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
      if node.func.id not in _VALUE_CALLS:
        return f"calls {node.func.id}"
      if node.keywords or len(node.args) > 1:
        return f"{node.func.id}() with more than one value"
      stack.extend(node.args)
    elif isinstance(node, ast.Name):
      if node.id not in _VALUE_NAMES:
        return f"names {node.id}"
    else:
      return type(node).__name__.lower()
  return None


# config.eval.equality: "azr" is AZR's `==` (python_executor.py L193 `eval(gold_output) ==
# eval(agent_output)` for output prediction, templates.py L10-11 `{gold_output} == f({agent_input})` for
# input prediction; absolute_zero_reasoner/utils/code_utils, paper branch 41ed983); "strict" is the
# type-strict equality (1 != 1.0 != True). Both compare canonical texts made in the sandbox.
EQUALITIES = ("azr", "strict")
_UNEQUAL = "unequal:nan"  # the "azr" text of a value holding a NaN: equal to nothing, itself included


def _check_equality(equality: str) -> str:
  if equality not in EQUALITIES:
    raise ValueError(f"config.eval.equality: {equality!r} is not one of {EQUALITIES}")
  return equality


def cruxeval_gold_job(item: EvalItem, timeout_s: float, equality: str = "strict"):
  """Canonical text of the gold output (a job with no model text in it)."""
  code = f"{item.code}\n{_CHECK_HELPERS}\n__cp_src = {item.output!r}\n"
  return _sandbox().Job(code=code, expr=f"__cp_canon_value(__cp_src, {_check_equality(equality)!r})",
                        timeout_s=timeout_s)


def cruxeval_job(item: EvalItem, prediction: str, timeout_s: float, equality: str = "strict"):
  """Canonical text of the prediction: the value (CRUXEval-O, in a job without the program) or
  f(prediction) (CRUXEval-I); no gold."""
  mode = repr(_check_equality(equality))
  if item.kind == "cruxeval_o":
    code = f"{_CHECK_HELPERS}\n__cp_src = {prediction!r}\n"
    return _sandbox().Job(code=code, expr=f"__cp_canon_literal(__cp_src, {mode})", timeout_s=timeout_s)
  code = f"{item.code}\n{_CHECK_HELPERS}\n__cp_src = {prediction!r}\n"
  return _sandbox().Job(code=code, expr=f"__cp_canon_call(__cp_src, {mode})", timeout_s=timeout_s)


def check_cruxeval(items: Sequence[EvalItem], predictions: Sequence[str], pool,
                   timeout_s: float = 10.0, equality: str = "strict") -> list[CodeVerdict]:
  """CRUXEval-O: predicted value equals the gold output; CRUXEval-I: f(predicted) does. `equality`:
  "strict" (type-strict) or "azr" (Python's ==, as AZR checks; see EQUALITIES).

  An output prediction must be a value written out (value_only_problem); anything else, `f(3)` or a name
  the program defines included, scores 0 with detail "not_a_value: ..." and never reaches the sandbox."""
  _check_equality(equality)
  verdicts = [CodeVerdict(False, "no_answer")] * len(items)
  # An empty input is a real answer for a zero-argument f; an empty output never is.
  todo = [i for i, (item, p) in enumerate(zip(items, predictions))
          if isinstance(p, str) and (p.strip() or item.kind == "cruxeval_i")]
  for i in todo:
    problem = value_only_problem(predictions[i]) if items[i].kind == "cruxeval_o" else None
    if problem is not None:
      verdicts[i] = CodeVerdict(False, f"not_a_value: {problem}")
  todo = [i for i in todo if not verdicts[i].detail.startswith("not_a_value")]
  gold_index = {}
  for i in todo:
    gold_index.setdefault((items[i].code, items[i].output), len(gold_index))
  gold_jobs = [None] * len(gold_index)
  for i in todo:
    gold_jobs[gold_index[(items[i].code, items[i].output)]] = cruxeval_gold_job(items[i], timeout_s, equality)
  results = pool.run_batch(gold_jobs + [cruxeval_job(items[i], predictions[i], timeout_s, equality)
                                        for i in todo])
  golds, answers = results[:len(gold_jobs)], results[len(gold_jobs):]
  for i, result in zip(todo, answers):
    gold = golds[gold_index[(items[i].code, items[i].output)]]
    if not (gold.ok and isinstance(gold.value_text, str)):
      verdicts[i] = CodeVerdict(False, f"gold {_failure_detail(gold)}")
      continue
    passed = result.ok and result.value_text == gold.value_text and gold.value_text != _UNEQUAL
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
  # The expected output stays here: the job returns the program's result as JSON.
  expr = f"__cp_call_json({method_name(item.starter_code)!r}, {test.input!r})"
  return _sandbox().Job(code=code + _CHECK_HELPERS, expr=expr, timeout_s=timeout_s)


def _json_eq(a, b) -> bool:
  """LiveCodeBench's comparison of JSON values: numbers by value, bools only equal bools."""
  if isinstance(a, bool) or isinstance(b, bool):
    return type(a) is type(b) and a == b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return a == b
  if type(a) is not type(b):
    return False
  if type(a) is list:
    return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
  if type(a) is dict:
    return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
  return a == b


def _functional_passed(result_json, expected_json) -> bool:
  """Untrusted JSON from the job against the dataset's; any parse failure is a fail."""
  try:
    return _json_eq(json.loads(result_json), json.loads(expected_json))
  except Exception:  # pylint: disable=broad-except  (RecursionError on deep nesting, bad JSON)
    return False


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
  return isinstance(result.value_text, str) and _functional_passed(
      result.value_text, item.tests[test_index].output)


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
