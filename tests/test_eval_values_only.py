"""Issue 46 item 6: an output prediction (CRUXEval-O, LCB-Execution) is credited as a value only.

Before, the prediction was evaluated with the program in scope, so `f(3)` (or a helper, class, global or
import of the program) stood in for the value and was credited. Now the harness parses the prediction
(never evaluates it), refuses anything but literals and a few value constructors, and the prediction's job
runs without the program. Input prediction (CRUXEval-I) still calls f on the predicted arguments.
"""
import json
import pathlib

import pytest

from compassplay_jax.evals import benchmarks
from compassplay_jax.evals import code_check

from tests.conftest import shared_file

sandbox = pytest.importorskip("compassplay_jax.verifiers.sandbox", reason="sandbox not available")

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"

# A program with a helper, a class, globals and an import; every attack below evaluates to the gold
# output [3, 2, 1] with this program in scope.
PROGRAM = """\
from collections import Counter
TABLE = [3, 2, 1]
ANSWER = [3, 2, 1]
def helper(x):
    return sorted(set(x), reverse=True)
class Box:
    value = [3, 2, 1]
def f(nums):
    return helper(nums)
"""
OUT = benchmarks.EvalItem("cruxeval_o", "attack", "cruxeval_o", code=PROGRAM, input="[3, 1, 3, 2]",
                          output="[3, 2, 1]")
IN = benchmarks.EvalItem("cruxeval_i", "attack", "cruxeval_i", code=PROGRAM, input="[3, 1, 3, 2]",
                         output="[3, 2, 1]")

ATTACKS = [
    "f([3, 1, 3, 2])", "f ([3, 1, 3, 2])", "(f)([3, 1, 3, 2])", "f(*[[3, 1, 3, 2]])", "f(nums=[3, 1, 3, 2])",
    "f(**{'nums': [3, 1, 3, 2]})", "[f][0]([3, 1, 3, 2])", "(lambda: f([3, 1, 3, 2]))()",
    "(lambda: f)()([3, 1, 3, 2])", "globals()['f']([3, 1, 3, 2])", "locals()['f']([3, 1, 3, 2])",
    "vars()['helper']([3, 1, 3, 2])", "eval('f([3, 1, 3, 2])')", "eval('\\x66([3, 1, 3, 2])')",
    "(g := f)([3, 1, 3, 2])", "[f(x) for x in [[3, 1, 3, 2]]][0]", "next(f(x) for x in [[3, 1, 3, 2]])",
    "list(f([3, 1, 3, 2]))", "[*f([3, 1, 3, 2])]", "f.__call__([3, 1, 3, 2])",
    "__import__('builtins').eval('f([3, 1, 3, 2])')", "helper([3, 1, 3, 2])", "helper([1, 2, 3])",
    "ANSWER", "TABLE", "Box.value", "Box().value", "getattr(Box, 'value')", "TABLE[:]", "[*TABLE]",
    "list(TABLE)", "sorted(TABLE, reverse=True)", "sorted(set(TABLE), reverse=True)",
    "[x for x in TABLE]", "list(reversed(sorted(TABLE)))", "f.__defaults__ or [3, 2, 1]",
    "[3, 2, 1] if f else 0", "[3, 2, 1] or f", "([3, 2, 1], f)[0]", "{'a': [3, 2, 1], 'b': f}['a']",
    "[3, 2] + [1]", "[3, 2, 1] * 1", "list(Counter([3, 2, 1]))",
]


def _correct(verdicts):
  return [v.correct for v in verdicts]


@pytest.fixture(scope="module")
def pool():
  with sandbox.SandboxPool(num_workers=2) as sandbox_pool:
    yield sandbox_pool


def test_output_prediction_that_reaches_the_program_is_not_credited(pool):
  verdicts = code_check.check_cruxeval([OUT] * len(ATTACKS) + [OUT], ATTACKS + ["[3, 2, 1]"], pool)
  credited = [a for a, v in zip(ATTACKS, verdicts) if v.correct]
  assert credited == []
  assert verdicts[-1].correct  # The value itself still is.
  assert all(v.detail.startswith("not_a_value: ") for v in verdicts[:-1]), [v.detail for v in verdicts]


def test_lcb_execution_prediction_that_calls_the_program_is_not_credited(pool):
  items = benchmarks.load_benchmark("livecodebench_execution_o", FIXTURES)
  attacks = {0: ["f(nums = [1, 2, 3, 4, 5])", "f(**{'nums': [1, 2, 3, 4, 5]})"],
             2: ["f(s = 'abracadabra')", "Counter('abracadabra').most_common(1)[0][0]"],
             3: ["f([1, 3, 3, 2])", "defaultdict(int) == {}"]}
  cases = [(items[k], a) for k, group in attacks.items() for a in group]
  verdicts = code_check.check_cruxeval([i for i, _ in cases], [a for _, a in cases], pool)
  assert [a for (_, a), v in zip(cases, verdicts) if v.correct] == []
  golds = code_check.check_cruxeval(items, [i.output for i in items], pool)
  assert _correct(golds) == [True] * len(items)


