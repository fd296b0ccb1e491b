"""Sandbox worker: a long-lived process that runs each job in a fresh process with no job data.

Started by `sandbox.SandboxPool` as `python3 -S -s -B sandbox_worker.py` with a
scrubbed environment (a spawned interpreter, not a fork of the trainer). It
talks to the pool over inherited pipes with length-prefixed JSON frames and
never unpickles anything.

Per worker, once: private network and mount namespaces (`sandbox_isolation.py`). Then one
zygote per job kind (`sandbox_zygote.py`, a fresh small interpreter spawned on first use):
"calls" for restricted call jobs (`sandbox_runtime.py`), "generic" for plain jobs, and "calls2",
a second call-job interpreter with another (fixed) hash seed for a gold's second run
(`CallJob.second_interpreter`, docs/coding_tasks.md "Determinism across jobs"). Per job the
worker puts the job (with a fresh 16-byte key) in a memfd, hands it with fresh pipes to the
zygote, which forks the job process as PID 1 of a fresh PID namespace, and reads the pipes with
caps and a deadline. The job's result frame must carry the key's tag and the exact shape the
trusted writer produces; the worker decides timeout/memory/crash itself from the job's exit.
"""
import hmac
import json
import marshal
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import sandbox_isolation as iso  # pylint: disable=g-import-not-at-top
import sandbox_runtime  # pylint: disable=g-import-not-at-top
import sandbox_zygote  # pylint: disable=g-import-not-at-top
sys.path.pop()

_FRAME = struct.Struct(">I")
_MAX_FRAME = 64 << 20
_KILL_GRACE_S = 0.5
_ZYGOTE_START_S = 60.0
_MAX_INLINE_PRELUDE = 128 << 10  # Larger preludes travel in the job's memfd.
_ZYGOTE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_zygote.py")
_RESULT_KEYS = ("status", "value_repr", "value_text", "error_type", "error_message")
_JOB_STATUSES = ("ok", "error", "memory", "output_too_large")
_CALL_STATUSES = ("ok", "error", "memory")
PRELOAD = sandbox_zygote.PRELOAD


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


# PYTHONHASHSEED of the second call-job interpreter ("calls2"); any fixed value other than the first's 0.
SECOND_HASH_SEED = 2_654_435_761


