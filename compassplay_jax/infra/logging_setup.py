"""Quiet console by default: library INFO records and warnings off unless --verbosity / -v asks.

The main job's own output is a progress bar, one line per step and a summary; orbax, absl, jax
(e.g. its TPU-backend probe on a CPU machine), and transformers would otherwise add
hundreds of INFO lines. Errors still reach stderr.
"""
from __future__ import annotations

import logging
import os
import warnings

NOISY_LOGGERS = ("absl", "orbax", "jax", "jax._src.xla_bridge", "flax", "transformers", "etils")
NOISY_WARNINGS = r"(orbax|jax|flax|transformers|absl|etils|optax)(\.|$)"


def quiet_libraries() -> None:
  """Libraries log at ERROR only; their Python warnings are ignored. Call before importing them."""
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's C++ INFO/WARNING lines
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.ERROR)
  for name in NOISY_LOGGERS:
    logging.getLogger(name).setLevel(logging.ERROR)
  warnings.filterwarnings("ignore", module=NOISY_WARNINGS)


def configure(verbosity_flag_present: bool) -> None:
  """Quiet unless the user passed --verbosity (absl's -v): then absl's own setting stands."""
  if not verbosity_flag_present:
    quiet_libraries()
