"""One Lean REPL process spoken to over the leanprover-community/repl JSON protocol.

Framing: each request is one JSON object followed by a blank line; each reply is
JSON (pretty-printed over several lines) followed by a blank line. A process runs
its import header once (`{"cmd": header}` -> env 0); every check then branches
from that env (`{"cmd": body, "env": 0}`), so checks stay independent and skip the
import. The pool in `lean_pool.py` manages many of these.
"""
import dataclasses
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from compassplay_jax.errors import UserError

# Check outcomes. Only ANSWERED carries a Lean verdict; the rest say why not.
ANSWERED = "answered"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
CRASH = "crash"              # The process died or spoke garbage: a system error, retry.
REPL_ERROR = "repl_error"    # The REPL answered {"message": ...}, e.g. "Unknown environment."
HEADER_ERROR = "header_error"  # The import header itself failed (bad import, missing Mathlib).

SYSTEM_ERRORS = (CRASH, REPL_ERROR, HEADER_ERROR)

# stderr phrases of a process that ran out of address space (seen in DSP/kimina logs).
_OOM_MARKERS = ("MemoryError", "out of memory", "std::bad_alloc", "Cannot allocate memory",
                "failed to create thread")

# Runs inside the child: cap the address space, then become the REPL command.
# A trampoline instead of preexec_fn, which is unsafe in threaded programs.
_LIMIT_AND_EXEC = (
    "import os, resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "if limit > 0:\n"
    "  resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")

SETUP_SCRIPT = "bash scripts/setup_lean.sh"
SETUP_STEPS = f"""\
To check Lean proofs you need a Lean 4 REPL and a Mathlib project (docs/lean.md §1):
  1. {SETUP_SCRIPT} [--dir DIR]
     installs elan, the REPL and Mathlib at the pinned tag and the Mathlib cache, checks one
     theorem, and prints the settings to use;
  2. point the checker at them: config.lean.command / config.lean.cwd for runs, or
     COMPASSPLAY_LEAN_REPL / COMPASSPLAY_LEAN_PROJECT with LeanReplPool.from_env(), or
     LeanReplPool(command=("lake", "env", "/abs/DIR/repl/.lake/build/bin/repl"), cwd="/abs/DIR/mathlib4").
On a cluster a kimina-lean-server can check proofs instead: config.lean.checker = "kimina" (§2b)."""


class LeanSetupError(UserError, RuntimeError):
  """The REPL command or its project cannot be used; the message says how to set it up."""


@dataclasses.dataclass(frozen=True)
class LeanMessage:
  severity: str  # "error" | "warning" | "info" | "trace"
  data: str
  line: int  # 1-based, relative to the checked command (the header is not counted)
  column: int  # 0-based
  end_line: int | None = None
  end_column: int | None = None

  @classmethod
  def from_json(cls, obj: dict) -> "LeanMessage":
    pos = obj.get("pos") or {}
    end = obj.get("endPos") or {}
    return cls(severity=str(obj.get("severity", "")), data=str(obj.get("data", "")),
               line=int(pos.get("line", 0)), column=int(pos.get("column", 0)),
               end_line=end.get("line"), end_column=end.get("column"))


@dataclasses.dataclass(frozen=True)
class LeanCheckResult:
  """What one check produced. `status` is ANSWERED when Lean gave a verdict."""
  status: str
  messages: tuple[LeanMessage, ...] = ()
  sorries: tuple[dict, ...] = ()
  env: int | None = None
  time_s: float = 0.0
  error: str = ""  # Why there is no verdict: REPL message, stderr tail, timeout.

  @property
  def errors(self) -> list[LeanMessage]:
    return [m for m in self.messages if m.severity == "error"]

  @property
  def is_system_error(self) -> bool:
    """True when the checker, not the proof, failed: exclude from rewards and retry."""
    return self.status in SYSTEM_ERRORS

  @classmethod
  def from_reply(cls, reply: dict, time_s: float = 0.0) -> "LeanCheckResult":
    """Builds a result from one parsed REPL reply (a command response or an error)."""
    if "env" not in reply and "message" in reply:
      return cls(status=REPL_ERROR, time_s=time_s, error=str(reply["message"]))
    messages = tuple(LeanMessage.from_json(m) for m in reply.get("messages", []))
    return cls(status=ANSWERED, messages=messages, sorries=tuple(reply.get("sorries", [])),
               env=reply.get("env"), time_s=time_s)


