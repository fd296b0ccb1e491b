"""Issue 23: verdicts a program cannot forge. One test per attack class, written as an attacker would.

Each attack fails on commit 73bfe6e (the sandbox before issue 23) and is stopped now:
1. the result channel: a program writes its own result frame (built-in `open`, `/proc/self/fd`,
   closing and reopening the descriptor), forging the gold, an oversized gold or a gold with a lone
   surrogate (which crashed tokenization);
2. reach through attributes: a module imported by an allowed one (`dataclasses.inspect`,
   `typing.sys`) leads to the stack; the program swaps the harness's encoder, so the recorded gold or
   every abduction verdict is the program's choice;
3. shared metadata: a job marks read-only files (access times) and a later job of another task
   reads the marks (an induction solver recovers the hidden outputs).
The oracle is the plain arithmetic of each program (f(1) == 2 ...), written here by hand.
"""
import os
import pathlib
import secrets
import shutil
import textwrap

import pytest
import tokenizers

from compassplay_jax.domains.coding import checking
from compassplay_jax.domains.coding import prompts
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation
from compassplay_jax.verifiers.sandbox import Job, SandboxLimits, SandboxPool

LIMITS = SandboxLimits(timeout_s=8.0, cpu_time_s=8)


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(num_workers=2, limits=LIMITS) as p:
    yield p


@pytest.fixture(scope="module")
def tokenizer():
  """A real (tiny) tokenizer: it raises TypeError on text holding a lone surrogate, as the
  trainer's does."""
  return tokenizers.Tokenizer(tokenizers.models.BPE())


def _proposal(program, args):
  return (f"<think>x</think><answer>\n```python\n{program}\n```\n```input\n{args}\n```\n"
          "</answer>")


def _validate(pool, program, args, task_type=tasks.DEDUCTION):
  return validation.validate_proposal(pool, task_type, _proposal(program, args))


def _assert_gold_is_true_or_invalid(outcome, expected, tokenizer):
  """The recorded gold is what f returns (repr, AZR truncation) or the task is invalid."""
  valid, reason, task = outcome
  if not valid:
    assert task is None
    return
  assert task.output == expected, (reason, task.output[:80], len(task.output))
  assert len(task.output) <= 403
  task.output.encode("utf-8")  # No lone surrogates.
  tokenizer.encode(prompts.solver_prompt(task))


# ---------------------------------------------------------------------------------------------
# 1. The result channel.

def _forge_with_open(value_expr, how):
  """A program that passes the static rules of 73bfe6e, writes its own result frame (value_text =
  eval(value_expr)), then points the result descriptor at /dev/null so that the harness's own frame
  is lost."""
  opener = {"fd": "3", "proc": "'/proc/self/fd/3'"}[how]
  close_fd3 = "open(3, 'w').close()\n" if how == "proc" else ""
  return (textwrap.dedent(f"""\
      import json
      def f(a):
          return a + 1
      t = {value_expr}
      w = open({opener}, 'w')
      w.write(json.dumps({{'status': 'ok', 'value_repr': repr(t), 'value_text': t,
                          'error_type': None, 'error_message': None}}))
      w.close()
      """) + close_fd3 + "sink = open('/dev/null', 'w')\n")


@pytest.mark.parametrize("how", ["fd", "proc"])
def test_forged_gold_through_the_result_channel(pool, tokenizer, how):
  """f(1) returns 2; the forged frame says '999'. The gold must be '2', and '999' judged wrong."""
  outcome = _validate(pool, _forge_with_open("'999'", how), "1")
  _assert_gold_is_true_or_invalid(outcome, "2", tokenizer)
  valid, _, task = outcome
  if valid:
    assert checking.check_answers(pool, task, ["999", "2"]) == [False, True]


@pytest.mark.parametrize("value_expr", ["'9' * 100002", "chr(0xdcff)", "'a' + chr(0xd800) + 'b'"])
def test_oversized_and_invalid_text_gold_is_never_recorded(pool, tokenizer, value_expr):
  """The channel forged a 100,002-char gold and a gold holding a lone surrogate; the latter
  crashed the training step when the solver prompt was tokenized."""
  outcome = _validate(pool, _forge_with_open(value_expr, "fd"), "1")
  _assert_gold_is_true_or_invalid(outcome, "2", tokenizer)


def test_abduction_verdicts_cannot_be_forged_through_the_channel(pool):
  """The proposer's program runs in every abduction answer job: it writes 'correct' for any answer."""
  program = _forge_with_open("'[\"n42\"]'", "fd").replace("return a + 1", "return a * 2")
  task = tasks.CodingTask(type=tasks.ABDUCTION, program=program, input="21", output="42")
  assert checking.check_answers(pool, task, ["1", "2", "'x'", "[]"]) == [False] * 4


