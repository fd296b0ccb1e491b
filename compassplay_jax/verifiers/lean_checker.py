"""One checker interface, two implementations, chosen by `config.lean.checker`.

A Lean checker takes (header, command) pairs and returns one LeanCheckResult per pair:

  check(header, command) -> LeanCheckResult
  check_batch([(header, command), ...]) -> [LeanCheckResult, ...]   (input order)
  warm_up(header)        raises LeanSetupError at once when the checker cannot work
  close()                also as a context manager

  "local"   LeanReplPool (lean_pool.py): REPL processes on this machine, `lean.command` in `lean.cwd`
  "kimina"  KiminaChecker (lean_kimina.py): a kimina-lean-server at the URL in $`lean.kimina_url_env`,
            with the key in $`lean.kimina_key_env` (kept out of configs and checkpoints)

Both return the REPL's own reply with lines relative to the command, so lean_acceptance.py gives the
same verdict on the same reply whichever checked it (tests/test_lean_checker.py).
"""
import os
import shlex

from compassplay_jax.models.config import ConfigError
from compassplay_jax.verifiers.lean_repl import check_repl_command

CHECKERS = ("local", "kimina")


def _kind(lean) -> str:
  kind = lean.checker
  if kind not in CHECKERS:
    raise ConfigError(f"config.lean.checker: {kind!r} is not one of {CHECKERS}")
  return kind


def check_checker_config(lean) -> None:
  """Fails fast (ConfigError / LeanSetupError, one line) when `lean`'s checker cannot be built."""
  if _kind(lean) == "local":
    check_repl_command(shlex.split(lean.command), lean.cwd or None)
    return
  from compassplay_jax.verifiers.lean_kimina import KiminaChecker
  for name in ("kimina_batch_size",):
    if lean[name] < 1:
      raise ConfigError(f"config.lean.{name}: must be >= 1, got {lean[name]}")
  KiminaChecker.from_env(url_env=lean.kimina_url_env, key_env=lean.kimina_key_env).close()


def host_workers(lean) -> int:
  """lean.num_workers, or with 0 what this host holds: one REPL per core, at most as many as its
  memory fits at lean.memory_limit_mb each (each process of a multi-host run sizes its own pool)."""
  if lean.num_workers > 0:
    return int(lean.num_workers)
  cores = os.cpu_count() or 1
  try:
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20
  except (ValueError, OSError):
    return cores
  return max(1, min(cores, memory_mb // max(lean.memory_limit_mb, 1)))


def make_checker(lean):
  """The checker `lean` (config.lean) asks for."""
  if _kind(lean) == "local":
    from compassplay_jax.verifiers.lean_pool import LeanReplPool
    return LeanReplPool(command=shlex.split(lean.command), cwd=lean.cwd or None,
                        num_workers=host_workers(lean), timeout_s=lean.timeout_s,
                        memory_limit_mb=lean.memory_limit_mb,
                        max_checks_per_process=lean.max_checks_per_process)
  from compassplay_jax.verifiers.lean_kimina import KiminaChecker
  return KiminaChecker.from_env(url_env=lean.kimina_url_env, key_env=lean.kimina_key_env,
                                timeout_s=lean.timeout_s, batch_size=lean.kimina_batch_size,
                                num_workers=host_workers(lean), retries=lean.kimina_retries,
                                backoff_s=lean.kimina_backoff_s,
                                request_timeout_s=lean.kimina_request_timeout_s or None)
