"""Sandbox worker: a long-lived process that runs each job in a fresh forked child.

Started by `sandbox.SandboxPool` as `python3 -S -s -B sandbox_worker.py` with a
scrubbed environment (a spawned interpreter, not a fork of the trainer). It
talks to the pool over inherited pipes with length-prefixed JSON frames and
never unpickles anything. Per job it forks a supervisor that enters a fresh PID
namespace and forks the job process (PID 1 there, so killing it kills every
process the program started). The job process drops to a per-worker uid,
applies rlimits, enters an empty temp dir and executes the program in-process
(no exec, so a job costs a fork instead of an interpreter start).
"""
import builtins
import json
import os
import resource
import selectors
import shutil
import signal
import struct
import sys
import tempfile
import time

sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import sandbox_isolation as iso  # pylint: disable=g-import-not-at-top
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


# ----------------------------------------------------------------------------
# Inside the job process.


def _socket_guard(event, args):
  del args
  if event.startswith("socket.") and event != "socket.gethostname":
    raise PermissionError(f"network access is disabled in the sandbox ({event})")


def _execute(job, limits, prelude):
  """Runs the program and its expression; returns the result dict (never raises)."""
  repr_, type_, str_, len_ = builtins.repr, builtins.type, builtins.str, builtins.len
  memory_error, base_exception = MemoryError, BaseException
  result = {"status": "ok", "value_repr": None, "value_text": None, "error_type": None,
            "error_message": None}
  namespace = {"__name__": "__main__", "__builtins__": builtins}
  try:
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
    except base_exception:
      message = "<unprintable>"
    result.update(status="error", error_type=type_(e).__name__, error_message=message)
  return result


def _job_process(job, limits, flags, fds, job_dir, prelude):
  """Never returns. Runs as PID 1 of a fresh namespace (or a setsid child)."""
  try:
    os.setsid()
  except OSError:
    pass
  os.dup2(fds["stdin"], 0)
  os.dup2(fds["out"], 1)
  os.dup2(fds["err"], 2)
  os.dup2(fds["res"], _RESULT_FD)
  os.closerange(_RESULT_FD + 1, 1 << 16)
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
    soft, hard = value if isinstance(value, tuple) else (value, value)
    try:
      resource.setrlimit(rlimit, (soft, hard))
    except (ValueError, OSError):
      pass
  os.environ.clear()
  os.environ.update({"PATH": "/usr/bin:/bin", "HOME": job_dir, "TMPDIR": job_dir,
                     "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"})
  tempfile.tempdir = job_dir
  if not flags["netns"]:
    sys.addaudithook(_socket_guard)
  sys.stdin = open(0, "r", closefd=False)
  sys.stdout = open(1, "w", closefd=False)
  sys.stderr = open(2, "w", closefd=False)
  result = _execute(job, limits, prelude)
  write, dumps, exit_ = os.write, json.dumps, os._exit
  for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  try:
    view = memoryview(dumps(result).encode())
    while view:
      view = view[write(_RESULT_FD, view):]
  except BaseException:  # pylint: disable=broad-except
    exit_(71)
  exit_(0)


# ----------------------------------------------------------------------------
# In the worker.


