"""Sandbox worker: a long-lived process that runs each job in a fresh process with no job data.

Started by `sandbox.SandboxPool` as `python3 -S -s -B sandbox_worker.py` with a
scrubbed environment (a spawned interpreter, not a fork of the trainer). It
talks to the pool over inherited pipes with length-prefixed JSON frames and
never unpickles anything.

Three processes per worker, so that the process running a program never holds
another job's data (the gold answer of a check lives in a different job):

- the worker (trusted) reads jobs from the pool and classifies results;
- the zygote is forked from the worker once, BEFORE any job is read, and only
  ever receives trusted preludes, limits and file descriptors; per job it forks
- a supervisor (trusted, never runs program code), which enters fresh PID, mount
  and IPC namespaces (fresh /tmp, /dev/shm and cwd) and forks the job process
  (PID 1 there). The job process reads its code from a memfd, drops to the
  worker's sandbox uid, applies rlimits and the seccomp deny-list, and runs the
  program in-process (forks instead of an interpreter start).

The job's result comes back as data (str fields only); the worker checks its
shape and decides the status from the exit of the job, so a program can at most
report a value it could also have returned.
"""
import builtins
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import sandbox_isolation as iso  # pylint: disable=g-import-not-at-top
import sandbox_seccomp  # pylint: disable=g-import-not-at-top,unused-import
sys.path.pop()

# Preloaded so programs importing them need no file access after the uid drop.
PRELOAD = ("collections", "itertools", "functools", "math", "re", "heapq", "bisect", "string",
           "operator", "copy", "json", "statistics", "fractions", "decimal", "typing",
           "dataclasses", "enum", "abc", "numbers", "array", "textwrap", "unicodedata",
           "cmath", "queue", "pprint", "ast", "types", "struct", "base64", "binascii",
           "difflib", "keyword", "contextlib", "traceback", "io", "warnings", "weakref",
           "reprlib", "collections.abc", "inspect", "pickle", "socket", "secrets", "hashlib")

_FRAME = struct.Struct(">I")
_MAX_FRAME = 64 << 20
_RESULT_FD = 3
_KILL_GRACE_S = 0.5
_MAX_INLINE_PRELUDE = 128 << 10  # Larger preludes travel in the job's memfd.
_RESULT_KEYS = ("status", "value_repr", "value_text", "error_type", "error_message")
_JOB_STATUSES = ("ok", "error", "memory", "output_too_large")

# Bound at import, before any program runs: the result writer does not look anything up later.
_ENCODE_STR = json.encoder.encode_basestring_ascii
_JOIN = str.join
_WRITE, _EXIT = os.write, os._exit


def read_frame(fd):
  header = _read_exact(fd, _FRAME.size)
  if header is None:
    return None
  (size,) = _FRAME.unpack(header)
  if size > _MAX_FRAME:
    raise ValueError(f"frame too large: {size}")
  return json.loads(_read_exact(fd, size) or b"null")


def _read_exact(fd, size):
  chunks = []
  while size:
    chunk = os.read(fd, size)
    if not chunk:
      return None
    chunks.append(chunk)
    size -= len(chunk)
  return b"".join(chunks)


def write_frame(fd, obj):
  data = json.dumps(obj).encode()
  view = memoryview(_FRAME.pack(len(data)) + data)
  while view:
    view = view[os.write(fd, view):]


def _memfd_with(data: bytes, name="cp_job"):
  fd = os.memfd_create(name, os.MFD_CLOEXEC)
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


# ----------------------------------------------------------------------------
# Inside the job process.


def _socket_guard(event, args):
  del args
  if event.startswith("socket.") and event != "socket.gethostname":
    raise PermissionError(f"network access is disabled in the sandbox ({event})")


def _encode_result(result):
  """JSON text of a flat dict of str/None values, with functions bound at import time."""
  parts = [_ENCODE_STR(key) + ":" + ("null" if value is None else _ENCODE_STR(value))
           for key, value in result.items()]
  return "{" + _JOIN(",", parts) + "}"


