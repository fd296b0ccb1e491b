"""SandboxPool API: results, limits, ordering, worker replacement and clean shutdown."""
import os
import signal
import threading
import time

import pytest

from compassplay_jax.verifiers import sandbox
from compassplay_jax.verifiers import sandbox_values
from compassplay_jax.verifiers.sandbox import ExecResult, Job, SandboxLimits, SandboxPool

LIMITS = SandboxLimits(timeout_s=3.0, cpu_time_s=3)


def sandbox_uid(pool):
  user = pool.isolation_report.get("user", "")
  return int(user.split()[1]) if user.startswith("uid ") else None


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(num_workers=2, limits=LIMITS) as p:
    yield p


def test_ok_value_and_stdout(pool):
  r = pool.run(Job(code="def f(a):\n  print('hi', a)\n  return [a, 'x']", expr="f(2)"))
  assert r.ok and r.status == "ok"
  assert r.value_repr == "[2, 'x']" and r.value_text is None
  assert r.stdout == "hi 2\n" and r.stderr == ""
  assert r.error_type is None and r.duration_s > 0


def test_value_text_for_str_results(pool):
  r = pool.run(Job(code="x = 'a\\nb'", expr="x"))
  assert r.value_repr == "'a\\nb'" and r.value_text == "a\nb"


def test_error_has_type_and_message(pool):
  r = pool.run(Job(code="raise ValueError('bad thing')"))
  assert (r.status, r.error_type, r.error_message) == ("error", "ValueError", "bad thing")


def test_stdin_is_fed(pool):
  r = pool.run(Job(code="import sys\ndata = sys.stdin.read()", expr="data.upper()", stdin="abc"))
  assert r.value_repr == "'ABC'"


def test_timeout_override(pool):
  start = time.monotonic()
  r = pool.run(Job(code="while True: pass", timeout_s=0.5))
  assert r.status == "timeout" and time.monotonic() - start < 2.5


def test_memory_and_result_caps(pool):
  assert pool.run(Job(code="x = bytearray(2 << 30)")).status == "memory"
  assert pool.run(Job(code="x = 'a' * 100000", expr="x")).status == "output_too_large"
  assert pool.run(Job(code="print('a' * 100000)")).status == "output_too_large"


def test_file_size_limit(pool):
  r = pool.run(Job(code="open('big', 'wb').write(b'x' * (2 << 20))"))
  assert r.status == "error"


def test_fresh_empty_temp_dir_each_job(pool):
  first = pool.run(Job(code="import os\nopen('left', 'w').write('1')", expr="os.getcwd()"))
  second = pool.run_batch([Job(code="import os", expr="(os.getcwd(), os.listdir('.'))")] * 2)
  for r in second:
    cwd, listing = eval(r.value_repr)  # Test-only: our own trusted repr.
    # With a mount namespace per job the path may repeat, but it is a fresh tmpfs.
    assert listing == [], listing
  assert first.ok and not os.path.exists(os.path.join(eval(first.value_repr), "left"))


def test_scrubbed_environment(pool):
  r = pool.run(Job(code="import os", expr="sorted(os.environ)"))
  assert r.value_repr == "['HOME', 'LANG', 'PATH', 'PYTHONHASHSEED', 'TMPDIR']"


def test_batch_keeps_order(pool):
  jobs = [Job(code=f"import time\ntime.sleep({0.05 * (i % 3)})", expr=str(i)) for i in range(12)]
  assert [r.value_repr for r in pool.run_batch(jobs)] == [str(i) for i in range(12)]


