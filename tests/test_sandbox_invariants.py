"""Issue 46: docs/sandbox.md's invariants, tried through every path that reads an attribute by a
name held in text.

Invariant 2 says there is no path from an allowed object to the harness's frames or locals, and no
way to read an attribute by a computed name (the underscore rule is the complete barrier). Each
test below is one path, written as an attacker would: the name is built at run time, so the
static rules never see it. Where the sandbox before issue 46 was weak, the program reaches what it
wants (the job key in the harness frame, a frame, a dunder attribute) and returns it; the test
asserts that it cannot. All programs run in one batch on one pool (a few seconds).
"""
import ast
import subprocess
import sys
import textwrap

import pytest

from compassplay_jax.verifiers import sandbox_rules
from compassplay_jax.verifiers import sandbox_values
from compassplay_jax.verifiers.sandbox import CallJob, Failure, SandboxLimits, SandboxPool

LIMITS = SandboxLimits(timeout_s=8.0, cpu_time_s=8)

# Helpers every hostile program uses: a dunder built at run time (never in the source), a caught
# exception (its traceback leads to the harness's frames), a running generator.
_PRELUDE = textwrap.dedent("""\
    D = '_' + '_'
    def dunder(name):
        return D + name + D
    def caught():
        try:
            1 / 0
        except ZeroDivisionError as e:
            return e
    """)

# name -> program (defines f(a); called once as f(0)). Each returns what it reached, or fails.
ATTACKS = {
    # str.format walks attributes and items: traceback -> frame -> the harness's locals (key).
    "format_walk_to_job_key": """
        def f(a):
            path = '0.' + dunder('traceback') + '.tb_frame' + '.f_back' * 4 + '.f_locals[key]'
            return ('{' + path + '}').format(caught())
        """,
    # A running generator formats its own frame's caller chain.
    "format_generator_frame": """
        def gen():
            yield ('{0.gi' + '_frame.f_back.f_back.f_locals}').format(g)
        def f(a):
            global g
            g = gen()
            return next(g)
        """,
    # format_map with a mapping of the program's choice.
    "format_map_custom_mapping": """
        import collections
        def f(a):
            m = collections.ChainMap({}, {'e': caught()})
            return ('{e.' + dunder('traceback') + '.tb_frame.f_back.f_locals}').format_map(m)
        """,
    # A field nested in a format spec: its text comes back in the ValueError's message.
    "format_nested_spec_field": """
        def f(a):
            spec = '{1.' + dunder('traceback') + '.tb_frame.f_back.f_locals}'
            try:
                return ('{0:' + spec + '}').format(0, caught())
            except ValueError as e:
                return str(e)
        """,
    # Unbound str.format, a str subclass, super(), and the method passed around through map.
    "format_unbound_and_subclass": """
        class S(str):
            def walk(self, x):
                return super().format(x)
        def f(a):
            text = '{0.' + dunder('class') + '}'
            return [str.format(text, 1), type(text).format(text, 2), S(text).walk(3),
                    list(map(str.format, [text], [4]))]
        """,
    # An item key with a dunder name (items are not attributes, but the rule covers every name).
    "format_dunder_item_key": """
        def f(a):
            return ('{0[' + dunder('class') + ']}').format({dunder('class'): 'reached'})
        """,
    # hasattr by a computed name: the underscore and frame rules apply.
    "hasattr_computed_names": """
        def gen():
            yield 1
        def f(a):
            return [hasattr(a, dunder('class')), hasattr(gen(), 'gi' + '_frame'),
                    hasattr(caught(), dunder('traceback'))]
        """,
    # copy + a class made at run time with __slotnames__: copy reads the named attributes (here
    # str.format of an unchecked string) and hands them to __setstate__.
    "copy_slotnames_reads_attributes": """
        import copy
        def f(a):
            got = []
            S = type('S', (str,), {dunder('slotnames'): ['format'],
                                   dunder('setstate'): lambda self, state: got.append(state)})
            copy.copy(S('{0.' + dunder('traceback') + '.tb_frame.f_back.f_locals}'))
            return got[0][1]['format'](caught())
        """,
    # copy + __reduce_ex__: copy writes attributes by name (a function's defaults here).
    "copy_reduce_writes_attributes": """
        import copy
        def g(x=1):
            return x
        def f(a):
            C = type('C', (), {dunder('reduce_ex'): lambda self, proto: (
                lambda: g, (), (None, {dunder('defaults'): (666,)}))})
            copy.copy(C())
            return g()
        """,
}