def _execute(job, limits, prelude, prelude_src=None):
  """Runs the program and its expression; returns the result dict (never raises).

  The prelude runs first with a snapshot of the builtins taken before any
  program code, so patching the builtins module later does not reach it.
  prelude_src: a prelude still to compile (too large for the zygote, or broken).
  """
  repr_, type_, str_, len_ = builtins.repr, builtins.type, builtins.str, builtins.len
  memory_error, base_exception = MemoryError, BaseException
  result = {"status": "ok", "value_repr": None, "value_text": None, "error_type": None,
            "error_message": None}
  has_prelude = prelude is not None or bool(prelude_src)
  namespace = {"__name__": "__main__",
               "__builtins__": dict(builtins.__dict__) if has_prelude else builtins}
  try:
    if prelude is None and prelude_src:
      prelude = compile(prelude_src, "<prelude>", "exec")
    if prelude is not None:
      exec(prelude, namespace)  # pylint: disable=exec-used
    exec(compile(job["code"], "<program>", "exec"), namespace)  # pylint: disable=exec-used
    if job.get("expr") is not None:
      value = eval(compile(job["expr"], "<expr>", "eval"), namespace)  # pylint: disable=eval-used
      text = repr_(value)
      if type_(text) is not str_:
        raise TypeError("repr did not return a str")
      if len_(text) > limits["result_bytes"]:
        result.update(status="output_too_large", error_type="ResultTooLarge",
                      error_message=f"repr is {len_(text)} chars > {limits['result_bytes']}")
      else:
        result["value_repr"] = text
        if type_(value) is str_:
          result["value_text"] = value
  except memory_error:
    result.update(status="memory", error_type="MemoryError", error_message="memory limit exceeded")
  except base_exception as e:  # SystemExit and KeyboardInterrupt are program errors too.
    try:
      message = str_(e)[:2000]
      if type_(message) is not str_:
        message = "<unprintable>"
    except base_exception:
      message = "<unprintable>"
    result.update(status="error", error_type=type_(e).__name__, error_message=message)
  return result


def _read_all(fd):
  chunks = []
  while True:
    chunk = os.read(fd, 1 << 20)
    if not chunk:
      return b"".join(chunks)
    chunks.append(chunk)


def _job_process(request, fds, flags, prelude_code):
  """Never returns. Runs as PID 1 of fresh namespaces (or a setsid child) with no job data but its own."""
  try:
    os.setsid()
  except OSError:
    pass
  payload = json.loads(_read_all(fds["job"]))
  prelude_src = None if prelude_code is not None else (payload.get("prelude")
                                                       or request.get("prelude"))
  os.dup2(fds["stdin"], 0)
  os.dup2(fds["out"], 1)
  os.dup2(fds["err"], 2)
  os.dup2(fds["res"], _RESULT_FD)
  os.closerange(_RESULT_FD + 1, 1 << 16)
  limits = request["limits"]
  job_dir = iso.JOB_WORKDIR if flags["jobns"] else request["job_dir"]
  os.chdir(job_dir)
  if flags["uid"] is not None:
    iso.drop_privileges(flags["uid"])
  iso.set_parent_death_signal()
  cpu = max(1, int(limits["cpu_time_s"]))
  for rlimit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu),
                        (resource.RLIMIT_AS, limits["memory_bytes"]),
                        (resource.RLIMIT_FSIZE, limits["file_size_bytes"]),
                        (resource.RLIMIT_NOFILE, limits["open_files"]),
                        (resource.RLIMIT_NPROC, limits["processes"])):
    try:
      resource.setrlimit(rlimit, (value, value))
    except (ValueError, OSError):
      pass
  os.environ.clear()
  os.environ.update({"PATH": "/usr/bin:/bin", "HOME": job_dir, "TMPDIR": job_dir,
                     "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"})
  tempfile.tempdir = job_dir
  if not flags["netns"]:
    sys.addaudithook(_socket_guard)
  if flags["seccomp"]:
    try:
      sandbox_seccomp.install()
    except OSError:
      _EXIT(72)  # The worker's probe said it works; refuse to run unfiltered.
  sys.stdin = open(0, "r", closefd=False)
  sys.stdout = open(1, "w", closefd=False)
  sys.stderr = open(2, "w", closefd=False)
  result = _execute(payload, limits, prelude_code, prelude_src)
  del payload
  for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  try:
    view = memoryview(_encode_result(result).encode())
    while view:
      view = view[_WRITE(_RESULT_FD, view):]
  except BaseException:  # pylint: disable=broad-except
    _EXIT(71)
  _EXIT(0)


