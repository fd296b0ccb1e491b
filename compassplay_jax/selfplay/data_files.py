"""The data files a run reads: which ones (from its config), the start-up check that they are there and
are the pinned files, and the loaders that read fetched files back.

This module sits above the data layer (compassplay_jax/data: the data directory, the pinned sources, the
fetch) and above the modules that own the loaders (evals.benchmarks; each setting's spec names its data
files and their loaders, compassplay_jax/settings), so data/ imports none of them
(tests/test_import_layers.py).
"""
from __future__ import annotations

import pathlib

from compassplay_jax import settings
from compassplay_jax.data import fetch, sources
from compassplay_jax.data.paths import (PREFIX, DataIntegrityError, DataMissingError, data_dir, fetch_command,
                                        is_data_path, resolve)
from compassplay_jax.evals import benchmarks


def _field(config, dotted: str):
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def needed_files(config) -> list[tuple[str, str]]:
  """(config field, data-dir relpath) for every data file this config will read: its setting's
  (spec.data_files) and the evaluation's benchmarks."""
  needed = []

  def add(field, value, expand_dir=False):
    if not is_data_path(value):
      return
    rel = value[len(PREFIX):].strip("/")
    dataset = sources.dataset_for(rel) if expand_dir else None
    files = [o for o in dataset.outputs if o.startswith(rel + "/")] if dataset else []
    needed.extend((field, f) for f in (files or [rel]))

  for data_file in settings.of(config).data_files(config):
    add(data_file.field, _field(config, data_file.field), expand_dir=data_file.expand_dir)
  if config.eval.every_steps or config.eval.get("dense_every_steps", 0):
    overridden = {e.split("=", 1)[0].strip() for e in (config.eval.paths or "").split(",") if "=" in e}
    if not config.eval.data_dir:  # "" = the data directory
      for name in benchmarks.parse_benchmark_names(config.eval.benchmarks):
        if name not in overridden:
          add("eval.benchmarks", PREFIX + benchmarks.BENCHMARKS[name].relpath)
  return needed


def missing_files(config) -> list[tuple[str, pathlib.Path, str]]:
  """(config field, file, fetch set name) for each needed file that is absent."""
  directory = data_dir(config.data_dir)
  out, seen = [], set()
  for field, rel in needed_files(config):
    path = directory / rel
    if path.exists() or rel in seen:
      continue
    seen.add(rel)
    dataset = sources.dataset_for(rel)
    out.append((field, path, dataset.name if dataset else ""))
  return out


def check_config(config) -> None:
  """Raises DataMissingError (one line) naming each missing file and the command that fetches it."""
  missing = missing_files(config)
  if not missing:
    return
  directory = data_dir(config.data_dir)
  parts = [f"{path.relative_to(directory)} ({field}; {fetch_command([name], directory) if name else 'no fetch source'})"
           for field, path, name in missing]
  names = [name for _, _, name in missing if name]
  hint = f" Get them all: {fetch_command(names, directory)}" if len(set(names)) > 1 else ""
  raise DataMissingError(f"data files missing under {directory}: {'; '.join(parts)}.{hint}")


def check_hashes(config, log=print) -> list[str]:
  """Raises DataIntegrityError (one line) naming each needed file whose sha256 differs from its pin (or,
  for a converted file, from what the fetch recorded in MANIFEST.json), with the expected and the actual
  value. Returns the files that could not be checked (neither pinned nor fetched here), after logging
  one line about them."""
  directory = data_dir(config.data_dir)
  manifest = fetch.read_manifest(directory)
  bad, unchecked = [], []
  for rel in dict.fromkeys(rel for _, rel in needed_files(config)):
    if not (directory / rel).exists():
      continue
    if not fetch.expected_sha256(manifest, rel)[0]:
      unchecked.append(rel)
    elif reason := fetch.mismatch(directory, manifest, rel):
      bad.append(reason)
  if bad:
    raise DataIntegrityError(f"data files are not the pinned files: {' | '.join(bad)}")
  if unchecked:
    log(f"[compassplay] data files neither pinned nor fetched here, not checked: {', '.join(unchecked)}")
  return unchecked


def prepare_config(config) -> None:
  """Start-up: checks the data files (there, and the pinned files), then rewrites "data:" fields to
  absolute paths (so the run's config.json records the files it read) and pins eval.data_dir to the
  data directory."""
  check_config(config)
  check_hashes(config)
  directory = data_dir(config.data_dir)
  fields = ["reward.reference_path"] + [f.field for f in settings.of(config).data_files(config)]
  for dotted in dict.fromkeys(fields):
    *parents, leaf = dotted.split(".")
    block = _field(config, ".".join(parents))
    if is_data_path(block[leaf]):
      block[leaf] = str(resolve(block[leaf], directory))
  if not config.eval.data_dir:
    config.eval.data_dir = str(directory)


# ---- reading fetched files back ------------------------------------------------------------------------

def readers() -> dict:
  """Data-dir folder -> the loader a run reads its files with, from every setting's spec."""
  return {prefix: read for name in settings.names() for prefix, read in settings.get(name).readers.items()}


def reader_for(relpath: str):
  """The function that loads `relpath` as a run would, or None when no loader reads it."""
  for name, spec in benchmarks.BENCHMARKS.items():
    if spec.relpath == relpath:
      return lambda path, name=name: benchmarks.load_benchmark(name, path=path)
  return next((read for prefix, read in readers().items() if relpath.startswith(prefix)), None)


def read_back(relpath: str, path: pathlib.Path) -> None:
  """The fetch's output check: loads the converted file at `path` (destined for `relpath`) with the project
  loader that will read it in a run; the loader's error (a file it rejects) propagates."""
  read = reader_for(relpath)
  if read is None:
    raise ValueError(f"no project loader reads {relpath}")
  read(path)
