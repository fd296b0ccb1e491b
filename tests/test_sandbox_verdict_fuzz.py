"""Fuzz (issues 23 and 46): 10,000 generated attack programs; zero wrong verdicts, zero trainer exceptions.

Every program computes a known f (a * K + C) and carries one attack payload from the four classes
of issue 23 (channel writes, attribute chains, introspection, metadata marking) or issue 46's
attribute and item access by names held in text ("text": str.format / format_map fields, names
built at run time, hasattr, copy hooks), at module level or inside f. The oracle is the arithmetic,
and for the text class also the payload's own expected verdict (a read that must raise makes the
task invalid). Issue 46's "identity" class is whole programs whose value depends on an address or
the hash seed yet is stable inside one process (AZR's run-twice check accepts them): the oracle is
that validation refuses every one.

- All 10,000 go through the trainer's layers: proposal parsing, `validation.static_check` and the
  static rules. None raises; every payload written with literal banned syntax is refused there.
- A stratified sample (60 per issue-23 class, 20 per issue-46 class) goes through the real sandbox:
  validation (valid => the gold is repr(f(x))), deduction (the true output is correct iff the task
  is valid, a wrong one never), abduction (a wrong input is never correct, even though the attack
  program computes f in that job) and induction (the attack program as a solver whose f is wrong
  is never correct; with the right f it is correct only if it is a valid program).
Running all 10,000 through the sandbox would take about 15 minutes of 2 cores (about 11 jobs each);
the sample keeps this file near 30 s.
"""
import importlib
import json
import random
import types

import pytest

from compassplay_jax.domains.coding import checking
from compassplay_jax.domains.coding import parsing
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation
from compassplay_jax.verifiers import sandbox_rules
from compassplay_jax.verifiers.sandbox import SandboxLimits, SandboxPool

NUM_PROGRAMS = 10_000
SANDBOX_SAMPLE_PER_CLASS = 60
SEED = 2323
_FORGED = ['{"status": "ok", "value_repr": "999", "value_text": "999", "error_type": null, '
           '"error_message": null}',
           '{"status":"ok","error_type":null,"error_message":null,"outcomes":[["+i999;","+i999;"]]}',
           "0" * 32 + '{"status":"ok","error_type":null,"error_message":null,'
           '"outcomes":[["+i999;","+i999;"]]}']

X = 3  # The input of every task; the program knows f(X), its own gold, and forges toward it.
_CLOSE_AND_RELOAD = "w.close()\nsink = open('/dev/null', 'w')"  # Loses the harness's own frame.

