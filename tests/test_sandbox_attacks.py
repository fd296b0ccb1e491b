"""One test per attack class of issue 17 (items 1, 2 and 4), written as an attacker would.

Each test fails on the sandbox of commit 3779792 (before the zygote, per-job namespaces,
seccomp, bound prelude and static rules) and passes now. Leftovers are checked on the
host (/proc/sysvipc, the host's /tmp and /dev/shm, a host unix socket), not through the pool.
"""
import os
import secrets
import socket
import textwrap

import pytest

from compassplay_jax.domains.coding import checking
from compassplay_jax.domains.coding import jobs
from compassplay_jax.domains.coding import tasks
from compassplay_jax.domains.coding import validation
from compassplay_jax.verifiers.sandbox import Job, SandboxLimits, SandboxPool

LIMITS = SandboxLimits(timeout_s=8.0, cpu_time_s=8)


@pytest.fixture(scope="module")
def pool():
  # One worker: every job runs right after the previous one in the same worker.
  with SandboxPool(num_workers=1, limits=LIMITS) as p:
    yield p


# Finds gold left anywhere in the job's process: live frames (the worker's main loop),
# every container the garbage collector knows, and every readable page of memory
# (freed buffers included). Returns {hidden input index: gold token}.
_FIND_GOLD = textwrap.dedent(r'''
    import gc, re, sys
    _pat = re.compile(r"cpgold_([0-9a-f]{16})_([0-9])")
    _found = {}
    def _scan(text):
        for m in _pat.finditer(text):
            _found[int(m.group(2))] = m.group(0)
    _frame = sys._getframe()
    while _frame is not None:
        for _v in list(_frame.f_locals.values()) + list(_frame.f_globals.values()):
            _scan(repr(_v)[:200000])
        _frame = _frame.f_back
    for _o in gc.get_objects():
        if type(_o) is dict:
            for _v in list(_o.values()):
                if type(_v) in (str, bytes, bytearray):
                    _scan(_v if type(_v) is str else bytes(_v).decode('latin-1'))
    import ctypes
    _bpat = re.compile(rb"cpgold_([0-9a-f]{16})_([0-9])")
    try:  # Issue 23: /proc is hidden from jobs; the scan runs where a kernel view exists.
        with open('/proc/self/maps') as _maps:
            _regions = [_line.split() for _line in _maps]
    except OSError:
        _regions = []
    for _fields in _regions:
        _perm, _name = _fields[1], (_fields[5] if len(_fields) > 5 else '')
        if not _perm.startswith('r') or _name in ('[vvar]', '[vsyscall]', '[vvar_vclock]'):
            continue
        _lo, _hi = (int(x, 16) for x in _fields[0].split('-'))
        if _hi - _lo > (256 << 20):
            continue
        _data = ctypes.string_at(_lo, _hi - _lo)
        for _m in _bpat.finditer(_data):
            _found[int(_m.group(2))] = _m.group(0).decode()
        del _data
    ''')


def _gold_task(tag):
  inputs = tuple(str(i) for i in range(10))
  outputs = tuple(repr(f"cpgold_{tag}_{i}") for i in range(10))
  return tasks.CodingTask(type=tasks.INDUCTION, program="def f(a):\n    return a",
                          inputs=inputs, outputs=outputs, message="m", num_visible=5)


def test_gold_cannot_be_read_from_the_job_process(pool):
  """Attack 1a: an induction answer looks for the gold in frames, gc objects and raw memory."""
  tag = secrets.token_hex(8)
  task = _gold_task(tag)
  program = _FIND_GOLD + "\ndef f(a):\n    return _found.get(int(a), 'nothing')\n"
  verdicts = checking.check_answers(pool, task, [program])
  assert verdicts == [False]
  # Independent of the verdict: the program saw no gold token at all.
  seen = pool.run(Job(code=_FIND_GOLD, expr="sorted(_found.items())"))
  pool.run(jobs.values_job([repr(f"cpgold_{tag}_7")]))  # Gold of a check, just before.
  seen_after_gold = pool.run(Job(code=_FIND_GOLD, expr="sorted(_found.items())"))
  assert seen.ok and seen_after_gold.ok, (seen, seen_after_gold)
  assert seen_after_gold.value_repr == "[]", seen_after_gold.value_repr


