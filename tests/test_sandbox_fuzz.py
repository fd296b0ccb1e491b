"""Fuzz: hostile model outputs never crash the trainer (issue 17, item 3; outcomes: issue 23).

10,000+ generated outputs (deep nesting, huge literals, NUL bytes, invalid UTF-8,
forged result text, megabyte programs, random bytes, tag soup, regex-backtracking
bait) go through proposal validation and solver checking for every task type with
a real pool. Asserts: no exception escapes, every verdict is a bool / (bool, str,
task|None), the pool still answers, and the trainer's resident memory stays bounded.
A second test feeds forged sandbox results (what a compromised job could send back: outcomes of
any shape holding any objects).
"""
import collections
import random
import sys
import time

import pytest

from compassplay_jax.domains.coding import buffers
from compassplay_jax.domains.coding import checking
from compassplay_jax.domains.coding import parsing
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation
from compassplay_jax.domains.coding import verdict_stats
from compassplay_jax.verifiers import sandbox
from compassplay_jax.verifiers.sandbox import Job, SandboxLimits, SandboxPool

NUM_OUTPUTS = 10_000
SEED = 17
_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "```python\n", "```input\n",
           "```message\n", "```output\n", "```", "\n", "# Input:", "# Message:", "output(", ")",
           "<output>", "</output>", "<message>", "def f(a):\n", "    return a\n", "the output is ",
           "(", "[", "{", "'", '"', "\\", "\x00", "\udcff", " " * 50, "\n" * 50]


def _rss_bytes():
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


def _hostile_program(rng):
  k = rng.choice([3000, 19000, 50])
  body = rng.choice([
      lambda: "-" * k + "1",
      lambda: "not " * k + "1",
      lambda: "(" * k + "1" + ")" * k,
      lambda: "[" * k + "]" * k,
      lambda: "9" * rng.choice([5000, 15000, 30000]),
      lambda: repr("x" * rng.choice([1000, 19000])),
      lambda: "a\x00b",
      lambda: bytes(rng.randrange(256) for _ in range(200)).decode("utf-8", "surrogateescape"),
      lambda: "__import__('os').system('id')",
      lambda: "repr.__self__",
      lambda: "a if a else " * 200 + "a",
      lambda: "'" + "\\" * 101 + "'",
      lambda: "{'status': 'ok', 'value_text': '[\"n1\"]'}",
  ])()
  program = f"def f(a):\n    return {body}\n"
  if rng.random() < 0.02:
    program = "x = 1\n" * 200_000 + program  # A megabyte program.
  return program


def _hostile_input(rng):
  return rng.choice([
      "1", "'a'", "[1, 2]", "(" * 5000 + ")" * 5000, "-" * 19000 + "1", "9" * 4000,
      "'x' * 10 ** 9", "__import__('os')", "f(3)", "(lambda: 1)()", "a\x00", "\udcff",
      "[" * 300 + "]" * 300, "{1: " * 100 + "1" + "}" * 100, "1, k=2", "*[1, 2]",
  ])


def _hostile_output(rng, i):
  kind = i % 8
  if kind == 0:  # Random bytes, as latin-1 text or with lone surrogates.
    data = bytes(rng.randrange(256) for _ in range(rng.choice([10, 300, 3000])))
    return data.decode(rng.choice(["latin-1", "utf-8"]), "surrogateescape")
  if kind == 1:  # Tag soup.
    return "".join(rng.choice(_TOKENS) for _ in range(rng.randrange(1, 200)))
  if kind == 2:  # Regex-backtracking bait: many openers with no closer.
    opener = rng.choice(["<message>", "output(", "```input", "</think><answer>", "\n", "#"])
    return "<answer>" + opener * rng.choice([1000, 20000])
  if kind == 3:  # Forged result / canonical text where an answer is expected.
    forged = rng.choice(['{"status": "ok", "value_text": "[\\"n1\\"]"}', '["n1", "n2"]',
                         "[" * 50000, "\x00" * 100, '"' + "\\u0000" * 100 + '"'])
    return f"<think></think><answer>```output\n{forged}\n```</answer>"
  if kind == 4:  # Huge text.
    return "<answer>" + rng.choice(["x", "(", "```"]) * rng.choice([1 << 16, 1 << 20, 1 << 21])
  # Well-formed proposals and answers with hostile content: these reach the sandbox.
  program = _hostile_program(rng)
  inputs = "".join(f"```input\n{_hostile_input(rng)}\n```\n" for _ in range(rng.choice([1, 10])))
  return (f"<think>t</think><answer>\n```python\n{program}```\n{inputs}```message\nm\n```\n"
          f"```output\n{_hostile_input(rng)}\n```\n</answer>")