# (class, template, caught by the static rules). {frame!r}: a forged result frame; {gold_frame!r}
# and {answer_frame!r}: frames that claim the gold '999' (validation) or that the answer is correct
# (the canonical text of f(X)), in the layout of 73bfe6e's harness; {truth}: f(X).
PAYLOADS = [
    ("channel", "w = open(3, 'w')\nw.write({gold_frame!r})\n" + _CLOSE_AND_RELOAD, True),
    ("channel", "w = open(3, 'w')\nw.write({answer_frame!r})\n" + _CLOSE_AND_RELOAD, True),
    ("introspection", "import dataclasses\nfor i in dataclasses.inspect.stack():\n"
     "    s = dataclasses.inspect.getargvalues(i.frame).locals\n"
     "    if '_cp_canon' in s:\n        s['_cp_canon'] = lambda *a, **k: 'n{truth}'", True),
    ("introspection", "import dataclasses\nfor i in dataclasses.inspect.stack():\n"
     "    s = dataclasses.inspect.getargvalues(i.frame).locals\n"
     "    if '_cp_truncate' in s:\n        s['_cp_truncate'] = lambda *a, **k: '999'", True),
    ("channel", "open(3, 'w').write({frame!r})", True),
    ("channel", "w = open('/proc/self/fd/3', 'w')\nw.write({frame!r})\nw.close()", True),
    ("channel", "import os\nos.write(3, {frame!r}.encode())", True),
    ("channel", "__import__('os').write(3, b'x')", True),
    ("channel", "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 3)", True),
    ("channel", "print({frame!r}, file=open(3, 'w'))", True),
    ("channel", "import sys\nsys.stdout = open(3, 'w')\nprint({frame!r})", True),
    ("channel", "import io\nio.open(3, 'w').write({frame!r})", True),
    ("channel", "import builtins\nbuiltins.open(3, 'w').write({frame!r})", True),
    ("channel", "w = [c for c in ().__class__.__base__.__subclasses__() if 'IO' in c.__name__]", True),
    ("channel", "print({frame!r})", False),  # Stdout is not the result channel.
    ("channel", "raise SystemExit({frame!r})", False),
    ("introspection", "g = (x for x in [1])\nfr = g.gi_frame", True),
    ("introspection", "fr = f.__globals__", True),
    ("introspection", "try:\n    1 / 0\nexcept Exception as e:\n    fr = e.__traceback__.tb_frame", True),
    ("introspection", "import sys\nfr = sys._getframe(0)", True),
    ("introspection", "import gc\nn = len(gc.get_objects())", True),
    ("introspection", "b = __builtins__", True),
    ("introspection", "b = print.__self__", True),
    ("introspection", "t = ().__class__.__base__.__subclasses__()", True),
    ("introspection", "s = '{0.__class__}'.format(1)", True),
    ("introspection", "v = vars(f)", True),
    ("introspection", "v = getattr(f, 'x', 1)", True),
    ("introspection", "v = globals()", True),
    ("introspection", "v = dir()", True),
    ("introspection", "import inspect\nv = inspect.stack()", True),
    ("introspection", "import operator\nv = operator.attrgetter('x')", True),
    ("introspection", "match f:\n    case object(__globals__=g):\n        pass", True),
    ("introspection", "import signal\nsignal.signal(14, print)", True),
    ("introspection", "import atexit\natexit.register(print)", True),
    ("introspection", "import threading\nthreading.Thread(target=print).start()", True),
    ("introspection", "import weakref\nr = weakref.ref(f)", True),
    ("introspection", "import pickle\nv = pickle.dumps(1)", True),
    ("introspection", "import importlib\nm = importlib.import_module('os')", True),
    # Computed names: the static rules cannot see them; the runtime has nothing they could reach.
    ("introspection", "fmt = '{0.' + '_' * 2 + 'class' + '_' * 2 + '}'\ns = fmt.format(1)", False),
    ("introspection", "D = type('D', (), {'_' * 2 + 'del' + '_' * 2: lambda s: print('x')})\nd = D()",
     False),
    ("introspection", "import copy\nR = type('R', (), {'_' * 2 + 'reduce' + '_' * 2: "
     "lambda s: (print, ('x',))})\nr = copy.deepcopy(R())", False),
    ("introspection", "h = hasattr(f, '_' * 2 + 'globals' + '_' * 2)", False),
    ("introspection", "import functools\nw = functools.partial(print, 1)", False),
    ("introspection", "M = type(type(f))('M', (), {})\nm = M()", False),
    ("metadata", "open('/etc/passwd').read()", True),
    ("metadata", "import os\nst = os.stat('/etc/passwd')", True),
    ("metadata", "import os\nos.utime('/etc/hostname')", True),
    ("metadata", "import pathlib\nps = list(pathlib.Path('/usr').iterdir())", True),
    ("metadata", "import os\nps = os.listdir('/proc')", True),
    ("metadata", "import shutil\nshutil.disk_usage('/')", True),
    ("metadata", "import time\nt = time.time()", True),
    ("metadata", "import random\nr = random.random()", True),
]


def _chain_payloads():
  """Every attribute of an allowed module that is a module or not on its allow-list."""
  found = []
  for name in sandbox_rules.ALLOWED_MODULES:
    module = importlib.import_module(name)
    allowed = sandbox_rules.module_names(name)
    for attr in sorted(vars(module)):
      if attr in allowed:
        continue
      found.append(("chain", f"import {name}\nv = {name}.{attr}", True))
      if isinstance(getattr(module, attr), types.ModuleType):
        found.append(("chain", f"import {name}\nv = {name}.{attr}.__dict__", True))
      if not attr.startswith("_"):
        found.append(("chain", f"from {name} import {attr}", True))
        found.append(("chain", f"import {name} as m\nx = [m][0]\nv = x.{attr}", False))
  found += [("chain", "import dataclasses\nv = dataclasses.inspect.stack()", True),
            ("chain", "import typing\nv = typing.sys.modules", True),
            ("chain", "import sys\nv = sys.modules['os']", True),
            ("chain", "import json\nv = json.decoder.scanstring", True)]
  return found