def check_repl_command(command: Sequence[str], cwd: str | None) -> None:
  """Raises LeanSetupError (one message with the setup steps) if `command` cannot run."""
  if not command:
    raise LeanSetupError(f"Lean REPL command is empty.\n{SETUP_STEPS}")
  if cwd is not None and not os.path.isdir(cwd):
    raise LeanSetupError(f"Lean project directory {cwd!r} does not exist (cwd of the REPL command "
                         f"{list(command)}): set up Lean with `{SETUP_SCRIPT}`.\n{SETUP_STEPS}")
  program = command[0]
  if os.sep in program:
    path = os.path.join(cwd or os.getcwd(), program)
    found = os.path.isfile(path) and os.access(path, os.X_OK)
  else:
    found = shutil.which(program) is not None
  if not found:
    raise LeanSetupError(f"Lean REPL command {program!r} not found (command {list(command)}, cwd {cwd!r}): "
                         f"set up Lean with `{SETUP_SCRIPT}`.\n{SETUP_STEPS}")


def _tree_pids(root: int) -> list[int]:
  """`root` and its descendants, via /proc/<pid>/task/<tid>/children."""
  pids, stack = [], [root]
  while stack:
    pid = stack.pop()
    pids.append(pid)
    try:
      for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
          stack.extend(int(c) for c in f.read().split())
    except OSError:
      continue
  return pids


