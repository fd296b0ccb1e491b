"""A pool of sandbox workers that run untrusted Python programs (stdlib only).

Usage:
  with SandboxPool() as pool:
    result = pool.run(Job(code="def f(a):\\n  return a", expr="f(1)"))
    assert result.ok and result.value_repr == "1"
    result = pool.run(CallJob(program="def f(a):\\n  return [a]", entries=(("call", "1", 2),)))
    result.outcomes  # (([1], [1]),): what f returned, twice, as plain data decoded here

Each worker is a spawned interpreter (`sandbox_worker.py`) with a scrubbed
environment. Each job runs in a fresh process forked from a zygote that has
never held any job's data, as PID 1 of a fresh PID namespace, under a
per-worker uid, rlimits and a seccomp filter, in a private network namespace
and a mount namespace where every file is read-only (see docs/sandbox.md and
`isolation_report`). A `CallJob` runs its program under the restricted runtime
(allow-listed builtins and modules, no syscall to open anything) and returns
values as plain data, never as text the program could have written. The pool
never unpickles anything from a worker, and a dead or stuck worker is killed
and replaced, so callers never hang.
"""
import concurrent.futures
import dataclasses
import json
import logging
import os
import pathlib
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence, Tuple

from compassplay_jax.verifiers import sandbox_values