# What the same tries must still do: no attribute read, or a harmless one.
HARMLESS = {
    # format() with a spec, and f-string specs built at run time: a spec names no attribute.
    "format_builtin_spec": """
        def gen():
            yield 1
        def f(a):
            spec = '{0.gi' + '_frame}'
            out = []
            for thunk in (lambda: format(gen(), spec), lambda: f'{a:{spec}}'):
                try:
                    out.append(thunk())
                except TypeError:
                    out.append('TypeError')
                except ValueError:
                    out.append('ValueError')
            return out
        """,
    # '%' with mapping keys reads items only (what m[k] does).
    "percent_mapping_keys": """
        def f(a):
            return ('%(' + dunder('class') + ')s|%(x)d') % {dunder('class'): 'item', 'x': 7}
        """,
}

ORDINARY = {
    "def f(a):\n    return '{}-{:>4}-{name}'.format(a, 7, name='n')": "0-   7-n",
    "def f(a):\n    return '{0[1]}{0[0]}|{d[k]}'.format('xy', d={'k': 3})": "yx|3",
    "def f(a):\n    return '{:{w}.{p}f}'.format(3.14159, w=8, p=2)": "    3.14",
    "def f(a):\n    return '{x}+{y}'.format_map({'x': 1, 'y': 2})": "1+2",
    "def f(a):\n    fmt = '<{}>'.format\n    return list(map(fmt, [1, 2]))": ["<1>", "<2>"],
    "def f(a):\n    return [str.format('{}!', a), f'{a:03d}|{a!r}', '%d%%|%s' % (5, 'z')]":
        ["0!", "000|0", "5%|z"],
    "import copy, collections\nP = collections.namedtuple('P', 'x y')\nclass Box:\n    pass\n"
    "def f(a):\n    data = [P(1, [2]), {'k': (3, [4])}, collections.deque([5])]\n"
    "    b = copy.deepcopy(data)\n    b[1]['k'][1].append(9)\n"
    "    return [data == copy.copy(data), b[1], type(copy.deepcopy(Box())) is Box]":
        [True, {"k": (3, [4, 9])}, True],
    "def f(a):\n    return [hasattr([], 'append'), hasattr(a, 'nope'), hasattr(a, 'real')]":
        [True, False, True],
}


def _program(body):
  return _PRELUDE + textwrap.dedent(body)


@pytest.fixture(scope="module")
def outcomes():
  """name -> (status, error_type, first outcome) for every program above, in one batch."""
  programs = {name: _program(body) for name, body in {**ATTACKS, **HARMLESS}.items()}
  programs.update({f"ordinary {i}": p for i, p in enumerate(ORDINARY)})
  with SandboxPool(num_workers=2, limits=LIMITS) as pool:
    results = pool.run_batch([CallJob(program=p, entries=(("call", "0", 1),))
                              for p in programs.values()])
  found = {}
  for name, r in zip(programs, results):
    first = r.outcomes[0][0] if r.status == "ok" and r.outcomes else None
    if first is not None and not isinstance(first, Failure):
      first = sandbox_values.python_value(first)
    found[name] = (r.status, r.error_type, first)
  return found


def _refused(outcome, error_type):
  """The attempt ended in the given error (raised in f, or the program rejected)."""
  status, job_error, first = outcome
  if status == "error":
    return job_error == error_type
  return isinstance(first, Failure) and first.error_type == error_type


@pytest.mark.parametrize("name", ["format_walk_to_job_key", "format_generator_frame",
                                  "format_map_custom_mapping", "format_unbound_and_subclass",
                                  "format_dunder_item_key"])
