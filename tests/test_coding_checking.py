"""Validation of proposals and sandboxed answer checking, including tricks that must not win."""
import random

import pytest

from compassplay_jax.domains.coding import buffers, checking, tasks, validation
from compassplay_jax.verifiers.sandbox import SandboxLimits, SandboxPool


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(num_workers=2, limits=SandboxLimits(timeout_s=3.0, cpu_time_s=3)) as p:
    yield p


def proposal(code, args):
  return f" plan </think>\n<answer>\n```python\n{code}\n```\n```input\n{args}\n```\n</answer>"


@pytest.mark.parametrize("code,args,reason", [
    ("x = 1", "1", "no function"),
    ("def f(a):\n  def g(b):\n    return b\n  return g(a)", "1", "function definitions"),
    ("import random\ndef f(a):\n  return a", "1", "banned import"),
    ("from datetime import date\ndef f(a):\n  return a", "1", "banned import"),
    ("import os.path\ndef f(a):\n  return a", "1", "banned import"),
    ("def f(a):\n  return __import__('random').random()", "1", "dynamic import"),
    ("import importlib\ndef f(a):\n  return a", "1", "banned import"),
    ("def f(a):\n  return getattr(__builtins__, 'x')", "1", "dynamic import"),
    ("import builtins\ndef f(a):\n  return a", "1", "banned import"),
    ("def f(a):\n  return eval('1')", "1", "dynamic import"),
    ("def f(a):\n  return parse_input(a)", "1", "input("),
    ("def f(a):\n  return a +", "1", "syntax error"),
    ("def f(a):\n  return a", "__import__('os').getcwd()", "ValueRejected"),
    ("def f(a):\n  return a", "(1).__class__", "ValueRejected"),
    ("def f(a):\n  return a", "(x for x in []).gi_frame", "ValueRejected"),
    ("def f(a):\n  return 1 / 0", "1", "ZeroDivisionError"),
    ("def f(a):\n  return object()", "1", "NotPlain"),
    ("def f(a):\n  return float('nan')", "1", "NonDeterministic"),
    ("def f(a):\n  return open('/etc/passwd').read()", "1", "'open' is not available"),
    ("import typing\ndef f(a):\n  return typing.sys.maxsize", "1", "of module 'typing'"),
    ("def f(a):\n  l = [a]\n  l.append(l)\n  return l", "1", "SelfReference"),
    ("def f(a):\n  return [[a]] * 20000", "1", "TooLarge"),
    ("def f(a):\n  return 10 ** 5000", "1", "ValueError"),
    ("def f(a):\n  return f(a)", "1", "RecursionError"),
    ("def f(a):\n  return type('A', (), {'_' * 2 + 'eq' + '_' * 2: lambda s, o: True})()", "1",
     "NotPlain"),
    ("calls = []\ndef f(a):\n  calls.append(a)\n  return len(calls)", "1", "NonDeterministic"),
    ("def f(a):\n  while True:\n    pass", "1", "timeout"),
])
def test_invalid_proposals(pool, code, args, reason):
  valid, why, task = validation.validate_proposal(pool, tasks.DEDUCTION, proposal(code, args))
  assert not valid and task is None
  assert reason in why, why


def test_unparsable_proposals(pool):
  assert validation.validate_proposal(pool, tasks.DEDUCTION, "no answer")[:2] == (
      False, "no <answer> content")
  assert not validation.validate_proposal(pool, tasks.ABDUCTION, "<answer>```python\ndef f(a):"
                                          "\n  return a\n```</answer>")[0]
  with pytest.raises(ValueError, match="task_type"):
    validation.validate_proposal(pool, "other", "<answer>x</answer>")


