"""XLA compilation: a persistent cache across runs, and counts of what was compiled.

The demo's cold start is dominated by compiling the sampler, reward and train-step programs; with
the cache on, a second run loads them from disk. `CompileStats` counts backend compilations and,
apart from them, the programs loaded from the cache, so a run's metrics show where the time went
(compile/count, compile/seconds, compile/cache_hits, compile/cache_load_seconds).
"""
from __future__ import annotations

import os
import pathlib
import threading

import jax
from jax import monitoring

DEFAULT_DIR = "~/.cache/compassplay_jax/xla"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def enable(directory: str, min_compile_seconds: float = 0.5) -> pathlib.Path | None:
  """Turns on JAX's persistent compilation cache in `directory` ("" = off). A directory already set
  through JAX_COMPILATION_CACHE_DIR wins (the tests share one)."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
  if not directory:
    return None
  path = pathlib.Path(directory).expanduser()
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
  return path


class _ProcessCounts:
  """Backend compilations (count, seconds) and persistent-cache loads (count, seconds) in this process.

  JAX records its backend-compile duration around compile-or-load (pxla._cached_compilation), so a
  program read from the persistent cache fires it too, after a cache-hit event on the same thread:
  that duration is counted as a load, not a compilation.

  One instance, whose two JAX monitoring listeners are registered on first use and never again:
  JAX keeps listeners in process-wide lists, so a listener per CompileStats would grow them (and keep
  every instance alive) with each run made in the process. (jax.monitoring.clear_event_listeners
  would drop them; nothing in the package calls it.)
  """

  def __init__(self):
    self.count, self.seconds, self.cache_hits, self.load_seconds = 0, 0.0, 0, 0.0
    self._lock = threading.Lock()
    self._registered = False
    self._hit_pending = threading.local()  # set by a cache hit, read by the compile-or-load duration after it

  def ensure_registered(self) -> None:
    with self._lock:
      if not self._registered:
        monitoring.register_event_duration_secs_listener(self._on_duration)
        monitoring.register_event_listener(self._on_event)
        self._registered = True

  def _on_duration(self, name, seconds, **_):
    if name == _COMPILE_EVENT:
      hit = getattr(self._hit_pending, "value", False)
      self._hit_pending.value = False
      with self._lock:
        if hit:
          self.load_seconds += seconds
        else:
          self.count += 1
          self.seconds += seconds

  def _on_event(self, name, **_):
    if name == _HIT_EVENT:
      self._hit_pending.value = True
      with self._lock:
        self.cache_hits += 1

  def snapshot(self) -> tuple[int, float, int, float]:
    with self._lock:
      return self.count, self.seconds, self.cache_hits, self.load_seconds


_PROCESS = _ProcessCounts()


class CompileStats:
  """Backend compilations (count, seconds) and persistent-cache loads (hits, seconds) since this
  instance was made (the process's totals minus those at creation; any number of instances share one
  JAX listener)."""

  def __init__(self):
    _PROCESS.ensure_registered()
    self._start = _PROCESS.snapshot()

  def totals(self) -> dict[str, float]:
    now = _PROCESS.snapshot()
    count, seconds, hits, load_seconds = (a - b for a, b in zip(now, self._start))
    return {"compile/count": count, "compile/seconds": seconds, "compile/cache_hits": hits,
            "compile/cache_load_seconds": load_seconds}