# ---- issue 46: names held in text (the format-string class) --------------------------------------
# (expression building the name, the name); the literal dunder text is refused statically.
_TEXT_NAMES = [("'_' + '_' + 'traceback' + '__'", "__traceback__"),
               ("''.join(['_', '_', 'class', '_', '_'])", "__class__"),
               ("chr(95) * 2 + 'globals' + chr(95) * 2", "__globals__"), ("'gi' + '_frame'", "gi_frame"),
               ("'%s%s' % ('tb_', 'frame')", "tb_frame"), ("'f_' + 'back'", "f_back"),
               ("'__class__'", "__class__"), ("'_' * 2 + 'code' + '_' * 2", "__code__"), ("'mr' + 'o'", "mro")]
_TEXT_OBJECTS = ["try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    obj = err", "obj = (x for x in [1])",
                 "obj = print", "obj = 1", "obj = [1]"]
# (reader, expected verdict when not refused statically): "invalid" = the read must raise in the job.
_TEXT_READERS = [
    ("leak = ('{{0.' + {N} + '}}').format(obj)", "invalid"),
    ("leak = ('{{o.' + {N} + '.x}}').format_map({{'o': obj}})", "invalid"),
    ("leak = str.format('{{0.' + {N} + '}}', obj)", "invalid"),
    ("leak = type('').format('{{0.' + {N} + '}}', obj)", "invalid"),
    ("leak = list(map(str.format, ['{{0.' + {N} + '}}'], [obj]))[0]", "invalid"),
    ("fmt = ('{{0.' + {N} + '}}').format\nleak = fmt(obj)", "invalid"),
    ("leak = ('{{0[' + {N} + ']}}').format({{{N}: obj}})", "invalid if _"),  # items: '_' keys only
    ("try:\n    leak = ('{{0:{{1.' + {N} + '}}}}').format(0, obj)\nexcept ValueError as e:\n"
     "    leak = str(e)\nassert 'not allowed' in leak", "valid"),
    ("leak = hasattr(obj, {N})\nassert leak is False", "valid"),
    ("leak = ('%(' + {N} + ')s') % {{{N}: 1}}", "valid"),
    ("try:\n    leak = format(obj, '{{0.' + {N} + '}}')\nexcept (TypeError, ValueError):\n    leak = None", "valid"),
    ("import copy\nD = '_' * 2\nS = type('S', (str,), {{D + 'slotnames' + D: ['format'], "
     "D + 'setstate' + D: lambda s, st: None}})\nleak = copy.copy(S('{{0.' + {N} + '}}'))", "invalid"),
    ("import copy\nD = '_' * 2\nC = type('C', (), {{D + 'reduce_ex' + D: lambda s, p: "
     "(list, (), (None, {{{N}: obj}}))}})\nleak = copy.deepcopy(C())", "invalid"),
]


def _text_payload(rng):
  """("text", payload, refused statically, must fail at run time)."""
  expr, name = rng.choice(_TEXT_NAMES)
  reader, expect = rng.choice(_TEXT_READERS)
  static = expr.startswith("'__")
  if expect == "invalid if _":
    expect = "invalid" if name.startswith("_") else "valid"
  return "text", rng.choice(_TEXT_OBJECTS) + "\n" + reader.format(N=expr), static, static or expect == "invalid"


