"""One Lean REPL process spoken to over the leanprover-community/repl JSON protocol.

Framing: each request is one JSON object followed by a blank line; each reply is
JSON (pretty-printed over several lines) followed by a blank line. A process runs
its import header once (`{"cmd": header}` -> env 0); every check then branches
from that env (`{"cmd": body, "env": 0}`), so checks stay independent and skip the
import. The pool in `lean_pool.py` manages many of these.

The checked text shares the REPL's stdout: a proof that runs code (an `#eval` past the guard)
can write bytes shaped like a reply there. So a check's reply is taken as its verdict only when
the exchange holds to the protocol (`request`):
  * before the check, nothing is waiting on stdout (stray bytes from an earlier check);
  * the reply is one JSON object from a line that starts with `{` to the next blank line, after
    nothing but plain lines without `{`, `}` or `"` (so a real reply cannot be turned into
    skipped "noise" by bytes glued before it);
  * the reply is a command reply (`env` an integer, `messages`/`sorries` lists) whose `env` is
    above every env this process answered before (the REPL numbers its commands 0, 1, 2, …);
  * after that reply we send a sentinel, `#print "<REPLY_MARK><nonce>"` on the same env, with a
    fresh random nonce the checked text never saw, and the very next reply must be the sentinel's
    (its env above the check's, the nonce in its info message), read the same way. A forged reply
    printed by the proof comes before the real one, so the real one lands between the taken reply
    and the sentinel's: caught.
Anything else is PROTOCOL_ERROR (a system error, no verdict) and the process is killed, so the next
check starts on a fresh one and cannot read stale bytes. What this cannot stop: code that also reads
the REPL's stdin to learn the nonce and forges the sentinel's reply too; the guard
(verifiers/lean_guard.py), which refuses every command token that runs code, is the first line.
"""
import dataclasses
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from compassplay_jax.core.errors import UserError

# Check outcomes. Only ANSWERED carries a Lean verdict; the rest say why not.
ANSWERED = "answered"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
CRASH = "crash"              # The process died or spoke garbage: a system error, retry.
REPL_ERROR = "repl_error"    # The REPL answered {"message": ...}, e.g. "Unknown environment."
HEADER_ERROR = "header_error"  # The import header itself failed (bad import, missing Mathlib).
PROTOCOL_ERROR = "protocol_error"  # Replies out of step with requests (module docstring).

SYSTEM_ERRORS = (CRASH, REPL_ERROR, HEADER_ERROR, PROTOCOL_ERROR)

# The sentinel command's string starts with this (then a per-check random nonce).
REPLY_MARK = "compassplay-reply-"
SENTINEL_GRACE_S = 5.0

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


def _encode(payload: dict) -> bytes:
  return (json.dumps(payload, ensure_ascii=False) + "\n\n").encode()