class _ZygoteHandle:
  """A spawned zygote of one profile and the socket that feeds it."""

  def __init__(self, profile, hash_seed=0):
    """Spawns it (before the checkout is hidden); `loaded` waits for its modules."""
    self.profile = profile
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": str(hash_seed)}
    self.proc = subprocess.Popen(
        [sys.executable, "-S", "-s", "-B", _ZYGOTE_SCRIPT, profile, str(theirs.fileno()),
         str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=[theirs.fileno()], env=env, cwd="/", close_fds=True)
    theirs.close()
    self.sock = ours

  def loaded(self):
    self._expect(b"loaded")
    return self

  def configure(self, flags):
    """Sends the layer flags and the worker's PID namespace; waits until it serves."""
    pidns_fd = flags.get("pidns_fd")
    plain = json.dumps({k: v for k, v in flags.items() if k != "pidns_fd"}).encode()
    socket.send_fds(self.sock, [plain], [pidns_fd] if pidns_fd is not None else [])
    self._expect(b"ready")

  def _expect(self, word):
    self.sock.settimeout(_ZYGOTE_START_S)
    try:
      hello = self.sock.recv(16)
    except OSError:
      hello = b""
    self.sock.settimeout(None)
    if hello != word:
      self.kill()
      raise OSError(f"the {self.profile} zygote did not start")

  def alive(self, wait_s=0.0):
    try:
      self.proc.wait(timeout=wait_s) if wait_s else self.proc.poll()
    except subprocess.TimeoutExpired:
      pass
    return self.proc.returncode is None

  def kill(self):
    try:
      self.proc.kill()
    except OSError:
      pass
    try:
      self.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      pass
    self.sock.close()


class Worker:
  """Runs jobs one at a time; every job gets a fresh process forked from its kind's zygote."""

  def __init__(self, config):
    self.limits = config["limits"]
    self.root = os.path.join(tempfile.gettempdir(), f"cp_sandbox_{os.getpid()}")
    self.zygotes = {}
    try:
      self.report, self.flags = iso.setup_worker_isolation(
          config["network"], config["hidden_paths"], self.root, config.get("disabled") or (),
          on_namespaces=self._spawn_zygotes)
      if not self.zygotes:
        self._spawn_zygotes()
      for handle in self.zygotes.values():
        handle.configure(self.flags)
    except BaseException:
      self.close()
      raise
    self.report["state"] = ("fresh process per job, forked from a zygote (one per job kind, "
                            "a fresh interpreter) that holds no job data")

  def _spawn_zygotes(self):
    """In the worker's namespaces, before the checkout is hidden (the zygote's files live there)."""
    # "calls2", for call jobs with `second_interpreter` (a gold's second run): its own exec (address
    # layout) and another hash seed, where str hashes (and so the order of a set of str) differ from
    # "calls". The seed is fixed, not drawn: a program whose value follows the hash seed then gets the
    # same verdict on every worker and in every run (same-seed reruns and resumes stay identical).
    for name, profile, hash_seed in (("calls", "calls", 0), ("generic", "generic", 0),
                                     ("calls2", "calls", SECOND_HASH_SEED)):
      self.zygotes[name] = _ZygoteHandle(profile, hash_seed)  # All load at once.
    for handle in self.zygotes.values():
      handle.loaded()

  def zygote(self, profile):
    handle = self.zygotes[profile]
    if not handle.alive():
      raise OSError(f"the {profile} zygote died")  # The pool replaces this worker.
    return handle

  def alive(self):
    return all(handle.alive() for handle in self.zygotes.values())

  def close(self):
    for handle in self.zygotes.values():
      handle.kill()
    shutil.rmtree(self.root, ignore_errors=True)

  def run(self, job):
    limits = dict(self.limits, **(job.get("limits") or {}))
    kind = job.get("kind") or "generic"
    zygote = self.zygote(("calls2" if job.get("second") else "calls") if kind == "calls"
                         else "generic")
    timeout = float(job.get("timeout_s") or limits["timeout_s"])
    start = time.monotonic()
    job_dir = None
    if kind != "calls" and not self.flags["jobns"]:
      job_dir = tempfile.mkdtemp(prefix="job_", dir=self.root)
      if self.flags["uid"] is not None:
        os.chown(job_dir, self.flags["uid"], self.flags["uid"])
      os.chmod(job_dir, 0o700)
    try:
      outcome = self._run_in_child(zygote, job, kind, limits, job_dir, start + timeout)
    finally:
      if job_dir is not None:
        shutil.rmtree(job_dir, ignore_errors=True)
    outcome["duration_s"] = time.monotonic() - start
    return outcome

  def _run_in_child(self, zygote, job, kind, limits, job_dir, deadline):
    key = os.urandom(16)
    if kind == "calls":
      entries = [[str(k), str(t), int(r)] for k, t, r in job["entries"]]
      payload, refused = _prepared(job.get("program"), entries, bool(job.get("names")))
      if refused is not None:
        return refused  # Refused by the rules (or unparsable): no process is started at all.
      payload["key"] = key.hex()
      request = {"limits": limits}
      shape = [r for _, _, r in entries]
    else:
      prelude = job.get("prelude") or ""
      inline = len(prelude) <= _MAX_INLINE_PRELUDE
      payload = {"key": key.hex(), "code": job["code"], "expr": job.get("expr"),
                 "prelude": None if inline else prelude}
      request = {"limits": limits, "job_dir": job_dir, "prelude": prelude if inline else ""}
      shape = None
    job_fd = _memfd_with(marshal.dumps(payload))
    stdin = (job.get("stdin") or "").encode("utf-8", "replace")
    # A call job reads no stdin: its descriptor 0 is the job's memfd, read to the end already.
    stdin_fd = _memfd_with(stdin, "cp_stdin") if kind != "calls" else os.dup(job_fd)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    child_fds = [job_fd, stdin_fd, out_w, err_w, res_w, ctl_w]
    try:
      socket.send_fds(zygote.sock, [marshal.dumps(request)], child_fds)
    finally:
      for fd in child_fds:
        os.close(fd)
    res_cap = (len(shape) + sum(shape) + 1) * (limits["result_bytes"] + 512) if shape else (
        4 * limits["result_bytes"] + 4096)
    try:
      return self._collect(zygote, ctl_r, out_r, err_r, res_r, limits, deadline, res_cap, key,
                           shape)
    finally:
      for fd in (ctl_r, out_r, err_r, res_r):
        os.close(fd)

  def _collect(self, zygote, ctl_r, out_r, err_r, res_r, limits, deadline, res_cap, key, shape):
    """Reads the job's pipes until the zygote has reaped it (the control pipe closes)."""
    job_pid = None
    control = bytearray()
    buffers = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    caps = {out_r: limits["output_bytes"], err_r: limits["output_bytes"], res_r: res_cap}
    killed_for = None
    exited = False
    poller = select.poll()  # (select.poll, not selectors: less work per job in this loop)
    open_fds = {ctl_r, out_r, err_r, res_r}
    for fd in open_fds:
      poller.register(fd, select.POLLIN)
    drain_until = None
    try:
      while not exited or open_fds:
        now = time.monotonic()
        if killed_for is None and not exited and now >= deadline:
          killed_for = "timeout"
          self._kill(job_pid)
          drain_until = now + _KILL_GRACE_S
        if drain_until is not None and now >= drain_until:
          break
        wait = (drain_until if drain_until is not None else deadline) - now
        for fd, _ in poller.poll(max(0.0, wait) * 1000):
          chunk = os.read(fd, 65536)
          if not chunk:
            poller.unregister(fd)
            open_fds.discard(fd)
            if fd == ctl_r:
              exited = True
              if not self.flags["pidns"] and self.flags["uid"] is not None:
                iso.kill_uid(self.flags["uid"])
              drain_until = min(drain_until or float("inf"), time.monotonic() + _KILL_GRACE_S)
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
            self._kill(job_pid)
            drain_until = time.monotonic() + _KILL_GRACE_S
    finally:
      del poller
    if not exited:
      if job_pid is None:
        # The zygote never started the job: end it (a fresh one is spawned for the next job).
        zygote.kill()
        raise OSError("the zygote did not start the job")
      self._kill(job_pid)
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
      raise OSError(f"job setup: {setup_error}")
    if status is None and killed_for is None and not zygote.alive(wait_s=0.5):
      raise OSError(f"the {zygote.profile} zygote died")  # Not the program's doing.
    if killed_for is None and cpu_s >= limits["cpu_time_s"] - 0.05 and not buffers[res_r]:
      killed_for = "cpu"
    return _classify(status, killed_for, buffers[out_r], buffers[err_r], buffers[res_r], limits,
                     key, shape)

  def _kill(self, job_pid):
    if job_pid:
      try:
        os.kill(job_pid, signal.SIGKILL)  # PID 1 of its namespace: every process there dies.
      except ProcessLookupError:
        pass
    if self.flags["uid"] is not None:
      iso.kill_uid(self.flags["uid"])


def _prepared(program, entries, names):
  """(job payload, None), or (None, the job's result) when the program is refused.

  The worker checks and compiles (trusted, warm); the job process only runs code objects. The
  rules are applied to the very trees compiled (sandbox_runtime.prepare)."""
  try:
    return sandbox_runtime.prepare(program, entries, names), None
  except MemoryError:
    status, error_type, message = "memory", "MemoryError", "memory limit exceeded"
  except BaseException as e:  # pylint: disable=broad-except  (SyntaxError, RecursionError, ...)
    status, error_type, message = "error", type(e).__name__, str(e)[:300]
  return None, {"status": status, "value_repr": None, "value_text": None, "error_type": error_type,
                "error_message": message, "stdout": "", "stderr": ""}


def _decode(data, cap):
  return bytes(data[:cap]).decode("utf-8", "replace")


def _verified_body(res, key):
  """The frame's body when its tag is the job key's, else None."""
  res = bytes(res)
  tag, body = res[:sandbox_zygote.MAC_HEX], res[sandbox_zygote.MAC_HEX:]
  if len(tag) != sandbox_zygote.MAC_HEX or not hmac.compare_digest(
      tag, sandbox_zygote.mac(key, body).encode()):
    return None
  return body


def _json_object(body):
  try:
    parsed = json.loads(body.decode("utf-8"))
  except Exception:  # pylint: disable=broad-except  (deep nesting, bad UTF-8, bad JSON)
    return None
  return parsed if isinstance(parsed, dict) else None


def _is_text(value):
  """A str that is valid text (no lone surrogates), or None."""
  if value is None:
    return True
  if not isinstance(value, str):
    return False
  try:
    value.encode("utf-8")
  except UnicodeEncodeError:
    return False
  return True


def parse_job_result(body, limits=None):
  """A generic job's result dict when `body` is exactly what the job writer produces, else None.

  Only str/None fields, a known status, value_text consistent with value_repr (value_text is set
  only for str values, whose repr the worker recomputes), value_repr valid text within the cap.
  """
  parsed = _json_object(body)
  if parsed is None or set(parsed) != set(_RESULT_KEYS):
    return None
  if any(v is not None and not isinstance(v, str) for v in parsed.values()):
    return None
  if parsed["status"] not in _JOB_STATUSES:
    return None
  if parsed["value_text"] is not None and parsed["value_repr"] != repr(parsed["value_text"]):
    return None
  if parsed["status"] == "ok" and parsed["error_type"] is not None:
    return None
  if not _is_text(parsed["value_repr"]):  # repr() never writes a lone surrogate.
    return None
  if limits and parsed["value_repr"] and len(parsed["value_repr"]) > limits["result_bytes"]:
    return None
  return parsed


def parse_call_result(body, shape):
  """A call job's result dict when `body` has exactly the shape the harness writes, else None.

  shape: the repeat count of each entry. Every outcome is '+' + an encoding or '!' + a reason.
  """
  parsed = _json_object(body)
  if parsed is None or set(parsed) != {"status", "error_type", "error_message", "outcomes"}:
    return None
  if parsed["status"] not in _CALL_STATUSES or not all(
      _is_text(parsed[k]) for k in ("error_type", "error_message")):
    return None
  outcomes = parsed["outcomes"]
  if not isinstance(outcomes, list):
    return None
  if parsed["status"] != "ok":
    return parsed if outcomes == [] and parsed["error_type"] is not None else None
  if parsed["error_type"] is not None or [len(o) if isinstance(o, list) else -1
                                          for o in outcomes] != shape:
    return None
  for entry in outcomes:
    for item in entry:
      if not isinstance(item, str) or item[:1] not in ("+", "!") or not item.isascii() and (
          item[:1] == "+" or not _is_text(item)):
        return None
  return parsed


def _classify(status, killed_for, out, err, res, limits, key, shape):
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
    result.update(error_type="Crash", error_message="the job process was not reaped")
  elif signum:
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else signum
    result.update(error_type="Crash", error_message=f"killed by signal {name}")
  else:
    body = _verified_body(res, key) if res and code == 0 else None
    if shape is None:
      parsed = parse_job_result(body, limits) if body is not None else None
    else:
      parsed = parse_call_result(body, shape) if body is not None else None
    if parsed is None:
      result.update(error_type="NoResult" if not res else "BadResult",
                    error_message=f"process exited with code {code} without a valid result")
    elif shape is None:
      result.update({k: parsed[k] for k in _RESULT_KEYS})
    else:
      result.update({k: parsed[k] for k in ("status", "error_type", "error_message")})
      result["outcomes"] = parsed["outcomes"]
  if len(out) > cap or len(err) > cap:
    result.update(status="output_too_large", error_type="OutputTooLarge",
                  error_message=f"output exceeded {cap} bytes")
    result.pop("outcomes", None)
  return result


def main():
  in_fd, out_fd = os.dup(0), os.dup(1)
  os.set_inheritable(in_fd, False)
  os.set_inheritable(out_fd, False)
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
    retire = not worker.alive()
    if retire:
      outcome["retire"] = True  # A zygote died: the pool starts a fresh worker before the next job.
    write_frame(out_fd, outcome)
    del job, outcome
    if retire:
      break
  worker.close()


if __name__ == "__main__":
  main()