def tree_rss_mb(root: int) -> float:
  """Resident memory of a process and its descendants, in MiB (0 if gone)."""
  total_pages = 0
  for pid in _tree_pids(root):
    try:
      with open(f"/proc/{pid}/statm") as f:
        total_pages += int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
      continue
  return total_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class LeanReplProcess:
  """A REPL process with one header environment. Not thread-safe: one check at a time."""

  def __init__(self, command: Sequence[str], cwd: str | None, header: str,
               memory_limit_mb: int, poll_s: float = 0.05):
    self.command = list(command)
    self.cwd = cwd
    self.header = header
    self.memory_limit_mb = memory_limit_mb
    self.poll_s = poll_s
    self.header_env: int | None = None
    self.checks_done = 0
    self.baseline_rss_mb = 0.0
    self._proc: subprocess.Popen | None = None
    self._stderr = None
    self._buffer = b""

  @property
  def pid(self) -> int | None:
    return self._proc.pid if self._proc else None

  @property
  def alive(self) -> bool:
    return self._proc is not None and self._proc.poll() is None

  def start(self, header_timeout_s: float) -> LeanCheckResult:
    """Launches the process and runs the header; returns the header's result."""
    self._stderr = tempfile.TemporaryFile()
    limit = self.memory_limit_mb * 2**20 if self.memory_limit_mb > 0 else 0
    # A new session makes the REPL (and lake's children) one process group to kill.
    self._proc = subprocess.Popen(
        [sys.executable, "-c", _LIMIT_AND_EXEC, str(limit), *self.command], cwd=self.cwd,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True)
    os.set_blocking(self._proc.stdin.fileno(), False)
    result = self.request({"cmd": self.header}, header_timeout_s)
    if result.status == ANSWERED and result.errors:
      first = result.errors[0]
      result = dataclasses.replace(result, status=HEADER_ERROR,
                                   error=f"header line {first.line}: {first.data}")
    if result.status == ANSWERED:
      self.header_env = result.env
      self.baseline_rss_mb = tree_rss_mb(self._proc.pid)
    else:
      self.kill()
    return result

  def check(self, body: str, timeout_s: float) -> LeanCheckResult:
    """Runs `body` on top of the header environment."""
    self.checks_done += 1
    return self.request({"cmd": body, "env": self.header_env}, timeout_s)

  def request(self, payload: dict, timeout_s: float) -> LeanCheckResult:
    """Sends one request and waits for its reply; kills the process on any failure."""
    start = time.monotonic()
    deadline = start + timeout_s
    data = (json.dumps(payload, ensure_ascii=False) + "\n\n").encode()
    status, reply, error = self._exchange(data, deadline)
    elapsed = time.monotonic() - start
    if status != ANSWERED:
      self.kill()
      return LeanCheckResult(status=status, time_s=elapsed, error=error)
    result = LeanCheckResult.from_reply(reply, elapsed)
    if result.status != ANSWERED:
      self.kill()  # An error reply means this process's state is suspect.
    return result

  def _exchange(self, data: bytes, deadline: float) -> tuple[str, dict | None, str]:
    proc = self._proc
    out_fd = proc.stdout.fileno()
    in_fd = proc.stdin.fileno()
    with selectors.DefaultSelector() as sel:
      sel.register(out_fd, selectors.EVENT_READ)
      sel.register(in_fd, selectors.EVENT_WRITE)
      while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          return TIMEOUT, None, "no reply within the time limit"
        if tree_rss_mb(proc.pid) > self.memory_limit_mb > 0:
          return MEMORY_LIMIT, None, f"resident memory above {self.memory_limit_mb} MiB"
        for key, _ in sel.select(min(remaining, self.poll_s)):
          if key.fd == in_fd:
            try:
              sent = os.write(in_fd, data)
            except (BrokenPipeError, ConnectionResetError):
              return self._dead_status()
            data = data[sent:]
            if not data:
              sel.unregister(in_fd)
            continue
          chunk = os.read(out_fd, 1 << 16)
          if not chunk:
            return self._dead_status()
          self._buffer += chunk
          reply = self._take_reply()
          if reply is not None:
            return ANSWERED, reply, ""

  def _take_reply(self) -> dict | None:
    """Pops one complete reply (JSON up to a blank line) from the buffer, if present.

    Lines before the JSON that are not JSON (stray debug prints of some REPL
    builds) are skipped; a blank line inside non-JSON text does not end the reply.
    """
    self._buffer = self._buffer.lstrip(b"\r\n")
    lines = self._buffer.split(b"\n")
    for end in range(len(lines) - 1):  # The last piece is an unfinished line.
      if lines[end].strip():
        continue
      chunk = lines[:end]
      for start in (i for i, ln in enumerate(chunk) if ln.lstrip().startswith(b"{")):
        try:
          reply = json.loads(b"\n".join(chunk[start:]))
        except ValueError:
          continue
        if isinstance(reply, dict):
          self._buffer = b"\n".join(lines[end + 1:])
          return reply
    return None

  def _dead_status(self) -> tuple[str, None, str]:
    try:
      self._proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      pass
    tail = self.stderr_tail()
    code = self._proc.returncode
    if any(marker in tail for marker in _OOM_MARKERS):
      return MEMORY_LIMIT, None, f"process ran out of memory (exit {code}): {tail}"
    return CRASH, None, f"REPL process exited with code {code}: {tail}"

  def stderr_tail(self, max_chars: int = 2000) -> str:
    if self._stderr is None:
      return ""
    try:
      self._stderr.seek(0, os.SEEK_END)
      size = self._stderr.tell()
      self._stderr.seek(max(0, size - max_chars))
      return self._stderr.read().decode(errors="replace").strip()
    except (OSError, ValueError):
      return ""

  def rss_mb(self) -> float:
    return tree_rss_mb(self._proc.pid) if self.alive else 0.0

  def signal_group(self) -> None:
    """SIGKILLs the process group without touching our pipes (safe from another thread)."""
    proc = self._proc
    if proc is not None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass

  def kill(self) -> None:
    """Kills the whole process group and reaps the process. Safe to call twice."""
    proc, self._proc = self._proc, None
    if proc is None:
      return
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    for stream in (proc.stdin, proc.stdout):
      try:
        stream.close()
      except OSError:
        pass
    proc.wait()
    if self._stderr is not None:
      self._stderr.close()
      self._stderr = None
