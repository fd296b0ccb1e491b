"""Sandbox zygote: forks one job process per request; never holds job data.

Spawned by the worker as a fresh interpreter (`python3 -S -s -B sandbox_zygote.py PROFILE ...`)
right after the worker enters its namespaces and before it hides the checkout (this file's
directory), so it is small (forking costs in proportion to the parent's memory) and holds only
what its profile needs, loaded before any job:

- "calls": the restricted runtime (`sandbox_runtime.Runtime`: allowed modules, proxies, encoder);
- "generic": the PRELOAD modules, so that plain `Job`s import them without file access.

Per request (limits and descriptors only, marshalled by the trusted worker; the job's code and
inputs travel in a memfd that only the job process reads) it makes a fresh PID namespace (`unshare(CLONE_NEWPID)`, fork, then
`setns` back to its own), forks the job process as PID 1 there, reports its pid, waits for it and
reports its wait status and CPU time on the control pipe.

The job process (never returns): generic jobs enter fresh mount and IPC namespaces (own /tmp,
/dev/shm, cwd); then setsid, stdio onto the job's pipes, every other descriptor closed, the
sandbox uid, a parent-death signal, rlimits, an empty environment, the profile's seccomp filter,
and the program. Its result is one frame on descriptor 3: a 32-hex-digit keyed BLAKE2b tag of the
body (key: 16 random bytes from the worker, in the job's memfd), then the body. A frame the
program wrote itself without the key is rejected by the worker.
"""
import gc
import json
import marshal
import os
import resource
import signal
import socket
import sys

sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import sandbox_isolation as iso  # pylint: disable=g-import-not-at-top
import sandbox_seccomp  # pylint: disable=g-import-not-at-top
import sandbox_values  # pylint: disable=g-import-not-at-top
from _blake2 import blake2b  # pylint: disable=g-import-not-at-top

# Preloaded by the generic zygote so programs importing them need no file access after the uid drop.
PRELOAD = ("collections", "itertools", "functools", "math", "re", "heapq", "bisect", "string",
           "operator", "copy", "json", "statistics", "fractions", "decimal", "typing",
           "dataclasses", "enum", "abc", "numbers", "array", "textwrap", "unicodedata",
           "cmath", "queue", "pprint", "ast", "types", "struct", "base64", "binascii",
           "difflib", "keyword", "contextlib", "traceback", "io", "warnings", "weakref",
           "reprlib", "collections.abc", "inspect", "pickle", "socket", "secrets", "hashlib")
RESULT_FD = 3
MAC_HEX = 32
FD_NAMES = ("job", "stdin", "out", "err", "res", "ctl")
_RESULT_KEYS = ("status", "value_repr", "value_text", "error_type", "error_message")

# Bound at import, before any program runs: the result writer looks nothing up later.
_ENCODE_STR = json.encoder.c_encode_basestring_ascii or json.encoder.encode_basestring_ascii
_JOIN = str.join
_WRITE, _EXIT = os.write, os._exit
_BLAKE2B = blake2b
_tempfile = None  # The generic profile imports tempfile (to point it at the job's dir).


