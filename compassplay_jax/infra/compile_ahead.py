"""Compiling a device program on a background thread before the run needs it.

A run's first step pays for compiling every program it meets, one after another on the main thread
(the demo: 31 programs, ~33 s of its first step on 2 CPU cores). Some programs' shapes are known well
before their first call: the optimizer update's and a fixed reference set's g_ref from the start, the
cosine pass's once the proposals are validated. `Ahead` lowers and compiles such a program
(`jitted.lower(*abstract_args).compile()`) on one background thread while the main thread generates;
JAX keeps the compiled executable with the jit, so the later call with arrays of those shapes,
dtypes and shardings runs it without compiling again (tests/test_compile_ahead.py counts it).

The caller waits (`wait(jitted)`) before calling a function that may still be compiling here: a
second, concurrent compilation of the same program would only cost more. The thread keeps the
process's CPU priority: a lower one (nice) cannot be raised again without privileges, and the main
thread may have to wait for it while other processes keep the cores busy. A background compilation
that fails is logged and forgotten; the call then compiles (and reports any real error) itself.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable

import jax

_log = logging.getLogger(__name__)


def abstract(tree):
  """ShapeDtypeStructs (with each array's sharding) of a pytree of arrays or ShapeDtypeStructs."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _signature(args) -> tuple:
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple((tuple(x.shape), str(x.dtype), getattr(x, "sharding", None)) for x in leaves)


class Ahead:
  """One background thread that compiles submitted programs in order; `enabled=False`: submit does nothing."""

  def __init__(self, enabled: bool = True):
    self.enabled = enabled
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._lock = threading.Lock()
    self._pending: dict[int, list[concurrent.futures.Future]] = {}  # id(jitted) -> its compilations
    self._submitted: set = set()  # (id(jitted), signature): each program once

  def submit(self, jitted: Callable, *abstract_args: Any) -> None:
    """Compiles `jitted` for these abstract arguments (ShapeDtypeStructs with shardings) in the background."""
    if not self.enabled:
      return
    key = (id(jitted), _signature(abstract_args))
    with self._lock:
      if key in self._submitted:
        return
      self._submitted.add(key)
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile-ahead")
      future = self._pool.submit(self._compile, jitted, abstract_args)
      self._pending.setdefault(id(jitted), []).append(future)

  @staticmethod
  def _compile(jitted, abstract_args) -> None:
    try:
      jitted.lower(*abstract_args).compile()
    except Exception as e:  # the call compiles itself and raises what is really wrong
      _log.warning("compiling %s ahead failed (%s: %s); it compiles when called",
                   getattr(jitted, "__name__", jitted), type(e).__name__, str(e).splitlines()[0][:200])

  def wait(self, jitted: Callable) -> None:
    """Returns once every submitted compilation of `jitted` has finished."""
    with self._lock:
      futures = self._pending.pop(id(jitted), [])
    for future in futures:
      future.result()

  def close(self) -> None:
    """Waits for what is compiling and stops the thread."""
    with self._lock:
      pool, self._pool, self._pending = self._pool, None, {}
    if pool is not None:
      pool.shutdown(wait=True)