def test_valid_proposal_renames_and_truncates(pool):
  valid, why, task = validation.validate_proposal(
      pool, tasks.ABDUCTION, proposal("import math\ndef g(s, n):\n  return (s * n, math.pi)",
                                      "'ab', 2"))
  assert valid, why
  assert task.program.startswith("import math\ndef f(s, n)") and task.imports == ("import math",)
  assert task.output == "('abab', 3.141592653589793)" and task.input == "'ab', 2"
  valid, _, task = validation.validate_proposal(pool, tasks.DEDUCTION,
                                                proposal("def f(n):\n  return 'x' * n", "1000"))
  assert valid and len(task.output) == 403 and task.output[200:203] == "..."
  # Inputs may be expressions (CRUXEval uses a few) and use plain globals of the program.
  valid, why, task = validation.validate_proposal(
      pool, tasks.DEDUCTION, proposal("data = [3, 1]\ndef f(x, k):\n  return sorted(x)[k]",
                                      "data[:], k=1"))
  assert valid and task.output == "3", why


def _deduction_task(pool, code, args):
  valid, why, task = validation.validate_proposal(pool, tasks.DEDUCTION, proposal(code, args))
  assert valid, why
  return task


def test_deduction_equality_semantics(pool):
  task = _deduction_task(pool, "def f(a):\n  return {'k': [a, 1.0], 's': {2, 1}}", "True")
  answers = ["{'s': {1, 2}, 'k': [1, 1]}", "{'k': [True, 1.0], 's': {1, 2}}",
             "{'k': (True, 1.0), 's': {1, 2}}", "{'k': [True, 1.0]}", "f(True)", "",
             "{'k': [True, 1.0], 's': {1, 2}} if True else 0"]
  assert checking.check_answers(pool, task, answers) == [True, True, False, False, False, False,
                                                         True]


def test_tricks_never_win(pool):
  task = _deduction_task(pool, "def f(a):\n  return a * 2", "21")
  tricks = [
      "type('A', (), {'__eq__': lambda s, o: True})()",
      "__import__('os')._exit(0)",
      "[x for x in ().__class__.__base__.__subclasses__()]",
      "(lambda: 0).__globals__",
      "exec('import os')",
      "'{0.__class__}'.format(1)",
      "42 if print('{\"status\": \"ok\"}') else 41",
  ]
  assert checking.check_answers(pool, task, tricks + ["42"]) == [False] * len(tricks) + [True]
  abd = tasks.CodingTask(type=tasks.ABDUCTION, program="def f(a):\n  return a", input="1",
                         output="1")
  assert checking.check_answers(pool, abd, ["type('A', (), {'__eq__': lambda s, o: True})()",
                                            "f", "1.0", "True", "'1'"]) == [False, False, True,
                                                                            True, False]


def test_induction_checks_hidden_pairs_only(pool):
  source = "def f(a):\n  return a * 2"
  response = ("</think><answer>" + "".join(f"```input\n{i}\n```\n" for i in range(10)) +
              "```message\ndouble it\n```</answer>")
  valid, why, task = validation.validate_proposal(pool, tasks.INDUCTION, response,
                                                  source_program=source)
  assert valid, why
  assert task.num_visible == 5 and task.hidden_pairs[0] == ("5", "10")
  answers = [
      "def f(a):\n  return a + a",
      "def f(a):\n  return {0: 0, 1: 2, 2: 4, 3: 6, 4: 8}[a]",  # Fits only the visible pairs.
      "class A:\n  def __eq__(self, o):\n    return True\ndef f(a):\n  return A()",
      "class S(int):\n  pass\ndef f(a):\n  return S(a * 2)",
      "import os\ndef f(a):\n  os.write(3, b'{\"status\": \"ok\", \"value_text\": \"[]\"}')\n"
      "  os._exit(0)",
      None,
  ]
  assert checking.check_answers(pool, task, answers) == [True, False, False, False, False, False]
  response_short = "</think><answer>```input\n1\n```\n```message\nm\n```</answer>"
  assert not validation.validate_proposal(pool, tasks.INDUCTION, response_short,
                                          source_program=source)[0]
  bad_inputs = ("</think><answer>" + "".join("```input\n'x'\n```\n" for _ in range(10)) +
                "```message\nm\n```</answer>")
  ok, why, _ = validation.validate_proposal(pool, tasks.INDUCTION, bad_inputs,
                                            source_program="def f(a):\n  return a / 2")
  assert not ok and "TypeError" in why