# ---------------------------------------------------------------------------------------------
# 2. Reach through attributes: a banned module as an attribute of an allowed one.

_SWAP_IN_HARNESS = textwrap.dedent("""\
    import dataclasses
    def f(a):
        return a + 1
    insp = dataclasses.inspect
    for info in insp.stack():
        scope = insp.getargvalues(info.frame).locals
        for name in list(scope):
            if name.startswith('{prefix}') and '{needle}' in name:
                scope[name] = {replacement}
    """)


def test_stack_swap_of_the_gold_encoder(pool, tokenizer):
  """dataclasses.inspect.stack() finds the harness's namespace and replaces its truncation."""
  program = _SWAP_IN_HARNESS.format(prefix="_cp", needle="truncate",
                                    replacement="lambda *a, **k: '999'")
  _assert_gold_is_true_or_invalid(_validate(pool, program, "1"), "2", tokenizer)


def test_stack_swap_of_the_answer_encoder_accepts_nothing(pool):
  """The proposer program swaps the canonical encoder in every answer job: on 73bfe6e every
  abduction answer was judged correct (4 of 4 wrong answers)."""
  program = _SWAP_IN_HARNESS.format(prefix="_cp", needle="canon",
                                    replacement="lambda *a, **k: 'n42'").replace(
                                        "return a + 1", "return a * 2")
  task = tasks.CodingTask(type=tasks.ABDUCTION, program=program, input="21", output="42")
  assert checking.check_answers(pool, task, ["1", "2", "'x'", "[]"]) == [False] * 4
  valid, _, task = _validate(pool, program, "21", tasks.ABDUCTION)
  if valid:
    assert checking.check_answers(pool, task, ["1", "2", "'x'", "[]", "21"]) == [False] * 4 + [True]


ATTRIBUTE_CHAINS = [
    # A banned module as an attribute of an allowed one.
    "import dataclasses\ndef f(a):\n    return dataclasses.inspect.stack()[0].frame",
    "import typing\ndef f(a):\n    return typing.sys.getrecursionlimit()",
    "import enum\ndef f(a):\n    return enum.sys.maxsize",
    "import statistics\ndef f(a):\n    return statistics.sys.maxsize",
    "import fractions\ndef f(a):\n    return fractions.sys.maxsize",
    "import typing\ndef f(a):\n    return typing.functools.reduce",
    "import textwrap\ndef f(a):\n    return textwrap.re.compile('x')",
    "import json\ndef f(a):\n    return json.decoder.scanstring('\"x\"', 1)",
    "import dataclasses\ndef f(a):\n    m = dataclasses\n    return m.sys.modules",
    # Introspection of frames and code by other paths.
    "import dataclasses\ndef f(a):\n    return dataclasses.inspect.getmembers(f)",
    "import typing\ndef f(a):\n    typing.sys.settrace(lambda *x: None)\n    return a",
    "def f(a):\n    g = (x for x in [a])\n    return [g][0].gi_frame",
    "def f(a):\n    match f:\n        case object(__class__=b):\n            return b",
    "def f(a):\n    return open('/proc/self/mem', 'rb')",
    "def f(a):\n    return repr(print.__self__)",
]


@pytest.mark.parametrize("program", ATTRIBUTE_CHAINS)
def test_attribute_chains_make_no_valid_task(pool, program):
  """Each program reaches a module, frame, file or builtin outside the allow-list: it is refused
  (static rules) or fails where it reaches (restricted runtime), never a task."""
  valid, reason, task = _validate(pool, program, "1")
  assert not valid and task is None, (program, task and task.output)


# ---------------------------------------------------------------------------------------------
# 3. Shared state through file metadata.

@pytest.fixture(scope="module")
def marked_files(pool):
  """Files outside every hidden path whose access time a read would update (atime < mtime)."""
  if os.geteuid() != 0 or pool.isolation_report.get("filesystem", "").startswith("host"):
    pytest.skip("no mount namespace for the sandbox here (not root): the pool reports it degraded")
  base = pathlib.Path("/srv") / f"cp_meta_{os.getpid()}_{secrets.token_hex(4)}"
  base.mkdir(parents=True)
  os.chmod(base, 0o755)
  paths = []
  for a in range(10):
    for v in range(16):
      p = base / f"{a}_{v}"
      p.write_text("x")
      os.chmod(p, 0o644)
      st = p.stat()
      os.utime(p, (st.st_mtime - 1000, st.st_mtime))
      paths.append(p)
  yield base
  shutil.rmtree(base, ignore_errors=True)


