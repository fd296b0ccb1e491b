"""A pool of Lean REPL processes keyed by import header, checked in parallel.

Each process runs its header once; later checks with the same header reuse it.
When all slots are taken by other headers, the oldest idle process is evicted
(kimina-lean-server's policy). A process is thrown away after a timeout, a memory
overrun, a crash, a reply out of step with its request (PROTOCOL_ERROR, not retried: the checked
text may have printed it), `max_checks_per_process` checks, or `max_memory_growth_mb` of
resident-memory growth since its header ran (upstream REPL never frees envs).
"""
import os
import shlex
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from compassplay_jax.lean_syntax.statements import normalize_header
from compassplay_jax.verifiers.lean_repl import ANSWERED
from compassplay_jax.verifiers.lean_repl import CRASH
from compassplay_jax.verifiers.lean_repl import LeanCheckResult
from compassplay_jax.verifiers.lean_repl import LeanReplProcess
from compassplay_jax.verifiers.lean_repl import LeanSetupError
from compassplay_jax.verifiers.lean_repl import check_repl_command

REPL_COMMAND_ENV = "COMPASSPLAY_LEAN_REPL"  # e.g. "lake env /opt/repl/.lake/build/bin/repl"
PROJECT_DIR_ENV = "COMPASSPLAY_LEAN_PROJECT"  # e.g. "/opt/mathlib4"


def _kill_all(processes: set) -> None:
  for proc in list(processes):
    proc.kill()