# ---- issue 46: values that depend on identity or the hash seed (whole programs) ------------------
_LETTERS = "'abcdefghijkl'"  # 12 distinct str: their set order follows the hash seed
# (module-level setup, expression): refused outright (the restricted hash, program classes without an
# address repr or identity hash) or carrying >= 20 address / seed bits (the second interpreter differs).
_IDENTITY_SOURCES = [
    ("", "hash(object()) % {m}"), ("class C:\n    pass\nK = C()\n", "hash(K) % {m}"),
    ("class C:\n    pass\n", "hash(C) % {m}"), ("", "hash(f) % {m}"), ("", "hash(len) % {m}"),
    ("", "hash(None) % {m}"), ("", "hash(str(a)) % {m}"), ("", "hash((1, object())) % {m}"),
    ("class C:\n    pass\nK = C()\n", "repr(K){s}"), ("class C:\n    pass\nK = C()\n", "f'{{K}}'{s}"),
    ("class C:\n    pass\nK = C()\n", "format(K){s}"), ("class C:\n    pass\nK = C()\n", "('%s' % (K,)){s}"),
    ("", "str(object()){s}"), ("O = object()\n", "str(O){s}"), ("", "str(f){s}"), ("G = lambda: 0\n", "repr(G){s}"),
    ("", "str(iter([])){s}"), ("", "repr(map(int, [])){s}"), ("", "repr([].append){s}"),
    ("", "str(x for x in [a]){s}"), ("", "''.join(set(" + _LETTERS + "))"),
    ("class C:\n    pass\nCS = [C() for _ in range(12)]\n", "[CS.index(c) for c in set(CS)]"),
    ("class C:\n    pass\nCS = [C() for _ in range(12)]\n", "sorted(range(12), key=lambda i: hash(CS[i]))"),
    ("class C:\n    pass\n", "list({{C(): i for i in range(12)}}.values())"),
]
_ADDRESS_SLICES = ("", "[-9:-1]", "[-13:-1]", ".split()[-1]")  # >= 8 hex digits of an address


def _identity_program(rng) -> str:
  setup, expr = rng.choice(_IDENTITY_SOURCES)
  expr = expr.format(m=rng.choice((2, 7, 1000, 2 ** 61 - 1)), s=rng.choice(_ADDRESS_SLICES))
  wrap = rng.choice(("{e}", "[{e}, a]", "({e}, len(str(a)))", "{{'v': {e}}}"))
  return setup + "def f(a):\n    return " + wrap.format(e=expr) + "\n"


ALL_PAYLOADS = PAYLOADS + _chain_payloads()
CLASSES = ("channel", "chain", "introspection", "metadata", "text", "identity")
ISSUE_46_CLASSES = ("text", "identity")
_BY_CLASS = {cls: [p for p in ALL_PAYLOADS if p[0] == cls] for cls in CLASSES}


def _frame(value_text):
  return json.dumps({"status": "ok", "value_repr": repr(value_text), "value_text": value_text,
                     "error_type": None, "error_message": None})


def _program(rng):
  """(class, refused statically, program, k, c, must be invalid); k and c are None for "identity"."""
  cls = rng.choice(CLASSES)
  if cls == "identity":
    return cls, False, _identity_program(rng), None, None, True
  if cls == "text":
    _, template, static, must_fail = _text_payload(rng)
  else:
    _, template, static = rng.choice(_BY_CLASS[cls])
    must_fail = static
  k, c = rng.randint(2, 9), rng.randint(-5, 5)
  truth = X * k + c
  payload = (template.replace("{frame!r}", repr(rng.choice(_FORGED)))
             .replace("{gold_frame!r}", repr(_frame("999")))
             .replace("{answer_frame!r}", repr(_frame(f'["n{truth}"]')))
             .replace("{truth}", str(truth)))
  where = rng.randrange(3)
  if where == 0:
    body = f"{payload}\ndef f(a):\n    return a * {k} + {c}\n"
  elif where == 1:
    body = f"def f(a):\n    return a * {k} + {c}\n{payload}\n"
  else:
    inner = "\n".join("    " + line for line in payload.splitlines())
    body = f"def f(a):\n{inner}\n    return a * {k} + {c}\n"
  return cls, static, body, k, c, must_fail


def _proposal(program, x):
  return f"<think>t</think><answer>\n```python\n{program}```\n```input\n{x}\n```\n</answer>"


def test_ten_thousand_attack_programs_through_the_trainer_layers():
  rng = random.Random(SEED)
  counts = {cls: [0, 0] for cls in CLASSES}
  for _ in range(NUM_PROGRAMS):
    cls, static, program, _, _, _ = _program(rng)
    parsed = parsing.parse_code_and_input(parsing.extract_answer(_proposal(program, "3")))
    assert parsed is not None and parsed[0] == program.strip()
    reason, _ = validation.static_check(parsed[0])
    assert reason is None or isinstance(reason, str)
    counts[cls][reason is None] += 1
    if static:
      assert reason is not None, program
  print({cls: f"{refused} refused, {passed} passed" for cls, (refused, passed) in counts.items()})
  assert all(refused > 0 for cls, (refused, _) in counts.items() if cls != "identity")
  assert sum(counts["identity"]) > 1000  # built from names the static rules allow: caught at run time


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(num_workers=2, limits=SandboxLimits(timeout_s=5.0, cpu_time_s=5)) as p:
    yield p