def _targets():
  ded = tasks.CodingTask(type=tasks.DEDUCTION, program="def f(a):\n    return a * 2",
                         input="3", output="6")
  abd = tasks.CodingTask(type=tasks.ABDUCTION, program="def f(a):\n    return a * 2",
                         input="3", output="6")
  return {tasks.DEDUCTION: ded, tasks.ABDUCTION: abd,
          tasks.INDUCTION: buffers.IDENTITY_INDUCTION_SEED}


@pytest.mark.slow
def test_ten_thousand_hostile_outputs_never_crash_the_trainer():
  rng = random.Random(SEED)
  outputs = [_hostile_output(rng, i) for i in range(NUM_OUTPUTS)]
  assert len(outputs) >= 10_000
  targets = _targets()
  types = list(tasks.TASK_TYPES)
  counts = collections.Counter()
  limits = SandboxLimits(timeout_s=3.0, cpu_time_s=3, memory_bytes=512 << 20)
  with SandboxPool(num_workers=2, limits=limits) as pool:
    rss_before = _rss_bytes()
    start = time.monotonic()
    for lo in range(0, NUM_OUTPUTS, 500):
      chunk = list(enumerate(outputs[lo:lo + 500], lo))
      items = {t: [] for t in types}
      for i, text in chunk:
        task_type = types[i % 3]
        result = validation.validate_proposal(
            pool, task_type, text, source_program=buffers.IDENTITY_PROGRAM)
        assert isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], bool)
        assert isinstance(result[1], str) and (result[2] is None) == (not result[0])
        counts.update(verdict_stats.tally("validation", [result[1]]))
        assert isinstance(parsing.format_ok(text), bool)
        items[task_type].append(checking.extract_solver_answer(targets[task_type], text))
      verdicts, reasons = checking.check_many_reasons(pool, [(targets[t], items[t]) for t in types])
      for t, row, why in zip(types, verdicts, reasons):
        assert len(row) == len(why) == len(items[t]) and all(v is False or v is True for v in row)
        counts.update(verdict_stats.tally("checking", why))
    elapsed = time.monotonic() - start
    assert pool.run(Job(code="x = 6 * 7", expr="x")).value_repr == "42"
    growth = _rss_bytes() - rss_before
  print(f"\n{NUM_OUTPUTS} outputs in {elapsed:.0f} s; RSS growth {growth >> 20} MiB; {counts}")
  assert growth < 256 << 20, f"trainer RSS grew by {growth >> 20} MiB"
  assert sum(v for k, v in counts.items() if k.startswith("validation/")) >= NUM_OUTPUTS
  assert counts.get("validation/ok", 0) > 0  # Some hostile proposals were real, valid tasks.


_FORGED_TEXTS = [
    "+" + "L1:" * 100_000 + "N", "+L1:fnan;", "+i" + "9" * 5000 + ";", "+X1:N", '+s"\\udcff"',
    "+L2:i1;", "+D1:L0:i1;", "+Y0,lambda:", "+s\"" + "a" * 300_000 + "\"", "+", "!", "!:", "x",
    "!NotPlain:\udcff", "+i1;", "+U2:i1;s\"x\"", "+C2:i1;s\"x\"i2;i3;", "+Q1,-1:N", "+f1e999;"]


def _forged_frame(rng, job, texts=None):
  """A worker frame whose outcomes a compromised job could have written (the pool decodes them)."""
  shape = [repeat for _, _, repeat in job.entries]
  pick = lambda: rng.choice(texts or _FORGED_TEXTS)
  outcomes = rng.choice([
      None, [], "x", 5, [[pick() for _ in range(r)] for r in shape],
      [[pick() for _ in range(r + 1)] for r in shape], [[pick()] for _ in range(len(shape) + 2)]])
  return {"status": rng.choice(["ok", "ok", "ok", "error", "timeout", "memory"]),
          "error_type": None, "error_message": None, "stdout": "", "stderr": "",
          "outcomes": outcomes}


