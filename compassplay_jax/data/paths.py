"""The data directory: where the fetched public data sets live, and the config paths that point into it.

One setting decides it: config.data_dir, else $COMPASSPLAY_DATA, else a per-user cache directory
($XDG_CACHE_HOME/compassplay/data, by default ~/.cache/compassplay/data). Config paths written
"data:<relpath>" are files under it. Which files a run needs, and the start-up check that they are
there, live above this layer (compassplay_jax/selfplay/data_files.py), beside the loaders that read them.
"""
from __future__ import annotations

import os
import pathlib

from compassplay_jax.core.errors import UserError

ENV = "COMPASSPLAY_DATA"
PREFIX = "data:"
FETCH = "python -m compassplay_jax.cli.data fetch"


class DataMissingError(UserError, FileNotFoundError):
  """Data files the config needs are not in the data directory."""


class DataIntegrityError(UserError, ValueError):
  """Data files the config needs are not the pinned files (their sha256 differs)."""


REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def default_data_dir() -> pathlib.Path:
  cache = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(cache) / "compassplay" / "data"


def data_dir(setting: str | os.PathLike | None = "") -> pathlib.Path:
  """The data directory: `setting` if given, else $COMPASSPLAY_DATA, else the per-user default."""
  chosen = str(setting or "") or os.environ.get(ENV, "")
  return pathlib.Path(chosen).expanduser().absolute() if chosen else default_data_dir()


def is_data_path(path: str) -> bool:
  return isinstance(path, str) and path.startswith(PREFIX)


def resolve(path: str, setting: str | os.PathLike | None = "") -> pathlib.Path:
  """"data:<relpath>" -> <data dir>/<relpath>; any other path is returned as it is."""
  if is_data_path(path):
    return data_dir(setting) / path[len(PREFIX):].lstrip("/")
  return pathlib.Path(path)


def fetch_command(names, directory: pathlib.Path) -> str:
  """The command that fetches `names` into `directory` (--dir only when it is not the default)."""
  names = " ".join(sorted(set(names)))
  suffix = "" if directory == data_dir("") else f" --dir {directory}"
  return f"{FETCH} {names}{suffix}"


def resolve_config_path(path: str, setting: str | os.PathLike | None = "") -> pathlib.Path:
  """A file path from a config: data:RELPATH (in the data directory), absolute, relative to the working
  directory where it exists there, else relative to the repository root."""
  if is_data_path(path):
    return resolve(path, setting)
  candidate = pathlib.Path(path)
  if candidate.is_absolute() or candidate.exists():
    return candidate
  return REPO_ROOT / path