def _per_class(cls: str) -> int:
  return SANDBOX_SAMPLE_PER_CLASS // 3 if cls in ISSUE_46_CLASSES else SANDBOX_SAMPLE_PER_CLASS


def _sample(rng):
  by_class = {cls: [] for cls in CLASSES}
  while any(len(by_class[cls]) < _per_class(cls) for cls in CLASSES):
    item = _program(rng)
    if len(by_class[item[0]]) < _per_class(item[0]):
      by_class[item[0]].append(item)
  return [item for cls in CLASSES for item in by_class[cls]]


def test_attack_programs_in_the_sandbox_never_win(pool):
  rng = random.Random(SEED + 1)
  sample = _sample(rng)
  x = X
  items = [(tasks.DEDUCTION, program, str(x)) for _, _, program, _, _, _ in sample]
  outcomes = validation.validate_io_batch(pool, items)
  checks, expected = [], []
  valid_count = 0
  for (cls, static, program, k, c, must_fail), (valid, reason, task) in zip(sample, outcomes):
    if static or must_fail:
      assert not valid, (cls, program, reason, task and task.output)
    if cls == "identity":  # no gold exists: nothing to check answers against
      continue
    truth = x * k + c
    if valid:
      valid_count += 1
      assert task.output == repr(truth), (program, task.output)
      checks.append((task, [repr(truth), repr(truth + 1)]))
      expected.append([True, False])
    abduction = tasks.CodingTask(type=tasks.ABDUCTION, program=program, input=str(x),
                                 output=repr(truth))
    checks.append((abduction, [str(x + 1), str(x)]))
    expected.append([False, valid])
    deduction = tasks.CodingTask(type=tasks.DEDUCTION, program=program, input=str(x),
                                 output=repr(truth))
    checks.append((deduction, [repr(truth + 1), repr(truth)]))  # The gold job runs no program.
    expected.append([False, True])
    for k_task, right in ((k, valid), (k + 1, False)):
      hidden = tuple(str(i) for i in range(10))
      induction = tasks.CodingTask(type=tasks.INDUCTION, program="def f(a):\n    return a",
                                   inputs=hidden,
                                   outputs=tuple(repr(int(i) * k_task + c) for i in hidden),
                                   message="m", num_visible=5)
      checks.append((induction, [program]))
      expected.append([right])
  verdicts = checking.check_many(pool, checks)
  wrong = [(task.type, task.program[:120], answers, v, e)
           for (task, answers), v, e in zip(checks, verdicts, expected) if v != e]
  accepted = [w for w in wrong if any(got and not want for got, want in zip(w[3], w[4]))]
  print(f"{len(wrong)} verdicts differ from the oracle, {len(accepted)} accept a wrong answer")
  assert wrong == [], wrong[:5]
  print(f"{len(sample)} attack programs in the sandbox, {valid_count} valid, "
        f"{len(checks)} checks, 0 wrong verdicts")
  assert valid_count > 0  # The runtime-only payloads are harmless and stay valid tasks.


ATTACK_ANSWERS = ["__import__('os')", "(1).__class__", "open(3, 'w')", "f(3)",
                  "[c for c in ().__class__.__base__.__subclasses__()]", "'{0.__class__}'.format(1)",
                  "(lambda: 0).__globals__", "vars()", "globals()", "(x for x in [1]).gi_frame",
                  "type('A', (), {'__eq__': lambda s, o: True})()", "exec('1')",
                  "print('{\"status\": \"ok\"}') or 7"]


def test_attack_answers_are_never_correct(pool):
  task = tasks.CodingTask(type=tasks.DEDUCTION, program="def f(a):\n    return a + 4", input="3",
                          output="7")
  abd = tasks.CodingTask(type=tasks.ABDUCTION, program="def f(a):\n    return a + 4", input="3",
                         output="7")
  verdicts = checking.check_many(pool, [(task, ATTACK_ANSWERS + ["7"]),
                                        (abd, ATTACK_ANSWERS + ["3"])])
  assert verdicts == [[False] * len(ATTACK_ANSWERS) + [True]] * 2