def select_ready(fd: int) -> bool:
  """Whether `fd` has bytes (or EOF) to read now."""
  with selectors.DefaultSelector() as sel:
    sel.register(fd, selectors.EVENT_READ)
    return bool(sel.select(0))


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
    self._last_env = -1  # The highest env this process answered with.

  @property
  def pid(self) -> int | None:
    return self._proc.pid if self._proc else None

  @property
  def alive(self) -> bool:
    return self._proc is not None and self._proc.poll() is None

  def start(self, header_timeout_s: float) -> LeanCheckResult:
    """Launches the process and runs the header; returns the header's result."""
    self._stderr = tempfile.TemporaryFile()
    self._buffer, self._last_env = b"", -1
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
    """Sends one request and waits for its reply; kills the process on any failure.

    A request on an env (a check) is held to the protocol (module docstring); the header request
    (no env: our own text, run first) is read leniently, skipping a start-up banner or debug lines.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    guarded = "env" in payload
    status, error = ANSWERED, ""
    if guarded:
      status, error = self._nothing_waiting()
    if status == ANSWERED:
      status, reply, error = self._exchange(_encode(payload), deadline, strict=guarded)
    if status == ANSWERED and not ("env" not in reply and "message" in reply):
      status, error = self._check_reply(reply)
      if status == ANSWERED and guarded:
        status, error = self._sentinel(payload["env"], deadline)
    elapsed = time.monotonic() - start
    if status != ANSWERED:
      self.kill()
      return LeanCheckResult(status=status, time_s=elapsed, error=error)
    result = LeanCheckResult.from_reply(reply, elapsed)
    if result.status != ANSWERED:
      self.kill()  # An error reply means this process's state is suspect.
    return result

  def _check_reply(self, reply: dict) -> tuple[str, str]:
    """A command reply's shape, and its env above every env answered before."""
    env = reply.get("env")
    if (type(env) is not int or not isinstance(reply.get("messages", []), list)
        or not all(isinstance(m, dict) for m in reply.get("messages", []))
        or not isinstance(reply.get("sorries", []), list)):
      return PROTOCOL_ERROR, f"reply not shaped like a command reply: {json.dumps(reply)[:200]}"
    if env <= self._last_env:
      return PROTOCOL_ERROR, f"reply with env {env}, not above the last answered env {self._last_env}"
    self._last_env = env
    return ANSWERED, ""

  def _nothing_waiting(self) -> tuple[str, str]:
    """Stray bytes on stdout before a request (output of an earlier check) are a protocol error."""
    ready = select_ready(self._proc.stdout.fileno())
    if ready:
      chunk = os.read(self._proc.stdout.fileno(), 1 << 16)
      if not chunk:
        return self._dead_status()[::2]
      self._buffer += chunk
    if self._buffer.strip():
      return PROTOCOL_ERROR, f"stray output before the request: {self._buffer[:200]!r}"
    self._buffer = b""
    return ANSWERED, ""

  def _sentinel(self, env: int, deadline: float) -> tuple[str, str]:
    """Sends the sentinel and reads its reply, which must come next (module docstring). It gets
    SENTINEL_GRACE_S even when the check used up its time limit (it runs no code)."""
    mark = REPLY_MARK + secrets.token_hex(16)
    deadline = max(deadline, time.monotonic() + SENTINEL_GRACE_S)
    status, reply, error = self._exchange(_encode({"cmd": f'#print "{mark}"', "env": env}), deadline,
                                          strict=True)
    if status != ANSWERED:
      return status, error
    status, error = self._check_reply(reply)
    if status != ANSWERED:
      return status, f"sentinel: {error}"
    if not any(mark in str(m.get("data")) for m in reply.get("messages", [])):
      return PROTOCOL_ERROR, f"a reply came between the check's reply and the sentinel's: {json.dumps(reply)[:200]}"
    return ANSWERED, ""

  def _exchange(self, data: bytes, deadline: float, strict: bool) -> tuple[str, dict | None, str]:
    """Writes `data`, then reads until a reply: strictly (`_take_next_reply`) or leniently."""
    if strict and self._buffer.strip():  # bytes already here came before this request was sent
      status, reply, error = self._take_next_reply()
      if status != ANSWERED or reply is not None:
        return PROTOCOL_ERROR, None, error or f"a reply before its request: {json.dumps(reply)[:200]}"
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
          if strict:
            status, reply, error = self._take_next_reply()
            if status != ANSWERED or reply is not None:
              return status, reply, error
            continue
          reply = self._take_reply()
          if reply is not None:
            return ANSWERED, reply, ""

  def _take_next_reply(self) -> tuple[str, dict | None, str]:
    """Pops the reply that must come next: plain lines (none with `{`, `}` or `"`), then one JSON
    object from a line that starts with `{` up to a blank line. (ANSWERED, None, "") while it is
    incomplete; PROTOCOL_ERROR for anything else."""
    *lines, partial = self._buffer.split(b"\n")
    start = 0
    while start < len(lines) and not lines[start].lstrip().startswith(b"{"):
      if any(c in lines[start] for c in b'{}"'):
        return PROTOCOL_ERROR, None, f"stray output before a reply: {lines[start][:200]!r}"
      start += 1
    if start == len(lines):  # no reply begun yet; the unfinished line may still be noise or `{`
      if not partial.lstrip().startswith(b"{") and any(c in partial for c in b'{}"'):
        return PROTOCOL_ERROR, None, f"stray output before a reply: {partial[:200]!r}"
      return ANSWERED, None, ""
    for end in range(start + 1, len(lines)):
      if lines[end].strip():
        continue
      try:
        reply = json.loads(b"\n".join(lines[start:end]))
      except ValueError:
        return PROTOCOL_ERROR, None, f"stray output in a reply: {b' '.join(lines[start:end])[:200]!r}"
      if not isinstance(reply, dict):
        return PROTOCOL_ERROR, None, f"a reply that is no JSON object: {reply!r:.200}"
      self._buffer = b"\n".join(lines[end + 1:] + [partial])
      return ANSWERED, reply, ""
    return ANSWERED, None, ""

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
