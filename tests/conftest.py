"""Shared pytest fixtures: the path to ../shared/data, and CPU-only JAX."""
import os
import pathlib

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("COMPASSPLAY_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture
def shared_data():
  """Path to ../shared/data; tests that need a file there skip cleanly when it is absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared data not found at {SHARED_DATA} (set COMPASSPLAY_SHARED_DATA)")
  return SHARED_DATA


def shared_file(relpath):
  """Returns ../shared/data/relpath or skips the calling test with the reason."""
  path = SHARED_DATA / relpath
  if not path.exists():
    pytest.skip(f"{path} not present")
  return path