class LeanReplPool:
  """Thread-safe pool of REPL processes; use as a context manager or call close()."""

  def __init__(self, command: Sequence[str] = ("lake", "env", "repl"), cwd: str | None = None,
               num_workers: int = 2, timeout_s: float = 60.0, memory_limit_mb: int = 8192,
               max_checks_per_process: int = 200, max_memory_growth_mb: float | None = None,
               header_timeout_s: float = 300.0, crash_retries: int = 1):
    """Checks that `command` can run (LeanSetupError otherwise); starts no process yet.

    Args:
      command: the REPL command, run in `cwd` (e.g. `lake env <repl>` in a Mathlib project).
      num_workers: most processes alive at once, and most checks in parallel.
      timeout_s: wall-clock limit per check; the process is killed when it passes.
      memory_limit_mb: address-space limit (RLIMIT_AS) of the REPL and an RSS
        watchdog on its process tree; passing it kills the process. 0 disables.
      max_checks_per_process: recycle a process after this many checks.
      max_memory_growth_mb: recycle a process whose RSS grew this much since its
        header ran; None means half of memory_limit_mb.
      header_timeout_s: limit for running the header (importing Mathlib is slow).
      crash_retries: times a check is retried on a fresh process after a crash.
    """
    if num_workers < 1:
      raise ValueError(f"LeanReplPool: num_workers must be >= 1, got {num_workers}")
    check_repl_command(command, cwd)
    self.command = tuple(command)
    self.cwd = cwd
    self.num_workers = num_workers
    self.timeout_s = timeout_s
    self.memory_limit_mb = memory_limit_mb
    self.max_checks_per_process = max_checks_per_process
    self.max_memory_growth_mb = (memory_limit_mb / 2 if max_memory_growth_mb is None
                                 else max_memory_growth_mb)
    self.header_timeout_s = header_timeout_s
    self.crash_retries = crash_retries
    self.processes_started = 0
    self._cond = threading.Condition()
    self._idle: list[LeanReplProcess] = []  # Oldest first.
    self._slots_in_use = 0
    self._live: set[LeanReplProcess] = set()
    self._closed = False
    self._executor = ThreadPoolExecutor(num_workers, thread_name_prefix="lean-check")
    self._finalizer = weakref.finalize(self, _kill_all, self._live)

  @classmethod
  def from_env(cls, **kwargs) -> "LeanReplPool":
    """A pool configured by $COMPASSPLAY_LEAN_REPL (command) and $COMPASSPLAY_LEAN_PROJECT (cwd)."""
    command = os.environ.get(REPL_COMMAND_ENV)
    if not command:
      raise LeanSetupError(f"environment variable {REPL_COMMAND_ENV} is not set (the REPL "
                           f"command, e.g. 'lake env /path/repl/.lake/build/bin/repl').")
    return cls(command=shlex.split(command), cwd=os.environ.get(PROJECT_DIR_ENV), **kwargs)

  def __enter__(self) -> "LeanReplPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def live_pids(self) -> list[int]:
    """Pids of the REPL processes alive now (for monitoring and tests)."""
    with self._cond:
      return [p.pid for p in self._live if p.pid is not None]

  def warm_up(self, header: str) -> None:
    """Starts one process for `header` now; raises LeanSetupError if the header fails."""
    proc, result = self._acquire(normalize_header(header))
    self._release(proc, keep=result.status == ANSWERED)
    if result.status != ANSWERED:
      raise LeanSetupError(f"Lean REPL failed on the header ({result.status}): {result.error}")

  def check(self, header: str, body: str) -> LeanCheckResult:
    """Runs `body` (a full theorem and proof) after `header`; blocks for a free slot."""
    key = normalize_header(header)
    for attempt in range(self.crash_retries + 1):
      proc, result = self._acquire(key)
      if result.status == ANSWERED:  # The header ran; now the body.
        result = proc.check(body, self.timeout_s)
      self._release(proc, keep=result.status == ANSWERED and self._reusable(proc))
      if result.status != CRASH or attempt == self.crash_retries or self._closed:
        return result
    return result

  def check_batch(self, items: Sequence[tuple[str, str]]) -> list[LeanCheckResult]:
    """check() on each (header, body), num_workers at a time; results in input order."""
    return list(self._executor.map(lambda item: self.check(*item), items))

  def close(self) -> None:
    """Kills every process (also those mid-check) and stops the pool. Idempotent."""
    with self._cond:
      if self._closed:
        return
      self._closed = True
      idle, self._idle = self._idle, []
      busy = [p for p in self._live if p not in idle]
      self._cond.notify_all()
    for proc in busy:
      proc.signal_group()  # Its checking thread sees EOF and reaps it.
    for proc in idle:
      self._forget(proc)
    self._executor.shutdown(wait=True)

  def _reusable(self, proc: LeanReplProcess) -> bool:
    if proc.checks_done >= self.max_checks_per_process:
      return False
    return proc.rss_mb() - proc.baseline_rss_mb <= self.max_memory_growth_mb

  def _acquire(self, key: str) -> tuple[LeanReplProcess, LeanCheckResult]:
    """A process whose header env is ready (or the failed header result), holding a slot."""
    evicted = None
    with self._cond:
      while True:
        if self._closed:
          raise RuntimeError("LeanReplPool is closed")
        for proc in self._idle:
          if proc.header == key:
            self._idle.remove(proc)
            self._slots_in_use += 1
            return proc, LeanCheckResult(status=ANSWERED, env=proc.header_env)
        if self._slots_in_use + len(self._idle) < self.num_workers:
          break
        if self._idle:
          evicted = self._idle.pop(0)
          break
        self._cond.wait()
      self._slots_in_use += 1
      proc = LeanReplProcess(self.command, self.cwd, key, self.memory_limit_mb)
      self._live.add(proc)
      self.processes_started += 1
    if evicted is not None:
      self._forget(evicted)
    return proc, proc.start(self.header_timeout_s)

  def _release(self, proc: LeanReplProcess, keep: bool) -> None:
    with self._cond:
      self._slots_in_use -= 1
      keep = keep and proc.alive and not self._closed
      if keep:
        self._idle.append(proc)
      self._cond.notify_all()
    if not keep:
      self._forget(proc)

  def _forget(self, proc: LeanReplProcess) -> None:
    proc.kill()
    with self._cond:
      self._live.discard(proc)
