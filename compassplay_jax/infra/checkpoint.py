"""Training checkpoints: params, optimizer state, step, PRNG key and a JSON item, via Orbax.

Layout (one directory per saved step, named by the step):
  <dir>/<step>/params/      Orbax PyTree (the parameter State)
  <dir>/<step>/opt_state/   Orbax PyTree (the optax state)
  <dir>/<step>/meta/        JSON: the PRNG key's data and impl
  <dir>/<step>/extra/       JSON: caller's dict (task buffers, coverage history, metrics so far, ...)
Orbax writes a step into a temporary directory and renames it into place only when every item is
written (commit_success.txt marks it), so a crash mid-save leaves the previous steps intact and the
partial one is ignored and cleaned up by the next manager. Old steps are deleted only after a new one
is committed, keeping the last `keep`.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from compassplay_jax.core.errors import UserError


class CheckpointError(UserError, RuntimeError):
  """A checkpoint directory or step that cannot be used."""


def _abstract(tree):
  """Shape/dtype/sharding targets for Orbax from concrete or already-abstract leaves."""
  return None if tree is None else jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _key_meta(rng_key) -> dict:
  key = jnp.asarray(rng_key) if not isinstance(rng_key, jax.Array) else rng_key
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return {"rng_key_data": np.asarray(jax.random.key_data(key)).tolist(), "rng_impl": str(jax.random.key_impl(key))}
  return {"rng_key_data": np.asarray(key).tolist(), "rng_impl": None, "rng_dtype": str(key.dtype)}


def _key_from_meta(meta: dict):
  if meta["rng_impl"] is None:
    return jnp.asarray(np.asarray(meta["rng_key_data"], dtype=meta["rng_dtype"]))
  return jax.random.wrap_key_data(jnp.asarray(meta["rng_key_data"], jnp.uint32), impl=meta["rng_impl"])


class CheckpointManager:
  """Saves every `save_every` steps (or when forced) and keeps the last `keep` committed steps.

  `step` is the number of completed train steps: after `restore()` returns step s, the loop runs
  step s + 1 next, so no step is lost or repeated.
  """

  def __init__(self, directory, *, keep: int = 3, save_every: int = 1, create: bool = True,
               async_save: bool = False, read_only: bool = False):
    """read_only: a reader beside a run that may be writing (evaluation, inspection): it never creates the
    directory, never saves, and leaves unfinished saves alone, which may be the writer's save in progress.
    Only a writer removes a crashed save's leftovers."""
    self.directory = pathlib.Path(directory).expanduser().absolute()
    self.read_only = read_only
    create = create and not read_only
    if not create and not self.directory.is_dir():
      raise CheckpointError(f"checkpoint directory {self.directory} does not exist")
    if keep < 1 or save_every < 1:
      raise ValueError(f"keep and save_every must be >= 1, got keep={keep} save_every={save_every}")
    self.save_every = save_every
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=save_every, create=create, cleanup_tmp_directories=not read_only,
        read_only=read_only,
        enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._writing: int | None = None  # the step whose save was started last (async: may still be writing)
    self._await_tmp_cleanup()

  def _await_tmp_cleanup(self) -> None:
    """Orbax deletes a crashed save's temporary directory on a background thread, and its close() does
    not wait for that. A second manager on the same directory (the resumed run after an inspection)
    then deletes the same files at the same time and one of them fails on a file the other removed.
    Waiting here means the directory holds only committed steps once we return."""
    await_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)  # Orbax 0.11+
    if await_cleanup is None:
      return
    try:
      await_cleanup()
    except OSError as e:
      raise CheckpointError(f"could not remove an unfinished save's temporary files in {self.directory}: "
                            f"{type(e).__name__}: {e}") from e

  def should_save(self, step: int) -> bool:
    return step % self.save_every == 0

  def save(self, step: int, params, opt_state, rng_key, extra_json: dict[str, Any], *, force: bool = False) -> bool:
    """Saves when `step` is a multiple of save_every or `force` (use it for the final step).

    Returns whether a save was started. With async_save, the write finishes in the background;
    call wait_until_finished() before relying on it.
    """
    if self.read_only:
      raise CheckpointError(f"checkpoint manager of {self.directory} is read-only: step {step} not saved")
    if not (force or self.should_save(step)):
      return False
    args = ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        opt_state=ocp.args.StandardSave(opt_state),
        meta=ocp.args.JsonSave(_key_meta(rng_key)),
        # A snapshot: with async_save the write happens after the caller has moved on and mutated
        # its buffers and metrics; also fails here, in the caller, on anything not JSON-serializable.
        extra=ocp.args.JsonSave(json.loads(json.dumps(extra_json))))
    self.wait_until_finished()  # a failed background write of the previous step surfaces here, named
    with self._failure_names(step):
      started = bool(self._manager.save(step, args=args, force=True))
    self._writing = step
    return started

  def reached_preemption(self, step: int) -> bool:
    """Whether the processes of a multi-process run have reached the preemption sync point at `step`
    (a SIGTERM on any of them; Orbax's reached_preemption, False when JAX's preemption service is off).
    Call it at every step on every process (compassplay_jax/infra/preemption.py)."""
    return bool(self._manager.reached_preemption(step))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, step: int | None = None, *, params=None, opt_state=None):
    """Returns (step, params, opt_state, rng_key, extra_json) of `step` (default: the latest).

    `params` / `opt_state` are restore targets: concrete trees or jax.ShapeDtypeStruct trees (with
    shardings to restore sharded). Give both to get back the same pytree types (nnx.State, optax
    NamedTuples); without a target Orbax returns plain nested dicts.
    """
    steps = self.all_steps()
    if not steps:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    step = steps[-1] if step is None else step
    if step not in steps:
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (have {steps})")
    args = ocp.args.Composite(
        params=ocp.args.StandardRestore(_abstract(params)),
        opt_state=ocp.args.StandardRestore(_abstract(opt_state)),
        meta=ocp.args.JsonRestore(),
        extra=ocp.args.JsonRestore())
    out = self._manager.restore(step, args=args)
    return step, out.params, out.opt_state, _key_from_meta(out.meta), out.extra

  def wait_until_finished(self) -> None:
    """Blocks until the last save is committed; a write that failed (a full disk, say) raises
    CheckpointError naming its step and directory. The steps committed before it stay intact."""
    with self._failure_names(self._writing):
      self._manager.wait_until_finished()

  @contextlib.contextmanager
  def _failure_names(self, step: int | None):
    """Orbax's write errors (raised here or, with async_save, from its background threads at the next
    wait) as one line with the step and the directory."""
    try:
      yield
    except CheckpointError:
      raise
    except Exception as e:  # noqa: BLE001  (OSError, tensorstore's ValueError, ...: all are write failures)
      cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
      if len(cause) > 300:  # tensorstore's: which file first, the OS's reason ("File too large") last
        cause = f"{cause[:120]} ... {cause[-160:]}"
      try:
        kept = self._manager.latest_step()
      except Exception:  # noqa: BLE001  (the directory may be unreadable too: the write error is the news)
        kept = None
      raise CheckpointError(f"checkpoint of step {step} was not written to {self.directory}: {type(e).__name__}: "
                            f"{cause} (the last complete checkpoint: {kept if kept is not None else 'none'})") from e

  def close(self) -> None:
    with self._failure_names(self._writing):
      self._manager.close()

  def __enter__(self) -> "CheckpointManager":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
