"""CRUXEval and LiveCodeBench checking through the sandbox: oracle, corruption, and cheating attempts."""
import json
import pathlib

import numpy as np
import pytest

from compassplay_jax.evals import benchmarks
from compassplay_jax.evals import code_check

sandbox = pytest.importorskip("compassplay_jax.verifiers.sandbox", reason="sandbox not available")

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"
SOLUTIONS = json.loads((FIXTURES / "livecodebench_solutions.json").read_text())


@pytest.fixture(scope="module")
def pool():
  with sandbox.SandboxPool(num_workers=2) as sandbox_pool:
    yield sandbox_pool


def _correct(verdicts):
  return [v.correct for v in verdicts]


def _shifted(items, field):
  """Each item gets the `field` of the next item whose value differs (a realistic wrong answer)."""
  values = [getattr(i, field) for i in items]
  return [next(values[(k + s) % len(values)] for s in range(1, len(values))
               if values[(k + s) % len(values)] != values[k]) for k in range(len(values))]


def test_cruxeval_fixture_oracle_scores_100(pool):
  out = benchmarks.load_benchmark("cruxeval_o", FIXTURES)
  inp = benchmarks.load_benchmark("cruxeval_i", FIXTURES)
  assert _correct(code_check.check_cruxeval(out, [i.output for i in out], pool)) == [True] * len(out)
  assert _correct(code_check.check_cruxeval(inp, [i.input for i in inp], pool)) == [True] * len(inp)


def test_cruxeval_fixture_corruption_scores_0(pool):
  out = benchmarks.load_benchmark("cruxeval_o", FIXTURES)
  inp = benchmarks.load_benchmark("cruxeval_i", FIXTURES)
  assert _correct(code_check.check_cruxeval(out, _shifted(out, "output"), pool)) == [False] * len(out)
  assert _correct(code_check.check_cruxeval(inp, _shifted(inp, "input"), pool)) == [False] * len(inp)


def test_cruxeval_equality_is_type_strict(pool):
  item = benchmarks.load_benchmark("cruxeval_o", FIXTURES)[0]  # Gold output [3, 2, 1].
  attempts = {
      "(3, 2, 1)": False,  # Tuple is not list.
      "[3.0, 2, 1]": False,  # Float is not int.
      "[3, 2, True]": False,  # Bool is not int.
      "type('A', (), {'__eq__': lambda s, o: True, '__hash__': lambda s: 0})()": False,
      "type('L', (list,), {'__eq__': lambda s, o: True})([3, 2, 1])": False,  # List subclass.
      "[3, 2, 1]": True,
      "[3,2,1]": True,
  }
  verdicts = code_check.check_cruxeval([item] * len(attempts), list(attempts), pool)
  assert dict(zip(attempts, _correct(verdicts))) == attempts


def test_cruxeval_predictions_cannot_escape_the_check(pool):
  out = benchmarks.load_benchmark("cruxeval_o", FIXTURES)[0]
  inp = benchmarks.load_benchmark("cruxeval_i", FIXTURES)[0]
  attacks_o = ["0) or True or (0", "globals().update(__cp_strict_eq=lambda a, b: True) or 0",
               "1\n__cp_strict_eq = lambda a, b: True"]
  attacks_i = ["[1]) or True or f([1]", "[1]) == f([2]"]
  assert not any(_correct(code_check.check_cruxeval([out] * 3, attacks_o, pool)))
  assert not any(_correct(code_check.check_cruxeval([inp] * 2, attacks_i, pool)))


