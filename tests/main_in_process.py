"""`python -m compassplay_jax.main ARGS` inside the test process: main.entry() with sys.argv set.

The bad-input tests run here, not as subprocesses: a case costs milliseconds instead of an interpreter
start and the package's imports (~8 s each). tests/test_user_errors.py keeps one subprocess test of the
real command line.

What entry() changes process-wide is put back after each call:
- absl's flags. Flag names are process-wide: compassplay_jax.cli.evaluate (imported by test_eval_harness.py
  at collection) defines --config and --workdir too, so theirs are set aside while main's are in, and
  ml_collections' --config.<field> override flags, registered by each parse, are deleted (a second
  parse with the same override would be refused as "defined twice").
- logging: absl's app.run puts its handler on the root logger and sets levels; logging_setup
  quiets the libraries' loggers and sets two environment variables.
- the kernel's name for this thread (/proc/self/comm), which app.run sets from sys.argv[0].
"""
from __future__ import annotations

import logging
import os
import pathlib
import sys

from absl import flags

MAIN_FLAGS = ("config", "workdir")
_QUIET_ENV = ("TRANSFORMERS_VERBOSITY", "TF_CPP_MIN_LOG_LEVEL")
_main_flags = {}  # main's own Flag objects while they are out of the registry, between calls
_COMM = pathlib.Path("/proc/self/comm")


def run_main(args, capsys) -> tuple[int, str]:
  """(exit status, stderr) of `python -m compassplay_jax.main *args`, run in this process."""
  code, _, err = run_main_output(args, capsys)
  return code, err


def run_main_output(args, capsys) -> tuple[int, str, str]:
  """(exit status, stdout, stderr) of `python -m compassplay_jax.main *args`, run in this process."""
  from compassplay_jax.infra import logging_setup
  loggers = [logging.getLogger(), *map(logging.getLogger, logging_setup.NOISY_LOGGERS)]
  saved_levels = [l.level for l in loggers]
  saved_handlers = list(logging.root.handlers)
  saved_env = {k: os.environ.get(k) for k in _QUIET_ENV}
  saved_argv = sys.argv
  saved_comm = _COMM.read_bytes().strip() if _COMM.exists() else None
  others = _swap_in_main_flags()
  capsys.readouterr()  # only this call's output is returned
  try:
    from compassplay_jax import main
    sys.argv = ["compassplay_jax/main.py", *args]
    try:
      main.entry()
      code = 0
    except SystemExit as e:
      code = 0 if e.code is None else e.code
  finally:
    sys.argv = saved_argv
    _swap_out_main_flags(others)
    logging.root.handlers[:] = saved_handlers
    for logger, level in zip(loggers, saved_levels):
      logger.setLevel(level)
    for key, value in saved_env.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
    if saved_comm is not None:
      _COMM.write_bytes(saved_comm)
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _swap_in_main_flags() -> dict:
  """Sets aside other modules' flags named like main's; puts main's in (defined on its first import)."""
  registry = flags.FLAGS
  others = {}
  for name in MAIN_FLAGS:
    if name in registry and registry.find_module_defining_flag(name) != "compassplay_jax.main":
      others[name] = (registry.find_module_defining_flag(name), registry[name])
      delattr(registry, name)
  for name, flag in _main_flags.items():
    registry.register_flag_by_module("compassplay_jax.main", flag)
    registry[name] = flag
  _main_flags.clear()
  return others


def _swap_out_main_flags(others: dict) -> None:
  """Unparses, deletes the --config.<field> flags, takes main's out and puts the others back."""
  registry = flags.FLAGS
  registry.unparse_flags()
  for name in list(registry):
    if name.startswith("config."):
      delattr(registry, name)
  for name in MAIN_FLAGS:
    if name in registry:
      _main_flags[name] = registry[name]
      delattr(registry, name)
  for name, (module, flag) in others.items():
    registry.register_flag_by_module(module, flag)
    registry[name] = flag