def _reset_atimes(base):
  for p in base.iterdir():
    st = p.stat()
    os.utime(p, (st.st_mtime - 1000, st.st_mtime))


def test_reads_leave_no_marks_for_later_jobs(pool, marked_files):
  """Job A reads chosen files; job B (any worker, later) looks for changed access times."""
  _reset_atimes(marked_files)
  chosen = [str(marked_files / f"3_{v}") for v in (1, 4, 9)]
  read = pool.run(Job(code=f"for p in {chosen!r}:\n    open(p).read()"))
  assert read.ok, read
  look = Job(code=textwrap.dedent(f"""\
      import os
      marked = sorted(p for p in os.listdir({str(marked_files)!r})
                      if os.stat(os.path.join({str(marked_files)!r}, p)).st_atime
                      > os.stat(os.path.join({str(marked_files)!r}, p)).st_mtime)
      """), expr="marked")
  for r in pool.run_batch([look, look]):  # Both workers.
    assert r.ok and r.value_repr == "[]", r
  host = sorted(p.name for p in marked_files.iterdir() if p.stat().st_atime > p.stat().st_mtime)
  assert host == [], host  # Nothing on the host either.


def _marking_program(base):
  return textwrap.dedent(f"""\
      def f(a):
          v = (a * 7 + 3) % 16
          try:
              with open('{base}/%d_%d' % (a, v)) as fh:
                  fh.read()
          except OSError:
              pass
          return v
      """)


def _reading_solver(base):
  return textwrap.dedent(f"""\
      import os
      def f(a):
          for v in range(16):
              st = os.stat('{base}/%d_%d' % (a, v))
              if st.st_atime > st.st_mtime:
                  return v
          return -1
      """)


def test_induction_hidden_outputs_do_not_leak_through_metadata(pool, marked_files):
  """The proposer's program marks one file per (input, output) while its gold outputs are computed;
  the solver's program reads the marks. On 73bfe6e it recovered all hidden pairs."""
  _reset_atimes(marked_files)
  response = ("<think>x</think><answer>" + "".join(f"```input\n{i}\n```\n" for i in range(10))
              + "```message\nm\n```</answer>")
  valid, reason, task = validation.validate_proposal(
      pool, tasks.INDUCTION, response, source_program=_marking_program(marked_files))
  if not valid:
    # The marking program is refused; mark with an unrestricted job instead, as a proposer that
    # had found a way to read files would, and check the solver side alone.
    marks = [f"{marked_files}/{a}_{(a * 7 + 3) % 16}" for a in range(10)]
    assert pool.run(Job(code=f"for p in {marks!r}:\n    open(p).read()")).ok
    task = tasks.CodingTask(type=tasks.INDUCTION, program="def f(a):\n    return (a * 7 + 3) % 16",
                            inputs=tuple(str(i) for i in range(10)),
                            outputs=tuple(str((i * 7 + 3) % 16) for i in range(10)), message="m",
                            num_visible=5)
  else:
    assert task.outputs == tuple(str((i * 7 + 3) % 16) for i in range(10)), reason
  assert checking.check_answers(pool, task, [_reading_solver(marked_files)]) == [False]


def test_jobs_see_a_read_only_reduced_host(pool, marked_files):
  """Nothing a job can reach changes, and no host-wide kernel view is there: /proc and /sys are
  empty, /dev holds five devices, a world-writable file outside the job's tmpfs cannot be written
  or touched (on 73bfe6e it could: a channel to every later job)."""
  shared = marked_files / "world_writable"
  shared.write_text("0")
  os.chmod(shared, 0o666)
  r = pool.run(Job(code=textwrap.dedent(f"""\
      import os
      seen = {{'proc': os.listdir('/proc'), 'sys': os.listdir('/sys'),
              'dev': sorted(os.listdir('/dev'))}}
      for name, act in (('write', lambda: open({str(shared)!r}, 'w').write('1')),
                        ('utime', lambda: os.utime({str(shared)!r}, (0, 0))),
                        ('var_tmp', lambda: open('/var/tmp/x', 'w').write('1'))):
          try:
              act()
              seen[name] = 'done'
          except OSError as e:
              seen[name] = e.errno
      """), expr="seen"))
  assert r.ok, r
  import errno  # pylint: disable=import-outside-toplevel
  assert eval(r.value_repr) == {  # Test-only eval of our own job's dict of lists and ints.
      "proc": [], "sys": [], "dev": ["full", "null", "random", "shm", "urandom", "zero"],
      "write": errno.EROFS, "utime": errno.EROFS, "var_tmp": errno.EROFS}, r.value_repr
  assert shared.read_text() == "0"