def test_gold_is_not_in_the_job_that_runs_the_answer(pool):
  """Issue 17: a prediction or program that reads the gold from its own job gets nothing (before,
  "eval(__cp_gold_src)" passed CRUXEval-O and a program could read the expected LCB output)."""
  out = benchmarks.load_benchmark("cruxeval_o", FIXTURES)[0]
  attacks = ["eval(__cp_gold_src)", "eval(__cp_src)",
             "[eval(v) for k, v in globals().items() if k.startswith('__cp') and type(v) is str][0]"]
  assert not any(_correct(code_check.check_cruxeval([out] * 3, attacks, pool)))
  items = benchmarks.load_benchmark("livecodebench_generation", FIXTURES)
  reader = ("import sys, json\nclass Solution:\n    def isPalindrome(self, word):\n"
            "        frame = sys._getframe(1)\n"
            "        texts = [v for v in frame.f_locals.values() if type(v) is str]\n"
            "        return json.loads(texts[-1])\n")
  assert _correct(code_check.check_livecodebench([items[3]], [reader], pool)) == [False]


def test_cruxeval_failures_say_why(pool):
  item = benchmarks.load_benchmark("cruxeval_i", FIXTURES)[0]
  verdicts = code_check.check_cruxeval([item] * 3, ["'a', 'b', 'c'", "[1]", "__import__('time').sleep(60)"],
                                       pool, timeout_s=1.0)
  assert verdicts[0].detail.startswith("error: TypeError")
  assert verdicts[1].detail == "wrong_answer"
  assert verdicts[2].detail == "timeout"
  none = code_check.check_cruxeval([benchmarks.load_benchmark("cruxeval_o", FIXTURES)[0]], [""], pool)
  assert none[0].detail == "no_answer"


def test_livecodebench_fixture_oracle_scores_100(pool):
  items = benchmarks.load_benchmark("livecodebench_generation", FIXTURES)
  programs = [SOLUTIONS[str(k)] for k in range(len(items))]
  verdicts = code_check.check_livecodebench(items, programs, pool)
  assert _correct(verdicts) == [True] * len(items), [v.detail for v in verdicts]


def test_livecodebench_wrong_programs_score_0(pool):
  items = benchmarks.load_benchmark("livecodebench_generation", FIXTURES)
  programs = [
      "n = int(input())\nprint(sum(map(int, input().split())) + 1)\n",  # Off by one.
      "print(input()[::-1])\n",  # Misses the second line.
      "class Solution:\n    def topK(self, nums, k):\n        return tuple(sorted(nums)[:k])\n",
      "class Solution:\n    def isPalindrome(self, word):\n        return 1\n",  # 1 is not true.
  ]
  verdicts = code_check.check_livecodebench(items, programs, pool)
  assert _correct(verdicts) == [False] * 4
  assert verdicts[0].detail.startswith("test 1/2")
  hang = code_check.check_livecodebench(items[:1], ["while True: pass\n"], pool, timeout_s=1.0)
  assert hang[0].detail == "test 1/2: timeout"


def test_livecodebench_functional_tuple_and_json_round_trip(pool):
  items = benchmarks.load_benchmark("livecodebench_generation", FIXTURES)
  as_tuple = "class Solution:\n    def topK(self, nums, k):\n        return tuple(sorted(nums, reverse=True)[:k])\n"
  cheat = ("class Solution:\n    def isPalindrome(self, word):\n"
           "        return type('T', (), {'__eq__': lambda s, o: True})()\n")
  verdicts = code_check.check_livecodebench([items[2], items[3]], [as_tuple, cheat], pool)
  assert _correct(verdicts) == [True, False]  # LiveCodeBench compares tuples as lists.


@pytest.mark.parametrize("got,expected,same", [
    ("6\n", "6\n", True), ("6   \n\n", "6", True), ("cba\r\n3\r\n", "cba\n3\n", True),
    ("0.50\n", "0.5\n", True), ("1 2\n", "1  2\n", True), ("1\n2\n", "1 2\n", False), ("7\n", "6\n", False),
])
def test_stdout_comparison(got, expected, same):
  assert code_check.stdout_matches(got, expected) is same


