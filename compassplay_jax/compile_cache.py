"""XLA compilation: a persistent cache across runs, and counts of what was compiled.

The demo's cold start is dominated by compiling the sampler, reward and train-step programs; with
the cache on, a second run loads them from disk. `CompileStats` counts backend compilations (cache
hits do not compile) so a run's metrics show where the time went.
"""
from __future__ import annotations

import os
import pathlib

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


class CompileStats:
  """Running totals of backend compilations (count, seconds) and persistent-cache hits."""

  def __init__(self):
    self.count, self.seconds, self.cache_hits = 0, 0.0, 0
    monitoring.register_event_duration_secs_listener(self._on_duration)
    monitoring.register_event_listener(self._on_event)

  def _on_duration(self, name, seconds, **_):
    if name == _COMPILE_EVENT:
      self.count += 1
      self.seconds += seconds

  def _on_event(self, name, **_):
    if name == _HIT_EVENT:
      self.cache_hits += 1

  def totals(self) -> dict[str, float]:
    return {"compile/count": self.count, "compile/seconds": self.seconds, "compile/cache_hits": self.cache_hits}
