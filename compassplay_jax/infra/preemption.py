"""Preemption: a SIGTERM (a spot VM's notice, a scheduler's stop) ends the run at the next step boundary,
with that step saved, one line printed and exit status EXIT_CODE; rerunning the same command resumes.

    with preemption.Watcher(manager.reached_preemption) as watch:   # selfplay/run.py
      for step in steps:
        ...                                   # the step, its metrics line
        if watch.should_stop(step): save this step, wait for it, print watch.message(...), raise Preempted

One process: a SIGTERM handler that only sets a flag, read at the step boundary. A second SIGTERM
goes to the handler that was there before (by default the process ends at once: the last committed
checkpoint is intact, Orbax's saves being atomic). The previous handler is put back on close. Outside
the main thread (where Python cannot install handlers) nothing is installed and SIGTERM keeps its effect.

Several processes (jax.process_count() > 1): jax.distributed's preemption service catches SIGTERM
on each process and the processes agree on the step at which all of them stop (max step + 1);
`should_stop` asks it at every step on every process (Orbax's CheckpointManager.reached_preemption:
jax.experimental.multihost_utils.reached_preemption_sync_point), so every process saves the same
step. No Python handler is installed there: it would replace the service's.

EXIT_CODE is 143, what a shell reports for a process ended by SIGTERM (128 + 15): not 0, so a
scheduler that restarts failed jobs (a Kubernetes Job's backoff, `restartPolicy: OnFailure`, a
requeue-on-failure wrapper) runs it again, and a Kubernetes podFailurePolicy can match it (onExitCodes
[143], action Ignore) so that preemptions do not count against the job's retries.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable

import jax

EXIT_CODE = 143  # 128 + SIGTERM


class Preempted(SystemExit):
  """Raised by the run after the preempted step is saved: uncaught, the process exits with EXIT_CODE."""

  def __init__(self, step: int):
    super().__init__(EXIT_CODE)
    self.step = step


class Watcher:
  """Whether to stop at a step boundary: a SIGTERM arrived (one process) or the processes reached the
  preemption sync point (several). A context manager; `close` puts the previous SIGTERM handler back."""

  def __init__(self, reached_sync_point: Callable[[int], bool] | None = None):
    """reached_sync_point(step): the multi-process agreement (CheckpointManager.reached_preemption);
    asked at every step when jax.process_count() > 1, never on one process."""
    self.multi_process = jax.process_count() > 1 and reached_sync_point is not None
    self._reached = reached_sync_point
    self.requested: str | None = None  # the signal's name once one arrived (one process)
    self._previous = None
    self._installed = False
    if not self.multi_process and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
      self._installed = True

  def _handle(self, signum, frame) -> None:
    """Only records the signal; the loop acts at its next step boundary. A second one is the previous
    handler's (the default: the process ends now)."""
    if self.requested is None:
      self.requested = signal.Signals(signum).name
      return
    previous = self._previous
    self.close()
    if callable(previous):
      previous(signum, frame)
    elif previous == signal.SIG_DFL:
      signal.raise_signal(signum)

  @property
  def reason(self) -> str:
    return "preemption notice, at the processes' sync point" if self.multi_process else (self.requested or "")

  def should_stop(self, step: int) -> bool:
    """Called at every step boundary (on every process, with the same step): stop after saving `step`?"""
    if self.multi_process:
      return bool(self._reached(step))
    return self.requested is not None

  @staticmethod
  def message(reason: str, step: int, directory) -> str:
    return f"[compassplay] preempted ({reason}): saved step {step} to {directory}; rerun the same command to resume"

  def close(self) -> None:
    if self._installed:
      self._installed = False
      signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)

  def __enter__(self) -> "Watcher":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