@pytest.mark.slow
def test_full_cruxeval_oracle_and_corruption(shared_data, pool):
  """All 800 gold outputs and inputs pass; shifted outputs fail; shifted inputs fail unless f maps
  them to the gold output too (abduction has many right answers), which a repr-based job confirms."""
  out = benchmarks.load_benchmark("cruxeval_o", shared_data)
  inp = benchmarks.load_benchmark("cruxeval_i", shared_data)
  wrong_inputs = _shifted(inp, "input")
  # The four checks in one call: check_cruxeval runs each distinct (program, gold output) job once per
  # call, and all four share the same 800 (4000 jobs instead of 6400).
  verdicts = code_check.check_cruxeval(out + inp + out + inp, [i.output for i in out] + [i.input for i in inp]
                                       + _shifted(out, "output") + wrong_inputs, pool)
  bounds = np.cumsum([0, len(out), len(inp), len(out), len(inp)])
  gold_o, gold_i, wrong_o, wrong_i = (verdicts[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
  assert [i.item_id for i, v in zip(out, gold_o) if not v.correct] == []
  assert [i.item_id for i, v in zip(inp, gold_i) if not v.correct] == []
  assert not any(_correct(wrong_o))
  passed = [k for k, v in enumerate(wrong_i) if v.correct]
  confirm = pool.run_batch([sandbox.Job(code=inp[k].code, expr=f"repr(f({wrong_inputs[k]})) == {inp[k].output!r}")
                            for k in passed])
  assert [inp[k].item_id for k, r in zip(passed, confirm) if r.value_repr != "True"] == []


# ---- LiveCodeBench-Execution: AZR's posing checked like CRUXEval-I, the `_o` variant like CRUXEval-O ----

def test_lcb_execution_fixture_oracle_and_corruption(pool):
  """Hand-made rows (outputs worked out by hand): the gold outputs pass, other rows' outputs fail; the
  AZR-prepared program (renamed f, imports added) called on the row's input gives its output."""
  out = benchmarks.load_benchmark("livecodebench_execution_o", FIXTURES)
  inp = benchmarks.load_benchmark("livecodebench_execution", FIXTURES)
  assert {i.kind for i in out} == {"cruxeval_o"} and {i.kind for i in inp} == {"cruxeval_i"}
  assert _correct(code_check.check_cruxeval(out, [i.output for i in out], pool)) == [True] * 4
  assert _correct(code_check.check_cruxeval(out, _shifted(out, "output"), pool)) == [False] * 4
  assert _correct(code_check.check_cruxeval(inp, [i.input for i in inp], pool)) == [True] * 4
  assert _correct(code_check.check_cruxeval(inp, _shifted(inp, "input"), pool)) == [False] * 4
  # Type-strict as CRUXEval-O: the count 2 is not 2.0 or True; the string 'a' is not the name a.
  attempts = {"2": True, "2.0": False, "True": False, "'2'": False}
  assert dict(zip(attempts, _correct(code_check.check_cruxeval([out[1]] * 4, list(attempts), pool)))) == attempts
  assert _correct(code_check.check_cruxeval([out[2]] * 2, ["'a'", "a"], pool)) == [True, False]


@pytest.mark.slow
def test_full_lcb_execution_oracle(shared_data, pool):
  """Every fetched row: its gold output passes -O, and the prepared program on its input gives the gold
  output (-I), so AZR's preparation (renaming, imports, typing names) kept every program's meaning."""
  from tests.conftest import shared_file
  shared_file(benchmarks.LCB_EXECUTION)
  out = benchmarks.load_benchmark("livecodebench_execution_o", shared_data)
  inp = benchmarks.load_benchmark("livecodebench_execution", shared_data)
  assert len(out) == len(inp) == 479
  assert [i.item_id for i, v in zip(out, code_check.check_cruxeval(out, [i.output for i in out], pool))
          if not v.correct] == []
  assert [i.item_id for i, v in zip(inp, code_check.check_cruxeval(inp, [i.input for i in inp], pool))
          if not v.correct] == []
  assert not any(_correct(code_check.check_cruxeval(out, _shifted(out, "output"), pool)))