class Worker:
  """Runs jobs one at a time; every job gets a fresh child and temp dir."""

  def __init__(self, config):
    self.limits = config["limits"]
    self.root = os.path.join(tempfile.gettempdir(), f"cp_sandbox_{os.getpid()}")
    self.report, self.flags = iso.setup_worker_isolation(
        config["network"], config["hidden_paths"], self.root)
    self._preludes = {}
    for name in PRELOAD:
      try:
        __import__(name)
      except ImportError:
        pass

  def _prelude_code(self, job):
    """Trusted setup code, compiled once per worker (compile only; it runs in the child)."""
    source = job.get("prelude") or ""
    if not source:
      return None
    code = self._preludes.get(source)
    if code is None:
      if len(self._preludes) >= 8:
        self._preludes.clear()
      code = self._preludes[source] = compile(source, "<prelude>", "exec")
    return code

  def run(self, job):
    limits = dict(self.limits, **(job.get("limits") or {}))
    timeout = float(job.get("timeout_s") or limits["timeout_s"])
    start = time.monotonic()
    job_dir = tempfile.mkdtemp(prefix="job_", dir=self.root)
    try:
      if self.flags["uid"] is not None:
        os.chown(job_dir, self.flags["uid"], self.flags["uid"])
      os.chmod(job_dir, 0o700)
      outcome = self._run_in_child(job, limits, job_dir, start + timeout)
    finally:
      shutil.rmtree(job_dir, ignore_errors=True)
    outcome["duration_s"] = time.monotonic() - start
    return outcome

  def _stdin_fd(self, text):
    fd, path = tempfile.mkstemp(dir=self.root)
    os.unlink(path)
    data = text.encode()
    view = memoryview(data)
    while view:
      view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

  def _run_in_child(self, job, limits, job_dir, deadline):
    stdin_fd = self._stdin_fd(job.get("stdin") or "")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    fds = {"stdin": stdin_fd, "out": out_w, "err": err_w, "res": res_w}
    pid = os.fork()
    if pid == 0:
      try:
        os.close(ctl_r)
        for fd in (out_r, err_r, res_r):
          os.close(fd)
        self._supervise(job, limits, fds, job_dir, ctl_w)
      finally:
        os._exit(70)
    for fd in (stdin_fd, out_w, err_w, res_w, ctl_w):
      os.close(fd)
    try:
      return self._collect(pid, ctl_r, out_r, err_r, res_r, limits, deadline)
    finally:
      for fd in (ctl_r, out_r, err_r, res_r):
        os.close(fd)

  def _supervise(self, job, limits, fds, job_dir, ctl_w):
    """Supervisor child: makes the PID namespace, forks the job, relays its status."""
    iso.set_parent_death_signal()
    if self.flags["pidns"]:
      iso.unshare(iso.CLONE_NEWPID)
    job_pid = os.fork()
    if job_pid == 0:
      os.close(ctl_w)
      _job_process(job, limits, self.flags, fds, job_dir, self._prelude_code(job))
    for fd in fds.values():
      os.close(fd)
    os.write(ctl_w, f"pid {job_pid}\n".encode())
    _, status, usage = os.wait4(job_pid, 0)
    # CPU seconds let the worker tell an RLIMIT_CPU kill from other deaths.
    os.write(ctl_w, f"cpu {usage.ru_utime + usage.ru_stime}\n".encode())
    os.close(ctl_w)
    if os.WIFSIGNALED(status):
      os._exit(128 + os.WTERMSIG(status))
    os._exit(min(os.WEXITSTATUS(status), 127))

  def _collect(self, pid, ctl_r, out_r, err_r, res_r, limits, deadline):
    job_pid = None
    control = bytearray()
    buffers = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    caps = {out_r: limits["output_bytes"], err_r: limits["output_bytes"],
            res_r: 4 * limits["result_bytes"] + 4096}
    killed_for = None
    status = None
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    for fd in (ctl_r, out_r, err_r, res_r, pidfd):
      sel.register(fd, selectors.EVENT_READ)
    open_fds = {ctl_r, out_r, err_r, res_r}
    drain_until = None
    try:
      while open_fds:
        now = time.monotonic()
        if killed_for is None and status is None and now >= deadline:
          killed_for = "timeout"
          self._kill(pid, job_pid)
          drain_until = now + _KILL_GRACE_S
        if drain_until is not None and now >= drain_until:
          break
        wait = (drain_until if drain_until is not None else deadline) - now
        for key, _ in sel.select(timeout=max(0.0, wait)):
          fd = key.fd
          if fd == pidfd:
            sel.unregister(pidfd)
            status = os.waitpid(pid, 0)[1]
            if not self.flags["pidns"] and self.flags["uid"] is not None:
              iso.kill_uid(self.flags["uid"])
            drain_until = min(drain_until or float("inf"), time.monotonic() + _KILL_GRACE_S)
            continue
          chunk = os.read(fd, 65536)
          if not chunk:
            sel.unregister(fd)
            open_fds.discard(fd)
            continue
          if fd == ctl_r:
            control += chunk
            for line in control.decode(errors="replace").splitlines():
              if line.startswith("pid "):
                job_pid = int(line[4:])
            continue
          buffers[fd] += chunk
          if len(buffers[fd]) > caps[fd] and killed_for is None:
            killed_for = "output_too_large"
            self._kill(pid, job_pid)
            drain_until = time.monotonic() + _KILL_GRACE_S
      if status is None and killed_for is None:
        # Pipes closed first; give the supervisor until the deadline to exit.
        wait = max(0.0, deadline - time.monotonic()) + _KILL_GRACE_S
        if not sel.select(timeout=wait):
          killed_for = "timeout"
    finally:
      sel.close()
      os.close(pidfd)
    if status is None:
      if killed_for is not None:
        self._kill(pid, job_pid)
      status = os.waitpid(pid, 0)[1]
    if self.flags["uid"] is not None and (killed_for or not self.flags["pidns"]):
      iso.kill_uid(self.flags["uid"])
    cpu_s = 0.0
    for line in control.decode(errors="replace").splitlines():
      if line.startswith("cpu "):
        cpu_s = float(line[4:])
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


def _classify(status, killed_for, out, err, res, limits):
  cap = limits["output_bytes"]
  result = {"status": "error", "value_repr": None, "value_text": None, "error_type": None,
            "error_message": None, "stdout": _decode(out, cap), "stderr": _decode(err, cap)}
  code = os.waitstatus_to_exitcode(status)
  signum = code - 128 if code > 128 else (-code if code < 0 else None)
  if killed_for == "timeout":
    result.update(status="timeout", error_type="Timeout", error_message="wall-clock limit exceeded")
  elif killed_for == "output_too_large":
    result.update(status="output_too_large", error_type="OutputTooLarge",
                  error_message=f"output exceeded {cap} bytes")
  elif killed_for == "cpu" or (signum == signal.SIGXCPU and not res):
    result.update(status="timeout", error_type="CpuTimeLimit",
                  error_message="CPU-time limit exceeded")
  elif signum:
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else signum
    result.update(error_type="Crash", error_message=f"killed by signal {name}")
  else:
    try:
      parsed = json.loads(bytes(res).decode()) if res else None
    except (ValueError, UnicodeDecodeError):
      parsed = None
    if not isinstance(parsed, dict) or parsed.get("status") not in (
        "ok", "error", "memory", "output_too_large"):
      result.update(error_type="NoResult" if not res else "BadResult",
                    error_message=f"process exited with code {code} without a valid result")
    else:
      for key in ("status", "value_repr", "value_text", "error_type", "error_message"):
        value = parsed.get(key)
        result[key] = value if value is None or isinstance(value, str) else str(value)
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
    worker = Worker(config)
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
  shutil.rmtree(worker.root, ignore_errors=True)


if __name__ == "__main__":
  main()
