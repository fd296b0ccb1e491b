"""Math answer checking with math-verify in spawned worker processes.

math-verify's own timeouts use SIGALRM, which works only in a main thread, and sympy can hang on
adversarial input. So each check runs in the main thread of a worker process, with math-verify's
timeouts on, and the parent kills and replaces any worker that passes a hard per-item deadline.
"""
import collections
import functools
import multiprocessing
import multiprocessing.connection
import os
import re
import time
from typing import Callable, Sequence

CORRECT, WRONG, TIMEOUT, ERROR = "correct", "wrong", "timeout", "error"


def _strip(answer: str) -> str:
  # Golds and predictions alike lose enclosing dollars and a sentence-final period.
  return answer.strip().strip("$").strip().rstrip(".").strip()


def _normalise(answer: str) -> str:
  return re.sub(r"\s+", "", _strip(answer))


def check_math_answer(gold: str, pred: str, timeout_s: int = 3) -> bool:
  """AZR's check: verify(parse(\\boxed{gold}), parse(\\boxed{pred})). Runs inside a worker.

  An exact (whitespace-insensitive) match also counts, so golds math-verify cannot parse (free-text
  OlympiadBench answers) stay reachable.
  """
  gold, pred = _strip(gold), _strip(pred)
  if not pred:
    return False
  if _normalise(pred) == _normalise(gold):
    return True
  from math_verify import verify  # pylint: disable=g-import-not-at-top
  gold_parsed, pred_parsed = _parsed(gold, timeout_s), _parsed(pred, timeout_s)
  return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=timeout_s))


@functools.lru_cache(maxsize=4096)
def _parsed(answer: str, timeout_s: int) -> tuple:
  """math-verify's parse of \\boxed{answer}, once per worker: an evaluation checks each gold against
  every sample of its problem, and parsing is ~2/3 of a check. Sympy expressions are immutable, and
  verify gets a fresh list."""
  from math_verify import parse  # pylint: disable=g-import-not-at-top
  return tuple(parse("\\boxed{" + answer + "}", parsing_timeout=timeout_s))


def _worker_main(conn, check_fn, timeout_s):
  import math_verify  # noqa: F401  # pylint: disable=g-import-not-at-top  # Import before "ready".
  conn.send(("ready", None))
  while True:
    job = conn.recv()
    if job is None:
      return
    index, gold, pred = job
    try:
      verdict = CORRECT if check_fn(gold, pred, timeout_s) else WRONG
    except Exception:  # pylint: disable=broad-except  # A checker crash marks the item, not the pool.
      verdict = ERROR
    conn.send((index, verdict))


class _Worker:

  def __init__(self, ctx, check_fn, timeout_s):
    self.conn, child_conn = ctx.Pipe()
    self.process = ctx.Process(target=_worker_main, args=(child_conn, check_fn, timeout_s), daemon=True)
    self.process.start()
    child_conn.close()
    self.ready = False
    self.job = None  # (index, deadline) while busy.

  def kill(self):
    self.process.kill()
    self.process.join(timeout=5)
    self.conn.close()


class MathChecker:
  """A pool of spawned math-verify workers that survives hanging or crashing checks.

  with MathChecker(num_workers=2, timeout_s=3) as checker:
    checker.check_batch([(gold, pred), ...])  # -> [True, False, ...]
  """

  def __init__(self, num_workers: int | None = None, timeout_s: float = 3.0,
               check_fn: Callable[[str, str, int], bool] = check_math_answer):
    self._ctx = multiprocessing.get_context("spawn")
    self._check_fn = check_fn
    self._inner_timeout = max(1, int(round(timeout_s)))  # SIGALRM takes whole seconds.
    # Parsing gold, parsing pred and verifying each get the inner timeout; allow for all three.
    self._hard_timeout = 3 * timeout_s + 2.0
    self._num_workers = num_workers or max(1, min(4, os.cpu_count() or 1))
    self._workers = []
    self.num_timeouts = 0

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def _start_workers(self):
    while len(self._workers) < self._num_workers:
      self._workers.append(_Worker(self._ctx, self._check_fn, self._inner_timeout))

  def _replace(self, worker):
    worker.kill()
    self._workers.remove(worker)
    self._start_workers()

  def close(self):
    for worker in self._workers:
      try:
        worker.conn.send(None)
      except (BrokenPipeError, OSError):
        pass
    for worker in self._workers:
      worker.process.join(timeout=2)
      if worker.process.is_alive():
        worker.kill()
      else:
        worker.conn.close()
    self._workers = []

  def check_batch(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
    return [v == CORRECT for v in self.verdicts(pairs)]

  def verdicts(self, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """One of "correct", "wrong", "timeout", "error" per (gold, pred) pair, in order."""
    self._start_workers()
    results = [WRONG] * len(pairs)
    pending = collections.deque(range(len(pairs)))
    while pending or any(w.job for w in self._workers):
      for worker in self._workers:
        if worker.ready and worker.job is None and pending:
          index = pending.popleft()
          gold, pred = pairs[index]
          worker.conn.send((index, str(gold), str(pred)))
          worker.job = (index, time.monotonic() + self._hard_timeout)
      deadlines = [w.job[1] for w in self._workers if w.job]
      wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 1.0
      by_conn = {w.conn: w for w in self._workers}
      for conn in multiprocessing.connection.wait(list(by_conn), timeout=wait_s):
        worker = by_conn[conn]
        try:
          tag, verdict = conn.recv()
        except (EOFError, OSError):  # The worker died (e.g. out of memory) mid-check.
          if not worker.ready:
            raise RuntimeError("math_check.py: a math-verify worker died on start-up (is math-verify installed?)")
          if worker.job:
            results[worker.job[0]] = ERROR
          self._replace(worker)
          continue
        if tag == "ready":
          worker.ready = True
        else:
          results[tag] = verdict
          worker.job = None
      now = time.monotonic()
      for worker in list(self._workers):
        if worker.job and now > worker.job[1]:
          results[worker.job[0]] = TIMEOUT
          self.num_timeouts += 1
          self._replace(worker)
    return results