def test_the_output_prediction_job_has_no_program(pool):
  """Second layer: a prediction that got past the harness's check still finds no f or program name."""
  jobs = [code_check.cruxeval_job(OUT, p, 10.0) for p in ("f([3, 1, 3, 2])", "TABLE", "[3, 2, 1]")]
  call, name, value = pool.run_batch(jobs)
  assert not call.ok and call.error_type == "NameError"
  assert not name.ok and name.error_type == "NameError"
  assert value.ok


def test_values_are_still_credited_with_unchanged_equality(pool):
  out = benchmarks.load_benchmark("cruxeval_o", FIXTURES)  # [3, 2, 1], (2, 'CD'), 1.5, {...}, {1, 2}, True
  cases = [(0, "[3,2,1]", True), (0, "[+3, 2, 1]", True), (0, "[3, 2, 1]  # the output", True),
           (0, "(3, 2, 1)", False), (0, "[3.0, 2, 1]", False), (1, "(2, 'CD')", True),
           (1, "(2, \"CD\")", True), (1, "[2, 'CD']", False), (2, "1.5", True), (2, "3/2", False),
           (3, "{'b': 3, 'a': 5}", True), (3, "dict([('a', 5), ('b', 3)])", True),
           (4, "{2, 1}", True), (4, "set([1, 2])", True), (4, "set({1, 2})", True),
           (4, "frozenset({1, 2})", False), (5, "True", True), (5, "1", False)]
  verdicts = code_check.check_cruxeval([out[k] for k, _, _ in cases], [p for _, p, _ in cases], pool)
  assert [(p, v.correct) for (_, p, _), v in zip(cases, verdicts)] == [(p, c) for _, p, c in cases]
  special = benchmarks.EvalItem("cruxeval_o", "x", "cruxeval_o", code="def f():\n    return 0",
                                output="[float('inf'), -1e309, float('nan'), 1-2j, b'x', None, -0.0]")
  preds = ["[inf, -inf, nan, (1-2j), b'x', None, 0.0]", "[float('inf'), float('-inf'), nan, 1-2j, b'x', None, 0]"]
  assert _correct(code_check.check_cruxeval([special] * 2, preds, pool)) == [True, False]


def test_input_prediction_still_runs_with_the_program(pool):
  """CRUXEval-I is unchanged: the answer is f's argument list, evaluated with the program in scope."""
  verdicts = code_check.check_cruxeval([IN] * 3, ["[3, 1, 3, 2]", "TABLE", "helper([1, 2, 3])"], pool)
  assert _correct(verdicts) == [True, True, True]


@pytest.mark.parametrize("prediction", ATTACKS + [
    "f", "set", "inf.real", "x", "-f", "-(f)", "--TABLE", "1 + 1", "1+2", "(1+2j)+3j", "not 1", "~1",
    "{**{}}", "{*[]}", "f'{1}'", "set(x for x in [])", "dict(a=1)", "set([1], [2])", "float(f)",
    "[1, 2][0]", "(yield)", "await x", "1 if 1 else 2", "1 < 2", "True and TABLE", "", "1;f(1)",
    "1\nf(1)", "-" * 3000 + "f", "[" * 1000 + "]" * 1000, "(" * 300 + ")" * 300,
])
def test_value_only_refuses(prediction):
  assert code_check.value_only_problem(prediction) is not None


def test_value_only_check_never_raises():
  """Deep or huge text is refused or accepted, never an exception (the parse may run out of stack)."""
  for text in ["-" * 3000 + "1", "-" * 100000 + "1", "[" * 100 + "]" * 100, "(" * 10**5, "1" * 10**5]:
    problem = code_check.value_only_problem(text)
    assert problem is None or isinstance(problem, str)


@pytest.mark.parametrize("prediction", [
    "1", "-1", "+1", "--1", "1.5e-3", "-0.0", "1j", "1+2j", "-1-2j", "'a'", "\"a\\n\"", "b'\\x00'",
    "'a' 'b'", "True", "None", "...", "()", "(1,)", "[1, [2, (3,)]]", "{1: {'a': [None]}}", "{1, 2}",
    "set()", "frozenset()", "frozenset({1})", "tuple()", "list('ab')", "dict()", "float('inf')",
    "float('-inf')", "float('nan')", "complex(1)", "inf", "-inf", "nan", "\n[1, 2]\n", "[1, 2]  # out",
])
def test_value_only_accepts(prediction):
  assert code_check.value_only_problem(prediction) is None


def test_every_cruxeval_gold_output_is_a_value(shared_data):
  """All 800 CRUXEval gold outputs pass the value-only rule (only literals, lists, tuples, dicts, signs)."""
  rows = [json.loads(line) for line in shared_file("cruxeval/cruxeval.jsonl").open() if line.strip()]
  assert len(rows) == 800
  assert [(r["id"], r["output"]) for r in rows if code_check.value_only_problem(r["output"])] == []


def test_every_lcb_execution_gold_output_is_a_value():
  """On the fixture here; on the full file (479 rows) where the data directory has it."""
  items = benchmarks.load_benchmark("livecodebench_execution_o", FIXTURES)
  assert [i.output for i in items if code_check.value_only_problem(i.output)] == []
  path = shared_file(benchmarks.LCB_EXECUTION)
  rows = [json.loads(line) for line in path.open() if line.strip()]
  assert [(r["id"], r["output"]) for r in rows if code_check.value_only_problem(r["output"])] == []