def test_forged_result_with_found_gold_is_not_correct(pool):
  """Attack 1b (the 28-32 of 32 attack): find the gold, write it as the job's own result
  frame on the result fd and exit before the trusted writer runs."""
  forge = _FIND_GOLD + textwrap.dedent(r'''
      import json, os
      _canon = json.dumps(["s" + repr(_found.get(i, 'none')) for i in range(5, 10)])
      _frame = json.dumps({"status": "ok", "value_repr": repr(_canon), "value_text": _canon,
                           "error_type": None, "error_message": None})
      os.write(3, _frame.encode())
      os._exit(0)
      def f(a):
          return a
      ''')
  hits = 0
  for _ in range(4):
    task = _gold_task(secrets.token_hex(8))
    hits += checking.check_answers(pool, task, [forge])[0]
  assert hits == 0


def test_result_frame_must_be_well_formed(pool):
  """Attack 1c: a hand-written result frame with fields the trusted writer never produces."""
  forged = ('{"status": "ok", "value_repr": "1", "value_text": "2", "error_type": null, '
            '"error_message": null, "extra": "x"}')
  r = pool.run(Job(code=f"import os\nos.write(3, {forged!r}.encode())\nos._exit(0)", expr="1"))
  assert r.status == "error" and r.error_type == "BadResult", r
  deep = "[" * 100000 + "]" * 100000
  r = pool.run(Job(code=f"import os\nos.write(3, b{deep!r})\nos._exit(0)"))
  assert r.status == "error" and r.error_type == "BadResult", r
  assert pool.run(Job(code="", expr="6 * 7")).value_repr == "42"


def test_tmp_and_dev_shm_do_not_persist_between_jobs(pool):
  """Attack 3a: a job leaves files for the next job on the same worker."""
  mark = f"cp_mark_{secrets.token_hex(6)}"
  plant = pool.run(Job(code=textwrap.dedent(f"""
      import os
      for d in ('/tmp', '/dev/shm', '/var/tmp', '.'):
          try:
              open(os.path.join(d, '{mark}'), 'w').write('x')
          except OSError:
              pass
      """)))
  assert plant.ok, plant
  look = pool.run(Job(code=textwrap.dedent(f"""
      import os
      seen = [d for d in ('/tmp', '/dev/shm', '/var/tmp', '.')
              if os.path.exists(os.path.join(d, '{mark}'))]
      """), expr="seen"))
  assert look.ok and look.value_repr == "[]", look
  for d in ("/tmp", "/dev/shm", "/var/tmp"):
    assert not os.path.exists(os.path.join(d, mark))  # The host never saw it either.


def _host_ipc_keys():
  keys = set()
  for kind in ("shm", "msg", "sem"):
    with open(f"/proc/sysvipc/{kind}") as f:
      next(f)
      keys |= {(kind, int(line.split()[0])) for line in f if line.strip()}
  return keys


def test_sysv_ipc_objects_do_not_outlive_the_job(pool):
  """Attack 3b: SysV shared memory, message queues and semaphores outlive the job."""
  key = 0x43500000 + secrets.randbelow(1 << 16)
  before = _host_ipc_keys()
  make = pool.run(Job(code=textwrap.dedent(f"""
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      ids = [libc.shmget({key}, 4096, 0o1666), libc.msgget({key}, 0o1666),
             libc.semget({key}, 1, 0o1666)]
      """), expr="ids"))
  assert make.ok, make
  assert min(eval(make.value_repr)) >= 0  # Test-only eval of our own list of ints.
  find = pool.run(Job(code=textwrap.dedent(f"""
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      ids = [libc.shmget({key}, 0, 0), libc.msgget({key}, 0), libc.semget({key}, 0, 0)]
      """), expr="ids"))
  assert find.ok and find.value_repr == "[-1, -1, -1]", find
  leaked = {(kind, k) for kind, k in _host_ipc_keys() - before if k == key}
  assert not leaked, leaked


def test_host_unix_socket_is_unreachable():
  """Attack 3c: a job connects to a filesystem unix socket of a host service under /run."""
  path = f"/run/cp_attack_{os.getpid()}_{secrets.token_hex(4)}.sock"
  server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  server.bind(path)
  os.chmod(path, 0o777)
  server.listen(4)
  server.setblocking(False)
  try:
    with SandboxPool(num_workers=1, limits=LIMITS) as p:
      r = p.run(Job(code=textwrap.dedent(f"""
          import socket
          s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
          s.connect({path!r})
          s.sendall(b'pwned')
          """)))
    assert r.status == "error", r
    with pytest.raises(BlockingIOError):
      server.accept()
  finally:
    server.close()
    os.unlink(path)