def test_solve_rate_and_responses(pool):
  task = _deduction_task(pool, "def f(a):\n  return a + 1", "1")
  responses = ["r</think><answer>```output\n2\n```</answer>",
               "r</think><answer>```output\n3\n```</answer>", "no answer", "<answer>2</answer>"]
  assert checking.check_responses(pool, task, responses) == [True, False, False, True]
  assert checking.solve_rate(pool, task, responses) == 0.5
  with pytest.raises(ValueError, match="solve_rate"):
    checking.solve_rate(pool, task, [])


def test_truncated_gold_matches_only_its_truncated_text(pool):
  # As in AZR (eval(gold) == eval(answer)): the true long value no longer matches; repeating the
  # truncated text (here still a valid str literal containing '...') does.
  task = _deduction_task(pool, "def f(n):\n  return 'x' * n", "1000")
  assert checking.check_answers(pool, task, ["'" + "x" * 1000 + "'", task.output]) == [False,
                                                                                       True]
  task = _deduction_task(pool, "def f(n):\n  return list(range(n))", "300")
  assert checking.check_answers(pool, task, ["list(range(300))", task.output]) == [False, False]


def test_buffers_seed_cap_and_sampling():
  bufs = buffers.seeded_buffers(cap=3)
  ded = bufs[tasks.DEDUCTION]
  assert len(ded) == 1 and next(iter(ded)).program == buffers.IDENTITY_PROGRAM
  assert bufs[tasks.INDUCTION].task_type == tasks.INDUCTION
  extra = [tasks.CodingTask(type=tasks.DEDUCTION, program=f"def f(a):\n  return {i}", input="1",
                            output=str(i)) for i in range(4)]
  assert [ded.add(t, step=1) for t in extra] == [True, True, False, False]  # Keeps the oldest.
  rng = random.Random(0)
  refs = ded.sample(6, rng)
  assert len(refs) == 3 and len({t.program for t in refs}) == 3
  batch = ded.solver_batch(5, rng, since_step=1)
  assert len(batch) == 5 and sum(t.program != buffers.IDENTITY_PROGRAM for t in batch[:2]) == 2
  newest = buffers.TaskBuffer(tasks.DEDUCTION, cap=2, keep="newest")
  for t in extra:
    newest.add(t)
  assert [t.output for t in newest] == ["2", "3"]
  assert buffers.sample_induction_program([ded, bufs[tasks.ABDUCTION]], rng)
  with pytest.raises(ValueError, match="keep"):
    buffers.TaskBuffer(tasks.DEDUCTION, keep="random")


def test_seed_tasks_check_in_the_sandbox(pool):
  seed = buffers.IDENTITY_INDUCTION_SEED
  assert checking.check_answers(pool, seed, ["def f(a):\n  return a", "def f(a):\n  return 1"]) == [
      True, False]
  assert checking.check_answers(pool, buffers.IDENTITY_SEED, ["'Hello world'", "'hello'"]) == [
      True, False]


def test_check_many_reasons_say_why_each_answer_failed(pool):
  """Verdict reasons come back with the verdicts (the step counts them; nothing is kept in a module)."""
  from compassplay_jax.domains.coding import verdict_stats
  task = tasks.CodingTask(type=tasks.DEDUCTION, program="def f(x):\n    return x * 2", input="3", output="6")
  verdicts, reasons = checking.check_many_reasons(pool, [(task, ["6", "7", None, "1/0"])])
  assert verdicts == [[True, False, False, False]]
  assert reasons[0][:3] == ["correct", "wrong", "no answer"] and reasons[0][3] != "correct"
  assert checking.check_many(pool, [(task, ["6", "7"])]) == [[True, False]]
  counts = verdict_stats.tally("checking", reasons[0])
  assert counts["checking/correct"] == 1 and counts["checking/no answer"] == 1 and sum(counts.values()) == 4