# ----------------------------------------------------------------------------
# In the zygote and the per-job supervisor.


class Zygote:
  """Forked from the worker before any job; forks one supervisor per request."""

  def __init__(self, sock, flags):
    self.sock, self.flags = sock, flags
    self._preludes = {}

  def _prelude_code(self, source):
    """Trusted setup code, compiled once (compile only; it runs in the job process)."""
    if not source:
      return None
    code = self._preludes.get(source)
    if code is None:
      if len(self._preludes) >= 8:
        self._preludes.clear()
      code = self._preludes[source] = compile(source, "<prelude>", "exec")
    return code

  def serve(self):
    while True:
      try:
        message, fds, _, _ = socket.recv_fds(self.sock, 1 << 18, 8)
      except OSError:
        return
      if not message:
        return
      request = json.loads(message)
      names = ("job", "stdin", "out", "err", "res", "ctl")
      fd_map = dict(zip(names, fds))
      try:
        prelude_code = self._prelude_code(request.get("prelude"))
      except BaseException:  # pylint: disable=broad-except
        prelude_code = None  # Compiled again in the job, which reports the error like any other.
      pid = os.fork()
      if pid == 0:
        try:
          self.sock.close()
          self._supervise(request, fd_map, prelude_code)
        finally:
          os._exit(70)
      for fd in fds:
        os.close(fd)
      # No reply: the supervisor reports to the worker itself. Reaping it here keeps the
      # zygote single-job, like the worker.
      os.waitpid(pid, 0)

  def _supervise(self, request, fds, prelude_code):
    """Makes the job's namespaces, forks the job, reports its pid, CPU time and wait status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    iso.set_parent_death_signal()
    ctl = fds.pop("ctl")
    os.write(ctl, f"spid {os.getpid()}\n".encode())
    try:
      iso.enter_job_namespaces(self.flags)
    except OSError as e:
      os.write(ctl, f"error {e}\n".encode())
      os._exit(0)
    job_pid = os.fork()
    if job_pid == 0:
      os.close(ctl)
      _job_process(request, fds, self.flags, prelude_code)
    for fd in fds.values():
      os.close(fd)
    os.write(ctl, f"pid {job_pid}\n".encode())
    _, status, usage = os.wait4(job_pid, 0)
    # CPU seconds let the worker tell an RLIMIT_CPU kill from other deaths.
    os.write(ctl, f"cpu {usage.ru_utime + usage.ru_stime}\nstatus {status}\n".encode())
    os.close(ctl)
    os._exit(0)


# ----------------------------------------------------------------------------
# In the worker.


class Worker:
  """Runs jobs one at a time; every job gets a fresh process forked from the zygote."""

  def __init__(self, config, pool_fds):
    self.limits = config["limits"]
    self.root = os.path.join(tempfile.gettempdir(), f"cp_sandbox_{os.getpid()}")
    self.report, self.flags = iso.setup_worker_isolation(
        config["network"], config["hidden_paths"], self.root, config.get("disabled") or ())
    for name in PRELOAD:
      try:
        __import__(name)
      except ImportError:
        pass
    self.report["state"] = "fresh process per job, forked from a zygote that holds no job data"
    self.zygote_pid, self.zygote = self._start_zygote(pool_fds)

  def _start_zygote(self, pool_fds):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
      try:
        ours.close()
        for fd in pool_fds:
          os.close(fd)
        iso.set_parent_death_signal()
        Zygote(theirs, self.flags).serve()
      finally:
        os._exit(0)
    theirs.close()
    return pid, ours

  def zygote_alive(self):
    try:
      return os.waitpid(self.zygote_pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
      return False

  def run(self, job):
    limits = dict(self.limits, **(job.get("limits") or {}))
    timeout = float(job.get("timeout_s") or limits["timeout_s"])
    start = time.monotonic()
    job_dir = None
    if not self.flags["jobns"]:
      job_dir = tempfile.mkdtemp(prefix="job_", dir=self.root)
      if self.flags["uid"] is not None:
        os.chown(job_dir, self.flags["uid"], self.flags["uid"])
      os.chmod(job_dir, 0o700)
    try:
      outcome = self._run_in_child(job, limits, job_dir, start + timeout)
    finally:
      if job_dir is not None:
        shutil.rmtree(job_dir, ignore_errors=True)
    outcome["duration_s"] = time.monotonic() - start
    return outcome

  def _run_in_child(self, job, limits, job_dir, deadline):
    prelude = job.get("prelude") or ""
    inline = len(prelude) <= _MAX_INLINE_PRELUDE
    payload = {"code": job["code"], "expr": job.get("expr"), "prelude": None if inline else prelude}
    job_fd = _memfd_with(json.dumps(payload).encode())
    stdin_fd = _memfd_with((job.get("stdin") or "").encode("utf-8", "replace"), "cp_stdin")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    request = {"limits": limits, "job_dir": job_dir, "prelude": prelude if inline else ""}
    child_fds = [job_fd, stdin_fd, out_w, err_w, res_w, ctl_w]
    try:
      socket.send_fds(self.zygote, [json.dumps(request).encode()], child_fds)
    finally:
      for fd in child_fds:
        os.close(fd)
    try:
      return self._collect(ctl_r, out_r, err_r, res_r, limits, deadline)
    finally:
      for fd in (ctl_r, out_r, err_r, res_r):
        os.close(fd)

  def _collect(self, ctl_r, out_r, err_r, res_r, limits, deadline):
    """Reads the job's pipes until the supervisor exits (its control pipe closes)."""
    pid = job_pid = None
    control = bytearray()
    buffers = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    caps = {out_r: limits["output_bytes"], err_r: limits["output_bytes"],
            res_r: 4 * limits["result_bytes"] + 4096}
    killed_for = None
    exited = False
    sel = selectors.DefaultSelector()
    for fd in (ctl_r, out_r, err_r, res_r):
      sel.register(fd, selectors.EVENT_READ)
    drain_until = None
    try:
      while not exited or len(sel.get_map()):
        now = time.monotonic()
        if killed_for is None and not exited and now >= deadline:
          killed_for = "timeout"
          self._kill(pid, job_pid)
          drain_until = now + _KILL_GRACE_S
        if drain_until is not None and now >= drain_until:
          break
        wait = (drain_until if drain_until is not None else deadline) - now
        for key, _ in sel.select(timeout=max(0.0, wait)):
          fd = key.fd
          chunk = os.read(fd, 65536)
          if not chunk:
            sel.unregister(fd)
            if fd == ctl_r:
              exited = True
              if not self.flags["pidns"] and self.flags["uid"] is not None:
                iso.kill_uid(self.flags["uid"])
              drain_until = min(drain_until or float("inf"), time.monotonic() + _KILL_GRACE_S)
            continue
          if fd == ctl_r:
            control += chunk
            for line in control.decode(errors="replace").splitlines():
              if line.startswith("spid "):
                pid = int(line[5:])
              elif line.startswith("pid "):
                job_pid = int(line[4:])
            continue
          buffers[fd] += chunk
          if len(buffers[fd]) > caps[fd] and killed_for is None:
            killed_for = "output_too_large"
            self._kill(pid, job_pid)
            drain_until = time.monotonic() + _KILL_GRACE_S
    finally:
      sel.close()
    if not exited:
      if pid is None:
        # A late supervisor would run against closed pipes: end this worker (the pool replaces it).
        os.kill(self.zygote_pid, signal.SIGKILL)
        raise OSError("the zygote did not start a supervisor")
      self._kill(pid, job_pid)
    if self.flags["uid"] is not None and (killed_for or not self.flags["pidns"]):
      iso.kill_uid(self.flags["uid"])
    cpu_s, status, setup_error = 0.0, None, None
    for line in control.decode(errors="replace").splitlines():
      if line.startswith("cpu "):
        cpu_s = float(line[4:])
      elif line.startswith("status "):
        status = int(line[7:])
      elif line.startswith("error "):
        setup_error = line[6:]
    if setup_error is not None and killed_for is None:
      raise OSError(f"job namespaces: {setup_error}")
    if killed_for is None and cpu_s >= limits["cpu_time_s"] - 0.05 and not buffers[res_r]:
      killed_for = "cpu"
    return _classify(status, killed_for, buffers[out_r], buffers[err_r], buffers[res_r], limits)

  def _kill(self, pid, job_pid):
    for target in (job_pid, pid):
      if target:
        try:
          os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
          pass
    if self.flags["uid"] is not None:
      iso.kill_uid(self.flags["uid"])


