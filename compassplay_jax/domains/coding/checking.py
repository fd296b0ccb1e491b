"""Judging solver answers: every value is computed in the sandbox, compared here as text.

Which answers are correct:
- deduction: the predicted output, a plain value expression (literals,
  arithmetic, comprehensions, a few pure builtins; no names of the program, so
  "f(...)" is not an answer), equals the gold output value (AZR's
  eval(gold) == eval(answer) for builtin data types: 1 == 1.0 == True, dict and
  set order ignored).
- abduction: the proposed argument list (same expression rules, plus plain-data
  globals of the program) makes f return a value equal to the gold output; it
  need not equal the proposer's input.
- induction: the solver's program (with the task's import lines prepended, as
  in AZR) returns, for every hidden input, a value equal to the hidden output.

Equality is decided in the trainer by comparing canonical texts (`values.canonical`) of plain
values the sandbox returned (never text a program wrote). The gold and each answer run in separate
jobs, so a job that runs an answer never holds the gold; every program runs under the restricted
runtime (allow-listed builtins and modules, no file, clock or introspection); values of
non-builtin types (always-equal __eq__, str subclasses, ...) have no encoding, and a gold output
that is not a plain value (e.g. a truncated repr) matches nothing. An induction answer must also
pass `static_rules` (the same rules as proposals), else it is wrong.

Model output never makes these functions raise: an answer that cannot be
parsed, run or read back is wrong, with its reason (`check_many_reasons`; the caller counts them).
"""
import ast
from typing import List, Sequence, Tuple

from compassplay_jax.domains.coding import jobs
from compassplay_jax.domains.coding import parsing
from compassplay_jax.domains.coding import static_rules
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import values

_FAILED = values.FAILED


def _canonical_texts(result, expected_len):
  """Canonical text of each outcome; failures become '!Reason' entries (never raises)."""
  if not result.ok or result.outcomes is None or len(result.outcomes) != expected_len:
    return [_FAILED + str(result.error_type or result.status)] * expected_len
  return [values.canonical(entry[0]) for entry in result.outcomes]


def _reason(texts) -> str:
  failed = [v for v in texts if v.startswith(_FAILED)]
  return "error: " + failed[0][1:40] if failed else "wrong"


def _gold_texts(task: tasks.CodingTask) -> List[str]:
  if task.type == tasks.INDUCTION:
    return [o for _, o in task.hidden_pairs]
  return [task.output]


def _unsafe_program(program: str):
  """Why an induction answer breaks the static rules (None when it does not)."""
  try:
    return static_rules.unsafe_reason(ast.parse(program))
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    return f"unparsable: {type(e).__name__}"


def _answer_job(task: tasks.CodingTask, answer: str):
  """(job, number of values) for one answer, or (None, reason) when it cannot run at all."""
  if task.type == tasks.DEDUCTION:
    return jobs.values_job([answer]), 1
  if task.type == tasks.ABDUCTION:
    return jobs.answer_call_job(task.program, answer), 1
  hidden = [i for i, _ in task.hidden_pairs]
  program = "\n".join(task.imports + (answer,))
  reason = _unsafe_program(program)
  if reason is not None:
    return None, reason
  return jobs.answer_calls_job(program, hidden), len(hidden)


def check_answers(pool, task: tasks.CodingTask, answers: Sequence[str]) -> List[bool]:
  """Per-answer correctness for already-extracted answer texts, in one pool batch.

  Answers are what `parsing.parse_solver_output/input/program` return; None
  (unparsable) is wrong. Identical answers share one sandbox run.
  """
  return check_many(pool, [(task, answers)])[0]


def check_many(pool, items: Sequence[Tuple[tasks.CodingTask, Sequence[str]]]) -> List[List[bool]]:
  """check_answers for many (task, answers) pairs in a single pool batch.

  Answers that are not str, are longer than parsing.MAX_RESPONSE_CHARS, or fail in
  any way are wrong; the gold and each answer run in separate jobs, and only
  their canonical texts are compared here.
  """
  return check_many_reasons(pool, items)[0]


def check_many_reasons(pool, items: Sequence[Tuple[tasks.CodingTask, Sequence[str]]]):
  """(verdicts, reasons): check_many's verdicts and, per answer, why ("correct", "wrong",
  "error: ...", "no answer", "unsafe program: ..."; verdict_stats.tally counts them)."""
  batch, plan = [], []
  for task, answers in items:
    gold_texts = _gold_texts(task)
    answers = list(answers)
    unique = sorted({a for a in answers
                     if isinstance(a, str) and len(a) <= parsing.MAX_RESPONSE_CHARS})
    entry = {"gold": (len(batch), len(gold_texts)), "answers": {}, "refused": {}}
    batch.append(jobs.values_job(gold_texts))
    for answer in unique:
      job, size = _answer_job(task, answer)
      if job is None:
        entry["refused"][answer] = size
        continue
      entry["answers"][answer] = (len(batch), size)
      batch.append(job)
    plan.append((answers, entry))
  results = pool.run_batch(batch)
  verdicts, reasons = [], []
  for (answers, entry) in plan:
    index, size = entry["gold"]
    gold = _canonical_texts(results[index], size)
    verdict, why = {}, {}
    for answer, reason in entry["refused"].items():
      verdict[answer] = False
      why[answer] = f"unsafe program: {reason}"
    for answer, (index, size) in entry["answers"].items():
      texts = _canonical_texts(results[index], size)
      verdict[answer] = bool(gold) and all(
          not g.startswith(_FAILED) and g == v for g, v in zip(gold, texts))
      why[answer] = "correct" if verdict[answer] else _reason(texts)
    known = [isinstance(a, str) and a in verdict for a in answers]
    verdicts.append([verdict[a] if ok else False for a, ok in zip(answers, known)])
    reasons.append([why[a] if ok else "no answer" for a, ok in zip(answers, known)])
  return verdicts, reasons


def extract_solver_answer(task: tasks.CodingTask, response: str):
  """The answer text from a full solver response (after '<think>'); None when absent."""
  try:
    return _extract_solver_answer(task, response)
  except Exception:  # pylint: disable=broad-except  (parsing is total; this is a backstop; counted as no answer)
    return None


def _extract_solver_answer(task, response):
  answer = parsing.extract_answer(response)
  if not answer:
    return None
  if task.type == tasks.DEDUCTION:
    return parsing.parse_solver_output(answer)
  if task.type == tasks.ABDUCTION:
    return parsing.parse_solver_input(answer)
  return parsing.parse_solver_program(answer)


def check_responses(pool, task: tasks.CodingTask, responses: Sequence[str]) -> List[bool]:
  """check_answers on raw solver responses (format is not required, as in AZR's estimate)."""
  return check_answers(pool, task, [extract_solver_answer(task, r) for r in responses])


def solve_rate(pool, task: tasks.CodingTask, responses: Sequence[str]) -> float:
  """Fraction of n solver responses judged correct (AZR's learnability estimate, n = 8)."""
  if not responses:
    raise ValueError("solve_rate needs at least one response")
  correct = check_responses(pool, task, responses)
  return sum(correct) / len(correct)