def test_job_cannot_create_a_user_namespace(pool):
  """Attack 3d: an unprivileged job creates a user namespace (root inside, new attack surface)."""
  r = pool.run(Job(code=textwrap.dedent("""
      import ctypes
      libc = ctypes.CDLL(None, use_errno=True)
      CLONE_NEWUSER = 0x10000000
      results = [libc.unshare(CLONE_NEWUSER), libc.unshare(CLONE_NEWUSER | 0x00020000)]
      """), expr="results"))
  assert r.ok and r.value_repr == "[-1, -1]", r


_REPR_PATCH = textwrap.dedent("""
    b = repr.__self__
    b.repr = lambda value: "'attacker-chosen'"
    b.str = lambda value='': "'attacker-chosen'"
    def f(a):
        return a + 1
    """)


def test_patched_repr_does_not_change_the_gold_output(pool):
  """Attack 4a: the program patches the builtins or modules the gold computation used (the
  trainer's static check bypassed on purpose: since issue 23 the job applies the same rules to the
  tree it compiles, and values leave as plain data, encoded without repr or json)."""
  r = pool.run(jobs.gold_output_job(_REPR_PATCH, "41"))
  assert r.status == "error" and r.error_type == "ProgramRejected", r
  patch_json = "import json\njson.dumps = lambda v: '[\"forged\"]'\ndef f(a):\n    return a * 2\n"
  r = pool.run(jobs.gold_outputs_job(patch_json, ["1", "2"]))
  assert r.status == "error" and r.error_type == "ProgramRejected", r
  # What the rules allow cannot patch anything the encoder uses: the values are f's.
  r = pool.run(jobs.gold_outputs_job("import json\ndef f(a):\n    return a * 2\n", ["1", "2"]))
  assert r.ok and r.outcomes == ((2, 2), (4, 4)), r


ATTRIBUTE_CHAINS = [
    _REPR_PATCH,
    "def f(a):\n    return repr.__self__.__import__('os').getpid()",
    "def f(a):\n    return f.__globals__['__builtins__']",
    "def f(a):\n    return ().__class__.__base__.__subclasses__()",
    "def f(a):\n    g = (x for x in [1])\n    return g.gi_frame.f_back.f_globals",
    "def f(a):\n    return getattr(print, '__self__')",
    "def f(a):\n    import operator\n    return operator.attrgetter('x')(a)",
    "def f(a):\n    return vars()",
    "def f(a):\n    return globals()['_cp_canon']",
    "def f(a):\n    return '{0.__class__}'.format(a)",
    "def f(a):\n    import sys\n    return sys._getframe(1)",
    "def f(a):\n    import gc\n    return len(gc.get_objects())",
    "import json\njson.dumps = lambda v: '[]'\ndef f(a):\n    return a",
    "def f(a):\n    import string\n    return string.Formatter().get_field('0.real', [a], {})",
    "def f(a):\n    try:\n        1 / 0\n    except Exception as e:\n        return e.__traceback__.tb_frame",
    "class A:\n    __eq__ = lambda s, o: True\ndef f(a):\n    return A()",
]


@pytest.mark.parametrize("program", ATTRIBUTE_CHAINS)
def test_attribute_chains_to_builtins_are_rejected(program):
  """Attack 4b: the static check is bypassed through attribute chains to builtins."""
  reason, _ = validation.static_check(program)
  assert reason is not None, program


def test_repr_patch_proposal_is_invalid_end_to_end(pool):
  response = ("<think>x</think><answer>\n```python\n" + _REPR_PATCH + "```\n```input\n41\n```\n"
              "</answer>")
  valid, reason, task = validation.validate_proposal(pool, tasks.DEDUCTION, response)
  assert not valid and task is None, (reason, task)


def test_ordinary_programs_stay_valid(pool):
  """The rules reject reaching internals, not ordinary code (CRUXEval-style programs)."""
  programs = [
      "def f(text):\n    return '{}-{}'.format(text, len(text))",
      "import collections\ndef f(nums):\n    return sorted(collections.Counter(nums).items())",
      "def f(s):\n    return s.replace('a', 'b').upper()",
      "from itertools import accumulate\ndef f(x):\n    return list(accumulate(x))",
      "def f(d):\n    d = dict(d)\n    d.update({'k': 1})\n    return d",
  ]
  for program in programs:
    assert validation.static_check(program)[0] is None, program
  outcomes = validation.validate_io_batch(
      pool, [(tasks.DEDUCTION, p, a) for p, a in zip(programs, ["'ab'", "[1, 1, 2]", "'abc'",
                                                               "[1, 2, 3]", "{'a': 2}"])])
  assert [o[0] for o in outcomes] == [True] * 5, outcomes
  assert outcomes[0][2].output == "'ab-2'"