STATUSES = ("ok", "error", "timeout", "memory", "output_too_large")
_WORKER_SCRIPT = pathlib.Path(__file__).with_name("sandbox_worker.py")
_FRAME = struct.Struct(">I")
_STARTUP_TIMEOUT_S = 60.0
# Slack for fork, cleanup and IPC beyond the job's own timeout before the pool
# declares the worker stuck.
_WORKER_GRACE_S = 5.0
# Isolation layers that can be switched off (to measure what each one costs).
LAYERS = ("netns", "mountns", "pidns", "uid", "jobns", "ipcns", "seccomp")
# Report entries and the words that mean the layer is fully on.
_LAYER_ACTIVE = {"network": "netns", "pid": "pidns per job", "job_fs": "fresh tmpfs per job",
                 "ipc": "IPC namespace per job", "seccomp": "deny-list", "sockets": "hidden:",
                 "metadata": "every mount read-only, noatime; hidden: /proc, /sys; /dev: null"}
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Per-job limits. processes=0 means the program cannot fork or start threads."""
  timeout_s: float = 10.0
  cpu_time_s: int = 10
  memory_bytes: int = 1 << 30
  file_size_bytes: int = 1 << 20
  open_files: int = 64
  processes: int = 0
  output_bytes: int = 1 << 16
  result_bytes: int = 1 << 16


@dataclasses.dataclass(frozen=True)
class Job:
  """code runs as a fresh script in an empty temp dir; repr(eval(expr)) is returned.

  prelude: trusted setup code run first in the same namespace; each worker
  compiles a given prelude once, so large shared helpers cost nothing per job.
  A failure inside it is reported like any program error.
  """
  code: str
  expr: Optional[str] = None
  stdin: str = ""
  timeout_s: Optional[float] = None
  prelude: str = ""


CALL_KINDS = ("call", "value")


@dataclasses.dataclass(frozen=True)
class CallJob:
  """A program run under the restricted runtime, then a list of evaluations whose values come
  back as plain data (decoded here; never text the program could write).

  program: source defining `f` (allow-listed builtins and modules only, `sandbox_rules`), or
    None for value expressions alone.
  entries: (kind, text, repeat) triples. kind "call": text is an argument list ("1, 'a', k=2")
    and f(*args, **kwargs) is evaluated; kind "value": text is a plain value expression. Each
    is evaluated `repeat` times, on freshly built arguments.
  names: whether the texts may use the program's plain-data globals.
  second_interpreter: run in the worker's second call-job zygote, a separate interpreter with its
    own hash seed and address layout (a gold's cross-job determinism check).
  """
  program: Optional[str]
  entries: Tuple[Tuple[str, str, int], ...]
  names: bool = False
  timeout_s: Optional[float] = None
  second_interpreter: bool = False


@dataclasses.dataclass(frozen=True)
class Failure:
  """An evaluation of a CallJob that raised (error_type: the exception's class name, or
  NotPlain / TooLarge / TooDeep / SelfReference / ValueRejected / BadResult)."""
  error_type: str
  message: str = ""


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """Outcome of one job. value_text is the value itself when eval(expr) was a str.

  outcomes (CallJob only, status "ok"): per entry, a tuple of `repeat` items, each the decoded
  plain value (sandbox_values: scalars as Python objects, containers as Node) or a Failure.
  """
  status: str
  value_repr: Optional[str]
  stdout: str
  stderr: str
  error_type: Optional[str]
  error_message: Optional[str]
  duration_s: float
  value_text: Optional[str] = None
  outcomes: Optional[tuple] = None

  @property
  def ok(self) -> bool:
    return self.status == "ok"


def _sandbox_failure(message, duration_s=0.0):
  return ExecResult("error", None, "", "", "SandboxError", message, duration_s)


def _decode_outcome(item):
  if item.startswith("+"):
    try:
      return sandbox_values.decode(item[1:])
    except sandbox_values.DecodeError as e:
      return Failure("BadResult", str(e))
  error_type, _, message = item[1:].partition(":")
  return Failure(error_type or "Error", message)


def _result_from_frame(frame, duration_s, job=None):
  if not isinstance(frame, dict) or frame.get("status") not in STATUSES:
    return _sandbox_failure("malformed reply from sandbox worker", duration_s)
  text = lambda key: frame.get(key) if isinstance(frame.get(key), str) else None
  outcomes = None
  if isinstance(job, CallJob) and frame["status"] == "ok":
    raw = frame.get("outcomes")
    shape = [repeat for _, _, repeat in job.entries]
    if not isinstance(raw, list) or [len(e) if isinstance(e, list) else -1 for e in raw] != shape:
      return _sandbox_failure("malformed reply from sandbox worker", duration_s)
    outcomes = tuple(tuple(_decode_outcome(str(item)) for item in entry) for entry in raw)
  return ExecResult(status=frame["status"], value_repr=text("value_repr"),
                    stdout=text("stdout") or "", stderr=text("stderr") or "",
                    error_type=text("error_type"), error_message=text("error_message"),
                    duration_s=float(frame.get("duration_s") or duration_s),
                    value_text=text("value_text"), outcomes=outcomes)


def default_hidden_paths():
  """Directories the sandbox hides: the checkout's parent, the cwd and $HOME."""
  repo_parent = pathlib.Path(__file__).resolve().parents[3]
  paths = {str(repo_parent), os.getcwd(), os.path.expanduser("~")}
  return sorted(p for p in paths if p and p != "/")


def processes_of_uid(uid):
  """Pids of live (non-zombie) processes whose real uid is `uid` (read from /proc)."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
      if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
        found.append(int(entry))
    except (OSError, ValueError, KeyError):
      pass
  return found


def kill_processes_of_uid(uid, wait_s=2.0):
  """Backstop after killing a worker: its sandbox uid is private, so all its processes go."""
  deadline = time.monotonic() + wait_s
  while time.monotonic() < deadline:
    pids = processes_of_uid(uid)
    if not pids:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    time.sleep(0.02)


def _check_call_job(job):
  if job.program is not None and not isinstance(job.program, str):
    raise TypeError(f"CallJob.program must be str or None, got {type(job.program).__name__}")
  if not isinstance(job.entries, tuple):
    raise TypeError(f"CallJob.entries must be a tuple, got {type(job.entries).__name__}")
  for entry in job.entries:
    if (not isinstance(entry, tuple) or len(entry) != 3 or entry[0] not in CALL_KINDS
        or not isinstance(entry[1], str) or not isinstance(entry[2], int) or entry[2] < 1):
      raise ValueError(f"CallJob entry must be (kind in {CALL_KINDS}, str, int >= 1), got {entry!r}")
    if entry[0] == "call" and job.program is None:
      raise ValueError("a CallJob 'call' entry needs a program")
  if job.timeout_s is not None and not job.timeout_s > 0:
    raise ValueError(f"CallJob.timeout_s must be positive, got {job.timeout_s}")


def _check_job(job):
  if isinstance(job, CallJob):
    _check_call_job(job)
    return
  if not isinstance(job, Job):
    raise TypeError(f"job must be a sandbox.Job or sandbox.CallJob, got {type(job).__name__}")
  if not isinstance(job.code, str):
    raise TypeError(f"Job.code must be str, got {type(job.code).__name__}")
  if job.expr is not None and not isinstance(job.expr, str):
    raise TypeError(f"Job.expr must be str or None, got {type(job.expr).__name__}")
  if not isinstance(job.prelude, str):
    raise TypeError(f"Job.prelude must be str, got {type(job.prelude).__name__}")
  if not isinstance(job.stdin, str):
    raise TypeError(f"Job.stdin must be str, got {type(job.stdin).__name__}")
  if job.timeout_s is not None and not job.timeout_s > 0:
    raise ValueError(f"Job.timeout_s must be positive, got {job.timeout_s}")


class _WorkerHandle:
  """One spawned worker process and its pipes; used by exactly one thread."""

  def __init__(self, config):
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    self.proc = subprocess.Popen(
        [sys.executable, "-S", "-s", "-B", str(_WORKER_SCRIPT)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd="/",
        close_fds=True, start_new_session=True)
    self._in = self.proc.stdin.fileno()
    self._out = self.proc.stdout.fileno()
    self._buffer = bytearray()
    self.send(config)
    hello = self.receive(time.monotonic() + _STARTUP_TIMEOUT_S)
    if not isinstance(hello, dict) or not hello.get("ready"):
      self.kill()
      raise RuntimeError(f"sandbox worker failed to start: {hello and hello.get('error')}")
    self.isolation = hello["isolation"]
    user = self.isolation.get("user", "")
    self.uid = int(user.split()[1]) if user.startswith("uid ") else None

  def send(self, obj):
    data = json.dumps(obj).encode()
    os.write(self._in, _FRAME.pack(len(data)))
    view = memoryview(data)
    while view:
      view = view[os.write(self._in, view):]

  def receive(self, deadline):
    """Returns one JSON frame, or None on EOF, a bad frame or the deadline."""
    while True:
      if len(self._buffer) >= _FRAME.size:
        (size,) = _FRAME.unpack(self._buffer[:_FRAME.size])
        if len(self._buffer) >= _FRAME.size + size:
          payload = bytes(self._buffer[_FRAME.size:_FRAME.size + size])
          del self._buffer[:_FRAME.size + size]
          try:
            return json.loads(payload)
          except Exception:  # pylint: disable=broad-except  (a broken worker is replaced)
            return None
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        return None
      ready, _, _ = select.select([self._out], [], [], remaining)
      if ready:
        chunk = os.read(self._out, 1 << 20)
        if not chunk:
          return None
        self._buffer += chunk

  def kill(self):
    """Kills the worker's session; its job processes die with it (parent-death signals)."""
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self._reap()
    if getattr(self, "uid", None) is not None:
      kill_processes_of_uid(self.uid)

  def close(self, timeout_s=5.0):
    try:
      self.proc.stdin.close()
    except OSError:
      pass
    try:
      self.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      pass
    self.kill()

  def _reap(self):
    try:
      self.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      pass
    for stream in (self.proc.stdin, self.proc.stdout):
      try:
        stream.close()
      except OSError:
        pass


class SandboxPool:
  """Thread-safe pool; use as a context manager or call close()."""

  def __init__(self, num_workers: Optional[int] = None, limits: SandboxLimits = SandboxLimits(),
               *, network: str = "auto", hidden_paths: Optional[Sequence[str]] = None,
               disabled_layers: Sequence[str] = ()):
    """network: "auto" (netns when possible), "netns" (required) or "socket-guard".

    disabled_layers: names from LAYERS to leave off, for measuring their cost only.
    Layers the kernel refuses are logged (warning) with the reason and reported in
    `isolation_report`.
    """
    if network not in ("auto", "netns", "socket-guard"):
      raise ValueError(f"network must be auto, netns or socket-guard, got {network!r}")
    unknown = sorted(set(disabled_layers) - set(LAYERS))
    if unknown:
      raise ValueError(f"disabled_layers: unknown layers {unknown}; known: {LAYERS}")
    if not isinstance(limits, SandboxLimits):
      raise TypeError(f"limits must be SandboxLimits, got {type(limits).__name__}")
    self.num_workers = int(num_workers or os.cpu_count() or 1)
    if self.num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    self.limits = limits
    self._config = {"limits": dataclasses.asdict(limits), "network": network,
                    "hidden_paths": list(default_hidden_paths() if hidden_paths is None
                                         else hidden_paths),
                    "disabled": sorted(set(disabled_layers))}
    self._queue = queue.Queue()
    self._closed = False
    self._lock = threading.Lock()
    self.workers_started = 0
    self.sandbox_uids = set()  # Every uid a worker of this pool ran jobs as (for host checks).
    self.isolation_report = {}
    ready = [threading.Event() for _ in range(self.num_workers)]
    errors = []
    self._threads = [threading.Thread(target=self._serve, args=(event, errors), daemon=True,
                                      name=f"sandbox-{i}") for i, event in enumerate(ready)]
    for thread in self._threads:
      thread.start()
    for event in ready:
      event.wait()
    if errors:
      self.close()
      raise errors[0]
    for key, active in _LAYER_ACTIVE.items():
      value = self.isolation_report.get(key, "missing")
      if "disabled)" in value:
        continue  # Switched off on purpose (disabled_layers).
      if not value.startswith(active) or "NOT " in value:
        _log.warning("sandbox isolation layer %r is degraded: %s", key, value)

  @property
  def isolation(self) -> str:
    """Active network isolation: "netns" or "socket-guard"."""
    return self.isolation_report.get("network", "socket-guard")

  def run(self, job: Job) -> ExecResult:
    return self.run_batch([job])[0]

  def run_batch(self, jobs: Sequence[Job]) -> list:
    """Runs jobs on all workers; results come back in the order of `jobs`."""
    jobs = list(jobs)
    for job in jobs:
      _check_job(job)
    if self._closed:
      raise RuntimeError("SandboxPool is closed")
    futures = []
    for job in jobs:
      future = concurrent.futures.Future()
      self._queue.put((job, future))
      futures.append(future)
    return [future.result() for future in futures]

  def close(self):
    """Stops all workers; no sandbox process survives this call."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
    for _ in self._threads:
      self._queue.put(None)
    for thread in self._threads:
      thread.join()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # Worker threads: each owns one worker process and restarts it when needed.

  def _start_worker(self):
    handle = _WorkerHandle(self._config)
    with self._lock:
      self.workers_started += 1
      if handle.uid is not None:
        self.sandbox_uids.add(handle.uid)
      if not self.isolation_report:
        self.isolation_report = dict(handle.isolation)
    return handle

  def _serve(self, ready, errors):
    try:
      handle = self._start_worker()
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
      ready.set()
      return
    ready.set()
    while True:
      item = self._queue.get()
      if item is None:
        break
      job, future = item
      result, healthy = self._run_one(handle, job)
      if not healthy:
        handle.kill()
        try:
          handle = self._start_worker()
        except Exception as e:  # pylint: disable=broad-except
          future.set_result(result)
          self._fail_remaining(f"sandbox worker could not restart: {e}")
          return
      future.set_result(result)
    handle.close()

  def _run_one(self, handle, job):
    timeout = job.timeout_s or self.limits.timeout_s
    start = time.monotonic()
    if isinstance(job, CallJob):
      message = {"kind": "calls", "program": job.program, "entries": job.entries,
                 "names": job.names, "timeout_s": timeout,
                 "second": bool(job.second_interpreter)}
    else:
      message = {"code": job.code, "expr": job.expr, "stdin": job.stdin, "timeout_s": timeout,
                 "prelude": job.prelude}
    try:
      handle.send(message)
    except OSError as e:
      return _sandbox_failure(f"sandbox worker died: {e}"), False
    frame = handle.receive(start + timeout + _WORKER_GRACE_S)
    if frame is None:
      return _sandbox_failure("sandbox worker died or stopped answering",
                              time.monotonic() - start), False
    healthy = not (isinstance(frame, dict) and frame.get("retire"))
    return _result_from_frame(frame, time.monotonic() - start, job), healthy

  def _fail_remaining(self, message):
    while True:
      try:
        item = self._queue.get_nowait()
      except queue.Empty:
        return
      if item is not None:
        item[1].set_result(_sandbox_failure(message))
