"""math-verify checking in spawned workers: equivalences, the oracle, corruption, hangs."""
import pathlib
import re
import time

import pytest

from compassplay_jax.evals import benchmarks
from compassplay_jax.evals import prompts
from compassplay_jax.evals.math_check import MathChecker

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "eval"
MATH_SETS = ["math500", "amc23", "gsm8k", "minerva_math", "olympiadbench", "aime24", "aime25"]


@pytest.fixture(scope="module")
def checker():
  with MathChecker(num_workers=2, timeout_s=3) as math_checker:
    yield math_checker


def _hang(gold, pred, timeout_s):  # A check that never returns (module-level: spawn pickles it by name).
  del gold, timeout_s
  if pred == "hang":
    time.sleep(3600)
  return pred == "ok"


def _as_completion(answer):
  return f"<think> work </think> <answer>\\boxed{{{answer}}}</answer>"


def _corrupted(golds):
  """For each gold, the next gold in the file with a different value (a realistic wrong answer)."""
  key = lambda a: re.sub(r"^[a-zA-Z]\s*=|\s", "", a)  # "x=5" states the value 5.
  out = []
  for i, gold in enumerate(golds):
    out.append(next(golds[(i + k) % len(golds)] for k in range(1, len(golds))
                    if key(golds[(i + k) % len(golds)]) != key(gold)))
  return out


@pytest.mark.parametrize("gold,pred,expected", [
    ("\\frac12", "0.5", True),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", True),
    ("27", "27.0", True),
    ("27", "28", False),
    ("[1, 2)", "[1,2)", True),
    ("(1, 2]", "[1, 2]", False),
    ("(-\\infty, 0) \\cup \\{1\\}", "(-\\infty,0)\\cup\\{1\\}", True),
    ("\\{1, 2, 3\\}", "\\{3, 2, 1\\}", True),
    ("\\{1, 2\\}", "\\{1, 3\\}", False),
    ("-2,2", "2,-2", True),
    ("5", "5 \\text{ cm}", True),
    ("45", "45 \\text{ minutes}", True),
    ("5", "6 \\text{ cm}", False),
    ("x^2+2x+1", "(x+1)^2", True),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
    ("10", "", False),
])
def test_equivalences(checker, gold, pred, expected):
  assert checker.check_batch([(gold, pred)]) == [expected]


def test_pool_survives_a_hang():
  with MathChecker(num_workers=1, timeout_s=0.5, check_fn=_hang) as math_checker:
    start = time.monotonic()
    verdicts = math_checker.verdicts([("1", "ok"), ("1", "hang"), ("1", "ok"), ("1", "no")])
    assert verdicts == ["correct", "timeout", "correct", "wrong"]
    assert math_checker.num_timeouts == 1
    assert time.monotonic() - start < 30
    assert math_checker.check_batch([("1", "ok")]) == [True]  # The replaced worker serves on.


@pytest.mark.parametrize("name", MATH_SETS)
def test_fixture_oracle_and_corruption(checker, name):
  golds = [item.answer for item in benchmarks.load_benchmark(name, FIXTURES)]
  oracle = [prompts.extract_math_answer(_as_completion(g)) for g in golds]
  assert checker.check_batch(list(zip(golds, oracle))) == [True] * len(golds)
  wrong = [prompts.extract_math_answer(_as_completion(g)) for g in _corrupted(golds)]
  assert checker.check_batch(list(zip(golds, wrong))) == [False] * len(golds)


def _each_distinct_pair_once(checker, pairs):
  """The checker's verdict for every pair, asking it once per distinct pair: a verdict is a function of
  the pair, and about half of the gold answers repeat (1,484 distinct of 2,866; GSM8K: 351 of 1,319)."""
  distinct = list(dict.fromkeys(pairs))
  verdict = dict(zip(distinct, checker.verdicts(distinct)))
  return [verdict[pair] for pair in pairs]


@pytest.mark.slow
def test_full_file_oracle_and_corruption(shared_data, checker):
  """Every gold answer of every math file verifies against itself; a different item's answer does not."""
  for name in MATH_SETS:
    golds = [item.answer for item in benchmarks.load_benchmark(name, shared_data)]
    oracle = [prompts.extract_math_answer(_as_completion(g)) for g in golds]
    verdicts = _each_distinct_pair_once(checker, list(zip(golds, oracle)))
    assert [g for g, v in zip(golds, verdicts) if v != "correct"] == [], name
    wrong = [prompts.extract_math_answer(_as_completion(g)) for g in _corrupted(golds)]
    verdicts = _each_distinct_pair_once(checker, list(zip(golds, wrong)))
    assert [(g, w) for g, w, v in zip(golds, wrong, verdicts) if v == "correct"] == [], name


def test_each_answer_is_parsed_once_per_worker():
  # An evaluation checks one gold against every sample of its problem: the gold is parsed once.
  from compassplay_jax.evals import math_check
  math_check._parsed.cache_clear()
  preds = ["\\frac{2}{4}", "0.5", "1/3", "0.5"]
  assert [math_check.check_math_answer("\\frac12", p) for p in preds] == [True, True, False, True]
  assert math_check._parsed.cache_info().misses == 4  # the gold and three distinct predictions