def _decode(data, cap):
  return bytes(data[:cap]).decode("utf-8", "replace")


def parse_job_result(res):
  """The job's result dict when `res` is exactly what the job writer produces, else None.

  Only str/None fields, a known status, and value_text consistent with value_repr
  (value_text is set only for str values, whose repr the worker recomputes).
  """
  try:
    parsed = json.loads(bytes(res).decode("utf-8"))
  except Exception:  # pylint: disable=broad-except  (deep nesting, bad UTF-8, bad JSON)
    return None
  if not isinstance(parsed, dict) or set(parsed) != set(_RESULT_KEYS):
    return None
  if any(v is not None and not isinstance(v, str) for v in parsed.values()):
    return None
  if parsed["status"] not in _JOB_STATUSES:
    return None
  if parsed["value_text"] is not None and parsed["value_repr"] != repr(parsed["value_text"]):
    return None
  if parsed["status"] == "ok" and parsed["error_type"] is not None:
    return None
  return parsed


def _classify(status, killed_for, out, err, res, limits):
  cap = limits["output_bytes"]
  result = {"status": "error", "value_repr": None, "value_text": None, "error_type": None,
            "error_message": None, "stdout": _decode(out, cap), "stderr": _decode(err, cap)}
  code = os.waitstatus_to_exitcode(status) if status is not None else None
  signum = -code if code is not None and code < 0 else None
  if killed_for == "timeout":
    result.update(status="timeout", error_type="Timeout", error_message="wall-clock limit exceeded")
  elif killed_for == "output_too_large":
    result.update(status="output_too_large", error_type="OutputTooLarge",
                  error_message=f"output exceeded {cap} bytes")
  elif killed_for == "cpu" or (signum == signal.SIGXCPU and not res):
    result.update(status="timeout", error_type="CpuTimeLimit",
                  error_message="CPU-time limit exceeded")
  elif code is None:
    result.update(error_type="Crash", error_message="job supervisor died")
  elif signum:
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else signum
    result.update(error_type="Crash", error_message=f"killed by signal {name}")
  else:
    parsed = parse_job_result(res) if res and code == 0 else None
    if parsed is None:
      result.update(error_type="NoResult" if not res else "BadResult",
                    error_message=f"process exited with code {code} without a valid result")
    else:
      result.update({key: parsed[key] for key in _RESULT_KEYS})
  if len(out) > cap or len(err) > cap:
    result.update(status="output_too_large", error_type="OutputTooLarge",
                  error_message=f"output exceeded {cap} bytes")
  return result


def main():
  in_fd, out_fd = os.dup(0), os.dup(1)
  devnull = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1):
    os.dup2(devnull, fd)
  iso.set_parent_death_signal()
  config = read_frame(in_fd)
  try:
    worker = Worker(config, (in_fd, out_fd))
  except Exception as e:  # pylint: disable=broad-except
    write_frame(out_fd, {"ready": False, "error": f"{type(e).__name__}: {e}"})
    return
  write_frame(out_fd, {"ready": True, "isolation": worker.report, "pid": os.getpid()})
  while True:
    job = read_frame(in_fd)
    if job is None:
      break
    try:
      outcome = worker.run(job)
    except Exception as e:  # pylint: disable=broad-except
      outcome = {"status": "error", "value_repr": None, "value_text": None, "stdout": "",
                 "stderr": "", "error_type": "SandboxError", "error_message": f"{e}"[:2000],
                 "duration_s": 0.0}
    write_frame(out_fd, outcome)
    del job, outcome
    if not worker.zygote_alive():
      break  # The pool sees EOF and starts a fresh worker.
  worker.zygote.close()
  shutil.rmtree(worker.root, ignore_errors=True)


if __name__ == "__main__":
  main()