def mac(key, data):
  """The frame tag: keyed BLAKE2b (16 bytes) of data, as 32 hex digits."""
  return _BLAKE2B(data, key=key, digest_size=MAC_HEX // 2).hexdigest()


def _read_all(fd):
  chunks = []
  while True:
    chunk = os.read(fd, 1 << 20)
    if not chunk:
      return b"".join(chunks)
    chunks.append(chunk)


def _socket_guard(event, args):
  del args
  if event.startswith("socket.") and event != "socket.gethostname":
    raise PermissionError(f"network access is disabled in the sandbox ({event})")


# ----------------------------------------------------------------------------
# Generic jobs: `code`, then repr(eval(expr)).


def _generic_body(job, limits, prelude, prelude_src=None):
  """JSON text of the result of a generic job (never raises).

  The prelude runs first with a snapshot of the builtins taken before any program code, so
  patching the builtins module later does not reach it. prelude_src: a prelude still to compile.
  """
  import builtins  # pylint: disable=g-import-not-at-top
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
  parts = [_ENCODE_STR(key) + ":" + ("null" if result[key] is None else _ENCODE_STR(result[key]))
           for key in _RESULT_KEYS]
  return "{" + _JOIN(",", parts) + "}"


# ----------------------------------------------------------------------------
# The job process.


def _job_process(request, fds, flags, profile, runtime, prelude_code):
  """Never returns. PID 1 of a fresh PID namespace (or a setsid child) with no data but its job's."""
  try:
    os.setsid()
  except OSError:
    pass
  ctl = fds.pop("ctl")
  if profile == "generic" and (flags["jobns"] or flags["ipcns"]):
    try:
      iso.enter_job_namespaces(flags)
    except OSError as e:
      os.write(ctl, f"error {e}\n".encode())
      _EXIT(0)
  os.close(ctl)
  payload = marshal.loads(_read_all(fds["job"]))  # Written by the trusted worker.
  key = bytes.fromhex(payload.pop("key"))
  prelude_src = None if prelude_code is not None else (payload.get("prelude")
                                                       or request.get("prelude"))
  os.dup2(fds["stdin"], 0)
  os.dup2(fds["out"], 1)
  os.dup2(fds["err"], 2)
  os.dup2(fds["res"], RESULT_FD)
  os.closerange(RESULT_FD + 1, 1 << 16)
  limits = request["limits"]
  if profile == "calls":
    job_dir = "/"  # Read-only: a call job has no writable path at all.
  else:
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
  if profile == "generic":  # (The zygote's own environment is already the scrubbed one.)
    os.environ.update({"HOME": job_dir, "TMPDIR": job_dir})
    _tempfile.tempdir = job_dir
  if not flags["netns"]:
    sys.addaudithook(_socket_guard)
  # sys.stdin/stdout/stderr were opened on descriptors 0-2 by the zygote: they now write to the
  # job's pipes (nothing was buffered at fork).
  # A determinism check (an entry called more than once: a gold) runs at a random shift of the
  # zygote's address layout (sandbox_values.jitter); drawn before the filter (getrandom).
  if profile == "calls" and any(entry[2] > 1 for entry in payload["entries"]):
    sandbox_values.begin_jitter(os.urandom(sandbox_values.JITTER_NOISE_BYTES))
  if flags["seccomp"]:
    try:
      sandbox_seccomp.install(profile)
    except OSError:
      _EXIT(72)  # The worker's probe said it works; refuse to run unfiltered.
  if profile == "calls":
    body = runtime.run(payload, limits["result_bytes"])
  else:
    body = _generic_body(payload, limits, prelude_code, prelude_src)
  del payload
  for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  try:
    data = body.encode()
    view = memoryview(mac(key, data).encode() + data)
    while view:
      view = view[_WRITE(RESULT_FD, view):]
  except BaseException:  # pylint: disable=broad-except
    _EXIT(71)
  _EXIT(0)


class Zygote:
  """Forks one job process per request, each PID 1 of a fresh PID namespace."""

  def __init__(self, sock, profile):
    self.sock, self.profile = sock, profile
    self.flags, self.pidns_fd = None, None
    self._preludes = {}
    self.runtime = None
    if profile == "calls":
      import sandbox_runtime  # pylint: disable=g-import-not-at-top
      self.runtime = sandbox_runtime.Runtime()
    else:
      global _tempfile
      import tempfile as _tempfile  # pylint: disable=g-import-not-at-top,redefined-outer-name
      for name in PRELOAD:
        try:
          __import__(name)
        except ImportError:
          pass

  def configure(self):
    """Receives the worker's layer flags (and its PID namespace) once its setup is done."""
    message, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
    self.flags = json.loads(message)
    self.pidns_fd = fds[0] if fds else None
    if self.flags["seccomp"]:
      sandbox_seccomp.prepare(self.profile)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": "/", "TMPDIR": "/", "LANG": "C.UTF-8",
                       "PYTHONHASHSEED": "0"})
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    gc.collect()
    gc.freeze()  # Jobs' collections skip the zygote's objects (fewer copied pages per job).

  def _prelude_code(self, source):
    """Trusted setup code, compiled once (compile only; it runs in the job process)."""
    if not source or self.profile != "generic":
      return None
    code = self._preludes.get(source)
    if code is None:
      if len(self._preludes) >= 8:
        self._preludes.clear()
      code = self._preludes[source] = compile(source, "<prelude>", "exec")
    return code

  def serve(self):
    self.sock.send(b"ready")
    while True:
      try:
        message, fds, _, _ = socket.recv_fds(self.sock, 1 << 18, len(FD_NAMES))
      except OSError:
        return
      if not message:
        return
      request = marshal.loads(message)  # From the trusted worker: limits and flags only.
      fd_map = dict(zip(FD_NAMES, fds))
      ctl = fd_map["ctl"]
      try:
        prelude_code = self._prelude_code(request.get("prelude"))
      except BaseException:  # pylint: disable=broad-except
        prelude_code = None  # Compiled again in the job, which reports the error like any other.
      pid = self._fork(request, fd_map, prelude_code)
      for fd in fds:
        if fd != ctl:
          os.close(fd)
      if pid is None:
        os.close(ctl)
        continue
      os.write(ctl, f"pid {pid}\n".encode())
      _, status, usage = os.wait4(pid, 0)
      # CPU seconds let the worker tell an RLIMIT_CPU kill from other deaths.
      os.write(ctl, f"cpu {usage.ru_utime + usage.ru_stime}\nstatus {status}\n".encode())
      os.close(ctl)

  def _fork(self, request, fd_map, prelude_code):
    """The job's pid (in this namespace), or None after reporting why no job started."""
    pidns = self.flags["pidns"]
    try:
      if pidns:
        iso.unshare(iso.CLONE_NEWPID)
      pid = os.fork()
    except OSError as e:
      os.write(fd_map["ctl"], f"error {e}\n".encode())
      pid = None
    if pid == 0:
      try:
        self.sock.close()
        if self.pidns_fd is not None:
          os.close(self.pidns_fd)
        _job_process(request, fd_map, self.flags, self.profile, self.runtime, prelude_code)
      finally:
        os._exit(70)
    if pidns:
      iso.setns(self.pidns_fd, iso.CLONE_NEWPID)  # Raises (and ends this zygote) if it fails.
    return pid


def main():
  profile, sock_fd, worker_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
  iso.set_parent_death_signal()
  if os.getppid() != worker_pid:
    return  # The worker died before the parent-death signal was set.
  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  sock = socket.socket(fileno=sock_fd)
  zygote = Zygote(sock, profile)
  sock.send(b"loaded")
  zygote.configure()
  zygote.serve()


if __name__ == "__main__":
  main()