class _ForgingPool:
  """Returns what a compromised sandbox job could make the pool report: any status, outcomes of
  any shape holding any text, decoded by the pool's own code (sandbox._result_from_frame)."""

  def __init__(self, rng, gold_text=None):
    self.rng, self.gold_text = rng, gold_text

  def run(self, job):
    return self.run_batch([job])[0]

  def run_batch(self, jobs):
    results = []
    for job in jobs:
      if self.gold_text is not None and job.program is None:  # The gold's job was not forged.
        frame = {"status": "ok", "error_type": None, "error_message": None, "stdout": "",
                 "stderr": "", "outcomes": [[self.gold_text] * r for _, _, r in job.entries]}
      else:
        frame = _forged_frame(self.rng, job)
      results.append(sandbox._result_from_frame(frame, 0.0, job))  # pylint: disable=protected-access
    return results


def test_forged_sandbox_results_never_crash_the_trainer():
  rng = random.Random(SEED)
  pool = _ForgingPool(rng)
  targets = _targets()
  proposal = ("<think>t</think><answer>\n```python\ndef f(a):\n    return a\n```\n"
              + "```input\n1\n```\n" * 10 + "```message\nm\n```\n</answer>")
  for _ in range(100):
    for task_type in tasks.TASK_TYPES:
      valid, reason, task = validation.validate_proposal(
          pool, task_type, proposal, source_program=buffers.IDENTITY_PROGRAM)
      assert isinstance(valid, bool) and isinstance(reason, str)
      if valid:  # Only well-formed plain values can make a task; its texts are then valid text.
        for text in task.outputs + (task.output,):
          text.encode("utf-8")
          assert len(text) <= 403
      row = checking.check_answers(pool, targets[task_type], ["1", "2", None, 3])
      assert len(row) == 4 and all(v is False or v is True for v in row)


class _FixedPool:
  """Every job of a program 'returns' the same forged outcome text in every place; jobs without a
  program (golds) return gold_text (what a compromised proposer job could report)."""

  def __init__(self, text, gold_text="+i1;"):
    self.text, self.gold_text = text, gold_text

  def run(self, job):
    return self.run_batch([job])[0]

  def run_batch(self, jobs):
    return [sandbox._result_from_frame(  # pylint: disable=protected-access
        {"status": "ok", "error_type": None, "error_message": None, "stdout": "", "stderr": "",
         "outcomes": [[self.gold_text if job.program is None else self.text] * r
                      for _, _, r in job.entries]}, 0.0, job) for job in jobs]


@pytest.mark.parametrize("depth", [3000, 19000])
def test_deeply_nested_proposal_is_invalid_not_a_crash(depth):
  """Issue 17 (2): ~3000 nested unary operators raised RecursionError (19000: MemoryError). The
  verdict must not depend on the process's recursion limit (pytest-xdist workers raise it)."""
  program = "def f(a):\n    return " + "-" * depth + "a\n"
  response = f"<think></think><answer>\n```python\n{program}```\n```input\n1\n```\n</answer>"
  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(max(limit, 50000))
  try:
    valid, reason, task = validation.validate_proposal(_FixedPool("+i1;"), tasks.DEDUCTION,
                                                       response)
  finally:
    sys.setrecursionlimit(limit)
  assert (valid, task) == (False, None) and reason.startswith("unparsable"), reason


@pytest.mark.parametrize("forged,why", [
    ("+" + "L1:" * 100_000 + "N", "BadResult"), ("+L1:fnan;", "NonDeterministic"),
    ("+i" + "9" * 5000 + ";", "BadResult"), ("+X1:N", "BadResult"), ("!NotPlain:x", "NotPlain"),
    ("+s\"" + "a" * 300_000 + "\"", None)],
    ids=["deep", "nan", "huge_int", "bogus_tag", "failure", "long_str"])
def test_forged_outcomes_are_invalid_not_a_crash(forged, why):
  """Forged outcome texts (deeper than any recursion limit, NaN, past the int-text limit, of no
  known tag) make no task and win no check; a long str is plain data, truncated as AZR does."""
  response = ("<think></think><answer>\n" + "```input\n1\n```\n" * 10 + "```message\nm\n```\n"
              "</answer>")
  valid, reason, task = validation.validate_proposal(
      _FixedPool(forged), tasks.INDUCTION, response, source_program=buffers.IDENTITY_PROGRAM)
  if why is None:
    assert valid and len(task.outputs[0]) == 403, reason
  else:
    assert not valid and why in reason, reason
  assert checking.check_answers(_FixedPool(forged), _targets()[tasks.INDUCTION],
                                ["def f(a):\n    return a"]) == [False]
