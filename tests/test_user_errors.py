"""Bad input ends `python -m compassplay_jax.main` with one line; every other exception keeps its traceback."""
import pathlib
import subprocess
import sys

import pytest

from compassplay_jax.core import errors
from compassplay_jax.infra.checkpoint import CheckpointError
from compassplay_jax.data.paths import DataMissingError
from compassplay_jax.infra.distributed import DistributedError
from compassplay_jax.models.config import ConfigError
from compassplay_jax.models.hub import HubModelError
from compassplay_jax.models.safetensors_io import CheckpointError as WeightsError
from compassplay_jax.domains.coding.reference_set import ReferenceSetError
from compassplay_jax.infra.sharding import ShardingError
from compassplay_jax.verifiers.lean_repl import LeanSetupError

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cls", [ConfigError, CheckpointError, WeightsError, DataMissingError, DistributedError,
                                 HubModelError, ReferenceSetError, ShardingError, LeanSetupError,
                                 errors.InputNotFound, errors.InputFormatError])
def test_project_input_errors_print_their_first_line(cls):
  assert issubclass(cls, errors.UserError)
  assert errors.user_error_line(cls("config.x: bad value\nsecond line")) == "error: config.x: bad value" + (
      " Setup steps: docs/lean.md." if cls is LeanSetupError else "")


@pytest.mark.parametrize("exc", [ValueError("shapes (3,) and (4,) not aligned"), FileNotFoundError("/tmp/x"),
                                 KeyError("k"), RuntimeError("XLA")])
def test_other_exceptions_keep_their_traceback(exc):
  assert errors.user_error_line(exc) is None


def test_bad_config_value_is_one_line_before_any_model_loads(tmp_path):
  """The real command line, in a subprocess (the other bad-input cases run main in-process:
  tests/main_in_process.py): exit status 2, one `error:` line, no traceback."""
  result = subprocess.run([sys.executable, "-m", "compassplay_jax.main", "--config=configs/coding.py:tiny",
                           "--config.train.kl_coef=-0.1", f"--workdir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == "error: config.train.kl_coef=-0.1 is negative"
  assert "Traceback" not in result.stderr
  errors_printed = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert errors_printed == ["error: config.train.kl_coef=-0.1 is negative"]
  assert not (tmp_path / "checkpoints").exists()