def test_thread_safe_submission(pool):
  out = {}

  def submit(k):
    out[k] = [r.value_repr for r in pool.run_batch([Job(code="", expr=f"{k}*{j}") for j in range(5)])]

  threads = [threading.Thread(target=submit, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert out == {k: [str(k * j) for j in range(5)] for k in range(4)}


def test_isolation_is_reported(pool):
  assert pool.isolation in ("netns", "socket-guard")
  assert set(pool.isolation_report) >= {"network", "filesystem", "pid", "user"}


def test_bad_input_errors_are_one_line():
  with pytest.raises(TypeError, match="Job.code must be str"):
    SandboxPool.run_batch(object.__new__(SandboxPool), [Job(code=1)])
  with pytest.raises(ValueError, match="num_workers"):
    SandboxPool(num_workers=-1)
  with pytest.raises(ValueError, match="network"):
    SandboxPool(network="none")


def test_socket_guard_mode_blocks_sockets():
  with SandboxPool(num_workers=1, limits=LIMITS, network="socket-guard") as p:
    assert p.isolation == "socket-guard"
    r = p.run(Job(code="import socket\nsocket.socket()"))
    assert r.status == "error" and r.error_type == "PermissionError"


def _our_workers():
  pids = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmd = f.read()
      with open(f"/proc/{entry}/status") as f:
        ppid = [int(l.split()[1]) for l in f if l.startswith("PPid:")][0]
    except (OSError, IndexError, ValueError):
      continue
    if b"sandbox_worker.py" in cmd and ppid == os.getpid():
      pids.append(int(entry))
  return pids


def test_dead_worker_is_replaced_and_close_leaves_nothing():
  others = set(_our_workers())
  p = SandboxPool(num_workers=1, limits=LIMITS)
  first_uid = sandbox_uid(p)
  holder = {}
  thread = threading.Thread(
      target=lambda: holder.update(r=p.run(Job(code="import time\ntime.sleep(2)", expr="1"))))
  thread.start()
  time.sleep(0.5)
  workers = [pid for pid in _our_workers() if pid not in others]
  assert len(workers) == 1
  os.kill(workers[0], signal.SIGKILL)
  thread.join(timeout=LIMITS.timeout_s + 10)
  assert not thread.is_alive()
  assert holder["r"].status == "error" and holder["r"].error_type == "SandboxError"
  assert p.run(Job(code="", expr="2")).value_repr == "2"
  assert p.workers_started == 2
  new_uid = sandbox_uid(p)
  p.close()
  assert set(_our_workers()) == others
  for uid in {first_uid, new_uid} - {None}:
    assert sandbox.processes_of_uid(uid) == []


def test_close_is_idempotent_and_run_after_close_fails():
  p = SandboxPool(num_workers=1, limits=LIMITS)
  p.close()
  p.close()
  with pytest.raises(RuntimeError, match="closed"):
    p.run(Job(code=""))


def test_exec_result_ok_property():
  r = ExecResult("timeout", None, "", "", "Timeout", "x", 1.0)
  assert not r.ok and sandbox.STATUSES[0] == "ok"


def test_every_issue17_layer_is_reported(pool):
  report = pool.isolation_report
  assert set(report) >= {"sockets", "job_fs", "ipc", "seccomp", "state"}
  if os.geteuid() == 0:  # This container: every layer is available and on.
    assert report["job_fs"].startswith("fresh tmpfs per job")
    assert report["ipc"] == "IPC namespace per job"
    assert report["seccomp"].startswith("deny-list")
    assert report["sockets"].startswith("hidden:") and "/run" in report["sockets"]


def _process_table():
  table = {}
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
      table[int(entry)] = (int(fields["PPid"]), fields["State"].strip()[:1])
    except (OSError, KeyError, ValueError):
      pass
  return table


def test_zygote_reaps_every_supervisor(pool):
  """Worker and zygote leave no zombie behind after a batch (the zygote waits for each supervisor)."""
  pool.run_batch([Job(code="", expr="1")] * 6)
  deadline = time.monotonic() + 2.0
  while True:
    table = _process_table()
    workers = {pid for pid, (ppid, _) in table.items() if ppid == os.getpid()}
    tree = workers | {pid for pid, (ppid, _) in table.items() if ppid in workers}  # + zygotes
    zombies = [pid for pid, (ppid, state) in table.items() if ppid in tree and state == "Z"]
    if not zombies or time.monotonic() > deadline:
      break
    time.sleep(0.05)
  assert len(tree) >= 2 * pool.num_workers  # Each worker and its zygote were found.
  assert zombies == []


def test_layers_can_be_switched_off_and_the_fallbacks_work(caplog):
  with pytest.raises(ValueError, match="disabled_layers: unknown layers"):
    SandboxPool(num_workers=1, disabled_layers=("nope",))
  with caplog.at_level("WARNING"):
    p = SandboxPool(num_workers=1, limits=LIMITS, disabled_layers=("seccomp", "ipcns", "jobns"))
  try:
    report = p.isolation_report
    assert "disabled" in report["seccomp"] and "disabled" in report["ipc"]
    assert "disabled" in report["job_fs"]
    assert not [r for r in caplog.records if "degraded" in r.getMessage()]  # Asked for: no warning.
    # Fallback job dirs: fresh, empty, removed after the job.
    first = p.run(Job(code="import os\nopen('left', 'w').write('1')", expr="os.getcwd()"))
    second = p.run(Job(code="import os", expr="os.listdir('.')"))
    assert first.ok and second.value_repr == "[]"
    # Without seccomp the kernel lets the uid create a user namespace: the layer is what stops it.
    r = p.run(Job(code="import ctypes\nr = ctypes.CDLL(None).unshare(0x10000000)", expr="r"))
    assert r.ok and r.value_repr in ("0", "-1")
  finally:
    p.close()


def test_call_job_values_come_back_as_plain_data(pool):
  r = pool.run(sandbox.CallJob(
      program="import collections\ndef f(a, k=1):\n    print(a)\n    return [a, {'k': k}]\nK = 5",
      entries=(("call", "2, k=K", 2), ("value", "(1, 'x')", 1), ("call", "1 / 0", 1)), names=True))
  assert r.ok and r.stdout == "2\n2\n", r
  (first, second), (value,), (error,) = r.outcomes
  assert sandbox_values.python_repr(first) == "[2, {'k': 5}]" == sandbox_values.python_repr(second)
  assert sandbox_values.python_value(value) == (1, "x")
  assert error == sandbox.Failure("ZeroDivisionError", "division by zero")
  with pytest.raises(ValueError, match="CallJob entry"):
    pool.run(sandbox.CallJob(program="def f(a):\n  return a", entries=(("eval", "1", 1),)))
  with pytest.raises(ValueError, match="needs a program"):
    pool.run(sandbox.CallJob(program=None, entries=(("call", "1", 1),)))


def test_refused_call_program_starts_no_process(pool):
  """The worker applies the rules before forking: a refused program costs no job process."""
  start = time.monotonic()
  results = pool.run_batch([sandbox.CallJob(program="import os\ndef f(a):\n  return a",
                                            entries=(("call", "1", 1),))] * 20)
  assert {(r.status, r.error_type) for r in results} == {("error", "ProgramRejected")}
  assert "module 'os' is not available" in results[0].error_message
  assert time.monotonic() - start < 5.0


def test_dead_zygote_replaces_its_worker():
  p = SandboxPool(num_workers=1, limits=LIMITS)
  try:
    worker = [pid for pid in _our_workers()][-1]
    zygotes = [int(x) for t in os.listdir(f"/proc/{worker}/task")
               for x in open(f"/proc/{worker}/task/{t}/children").read().split()]
    for pid in zygotes:
      os.kill(pid, signal.SIGKILL)
    job = sandbox.CallJob(program=None, entries=(("value", "6 * 7", 1),))
    first = p.run(job)
    assert first.status == "error" and first.error_type == "SandboxError", first
    assert p.run(job).outcomes == ((42,),)  # A fresh worker (and zygotes) answers.
    assert p.workers_started == 2
  finally:
    p.close()
