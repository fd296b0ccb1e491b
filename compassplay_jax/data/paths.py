"""The data directory: where the fetched public data sets live, and the config paths that point into it.

One setting decides it: config.data_dir, else $COMPASSPLAY_DATA, else a per-user cache directory
($XDG_CACHE_HOME/compassplay/data, by default ~/.cache/compassplay/data). Config paths written
"data:<relpath>" are files under it; `prepare_config` turns them into absolute paths at start-up and
stops with one line naming the fetch command for every file that is missing.
"""
from __future__ import annotations

import os
import pathlib

from compassplay_jax.errors import UserError

ENV = "COMPASSPLAY_DATA"
PREFIX = "data:"
FETCH = "python -m compassplay_jax.data fetch"


class DataMissingError(UserError, FileNotFoundError):
  """Data files the config needs are not in the data directory."""


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


def _needed(config) -> list[tuple[str, str]]:
  """(config field, data-dir relpath) for every data file this config will read."""
  from compassplay_jax.data.sources import dataset_for
  needed = []

  def add(field, value, expand_dir=False):
    if not is_data_path(value):
      return
    rel = value[len(PREFIX):].strip("/")
    dataset = dataset_for(rel) if expand_dir else None
    files = [o for o in dataset.outputs if o.startswith(rel + "/")] if dataset else []
    needed.extend((field, f) for f in (files or [rel]))

  if config.setting == "coding":
    add("coding.seed_dir", config.coding.seed_dir, expand_dir=True)
    from compassplay_jax.selfplay.coding import COS_REWARDS
    if config.reward.name in COS_REWARDS:
      add("reward.reference_path", config.reward.reference_path)
  if config.setting == "lean":
    add("lean.targets_path", config.lean.targets_path)
  if config.eval.every_steps:
    from compassplay_jax.evals import benchmarks
    overridden = {e.split("=", 1)[0].strip() for e in (config.eval.paths or "").split(",") if "=" in e}
    if not config.eval.data_dir:  # "" = the data directory
      for name in benchmarks.parse_benchmark_names(config.eval.benchmarks):
        if name not in overridden:
          add("eval.benchmarks", PREFIX + benchmarks.BENCHMARKS[name].relpath)
  return needed


def missing_files(config) -> list[tuple[str, pathlib.Path, str]]:
  """(config field, file, fetch set name) for each needed file that is absent."""
  from compassplay_jax.data.sources import dataset_for
  directory = data_dir(config.get("data_dir", ""))
  out, seen = [], set()
  for field, rel in _needed(config):
    path = directory / rel
    if path.exists() or rel in seen:
      continue
    seen.add(rel)
    dataset = dataset_for(rel)
    out.append((field, path, dataset.name if dataset else ""))
  return out


def check_config(config) -> None:
  """Raises DataMissingError (one line) naming each missing file and the command that fetches it."""
  missing = missing_files(config)
  if not missing:
    return
  directory = data_dir(config.get("data_dir", ""))
  parts = [f"{path.relative_to(directory)} ({field}; {fetch_command([name], directory) if name else 'no fetch source'})"
           for field, path, name in missing]
  names = [name for _, _, name in missing if name]
  hint = f" Get them all: {fetch_command(names, directory)}" if len(set(names)) > 1 else ""
  raise DataMissingError(f"data files missing under {directory}: {'; '.join(parts)}.{hint}")


def prepare_config(config) -> None:
  """Start-up: checks the data files, then rewrites "data:" fields to absolute paths (so the run's
  config.json records the files it read) and pins eval.data_dir to the data directory."""
  check_config(config)
  directory = data_dir(config.get("data_dir", ""))
  for block, field in (("coding", "seed_dir"), ("reward", "reference_path"), ("lean", "targets_path")):
    value = config[block][field]
    if is_data_path(value):
      config[block][field] = str(resolve(value, directory))
  if not config.eval.data_dir:
    config.eval.data_dir = str(directory)