def test_format_fields_read_no_attribute_and_no_dunder(outcomes, name):
  assert _refused(outcomes[name], "ValueError"), outcomes[name]


def test_format_spec_fields_are_checked_too(outcomes):
  status, _, text = outcomes["format_nested_spec_field"]
  assert status == "ok" and "not allowed" in text and "key" not in text, text


def test_hasattr_applies_the_underscore_and_frame_rules(outcomes):
  assert outcomes["hasattr_computed_names"] == ("ok", None, [False, False, False])


@pytest.mark.parametrize("name", ["copy_slotnames_reads_attributes",
                                  "copy_reduce_writes_attributes"])
def test_copy_does_not_read_or_write_attributes_named_at_run_time(outcomes, name):
  assert _refused(outcomes[name], "TypeError"), outcomes[name]


def test_format_builtin_and_percent_read_no_attributes(outcomes):
  assert outcomes["format_builtin_spec"] == ("ok", None, ["TypeError", "ValueError"])
  assert outcomes["percent_mapping_keys"] == ("ok", None, "item|7")


def test_ordinary_formatting_copy_and_hasattr_keep_working(outcomes):
  for i, expected in enumerate(ORDINARY.values()):
    assert outcomes[f"ordinary {i}"] == ("ok", None, expected), (i, outcomes[f"ordinary {i}"])


def test_frame_and_code_attributes_are_refused_whatever_the_name():
  """The job process's audit hook: every attribute read CPython audits (the ways to a frame or a
  code object) raises, however the name reached it (getattr, attrgetter, str.format)."""
  script = textwrap.dedent("""\
      import operator, sys
      import sandbox_runtime
      sys.addaudithook(sandbox_runtime._refuse_internals)
      def gen():
          yield 1
      try:
          1 / 0
      except ZeroDivisionError as e:
          tb = e.__traceback__
      tries = [lambda: getattr(gen(), 'gi_' + 'frame'), lambda: operator.attrgetter('tb_frame')(tb),
               lambda: '{0.tb_frame}'.format(tb), lambda: getattr(lambda: 0, '__code__'),
               lambda: sys._current_frames()]
      for attempt in tries:
          try:
              attempt()
              print('reached')
          except (AttributeError, RuntimeError):
              print('refused')
      """)
  path = sandbox_rules.__file__.rsplit("/", 1)[0]
  out = subprocess.run([sys.executable, "-S", "-c", script], cwd=path, capture_output=True,
                       text=True, timeout=60, check=False)
  assert out.stdout.split() == ["refused"] * 5, (out.stdout, out.stderr[-2000:])


@pytest.mark.parametrize("text", [
    "'{0.gi_frame.f_back}'.format(a)", "'{0.tb_frame}'.format(a)", "'{0[_x]}'.format(a)",
    "'{0.__class__}'.format(a)", "'{x.f_locals}'.format_map(a)"])
def test_literal_format_fields_to_internals_are_rejected_statically(text):
  assert sandbox_rules.program_reason(ast.parse(f"def f(a):\n    return {text}\n"))


@pytest.mark.parametrize("source", [
    "from string import Template", "from string import Formatter", "import string\nstring.Formatter",
    "import logging", "import inspect", "from operator import attrgetter",
    "from operator import methodcaller", "import dataclasses", "getattr(1, 'real')", "vars(1)",
    "dir(1)", "type(1).__getattribute__", "import sys"])
def test_other_name_readers_are_not_available(source):
  assert sandbox_rules.program_reason(ast.parse(source))


def test_format_reason():
  reason = sandbox_rules.format_reason
  for ok in ["", "{}", "{0}{1!r:>{2}}", "{name}", "{0[1]}", "{d[key]:>5}", "{{0.x}}", "{", "}x{"]:
    assert reason(ok) is None, ok
  for bad in ["{0.real}", "{.x}", "{0[_x]}", "{_x}", "{0:{1.real}}", "{0[a].b}", "{x.__class__}"]:
    assert reason(bad), bad
