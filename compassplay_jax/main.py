"""The main command: self-play training.

  python -m compassplay_jax.main --config=configs/coding.py:demo [--workdir=DIR]
  python -m compassplay_jax.main --config=configs/lean.py --config.lean.cwd=/path/to/mathlib-project
  ... -v 0   (or --verbosity=0): show library INFO records and warnings (off by default)

The loop is linear on purpose (big_vision style): build everything, restore the latest checkpoint if
there is one, then for each step selfplay/step.run_step (plan, propose, verify, score, rows, commit,
advantages, update), then evaluation when due, metrics and the checkpoint (selfplay/session.py).
"""
from __future__ import annotations

import os
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/*.py file, e.g. configs/coding.py:demo.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and logs (default runs/<setting>_<variant>).")

def workdir_for(config) -> pathlib.Path:
  if _WORKDIR.value:
    return pathlib.Path(_WORKDIR.value)
  if config.workdir:
    return pathlib.Path(config.workdir)
  return pathlib.Path("runs") / f"{config.setting}_{config.variant}"


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/coding.py:demo")
  from compassplay_jax.infra import gc_policy, logging_setup
  logging_setup.configure(verbosity_flag_present=flags.FLAGS["verbosity"].present)
  gc_policy.defer_full_collections()
  from compassplay_jax.selfplay.run import run  # heavy imports after flag parsing
  run(config, workdir_for(config))


def _unknown_override(error) -> str | None:
  """The --config.<key>=... argument an override error refers to, if it came from one."""
  key = str(error).strip("\"' ")
  for arg in sys.argv[1:]:
    name = arg.split("=", 1)[0]
    if name.startswith("--config.") and key and key in name.split("."):
      return name
  return None


def entry():
  """Runs main; bad input (config, checkpoint, data files, missing Lean) ends with one line on stderr."""
  try:
    app.run(main)
  except (AttributeError, KeyError) as e:
    override = _unknown_override(e)
    if override is None or os.environ.get("COMPASSPLAY_TRACEBACK"):
      raise
    print(f"error: unknown config key in {override} (see the config file for the known fields)", file=sys.stderr)
    sys.exit(2)
  except Exception as e:
    from compassplay_jax.core.errors import user_error_line
    line = user_error_line(e)
    if line is None or os.environ.get("COMPASSPLAY_TRACEBACK"):
      raise
    print(line, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  entry()
