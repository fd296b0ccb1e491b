"""The settings a run can name (`config.setting`), registered by name.

A setting is one package: its Setting class (selfplay/step.py's protocol), its config block and its
checks, the data files it reads, its metrics and candidate-record fields. It registers a SettingSpec
here. The built-in settings are this package's subpackages (coding/, lean/), imported on their first
lookup; a plug-in calls `register(spec)` before it builds a config or a Session (docs/architecture.md,
"Adding a setting"). The loop, the session, the run and the reports ask the spec and never compare a
setting's name.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Mapping, Sequence

from compassplay_jax.models.config import ConfigError


@dataclasses.dataclass(frozen=True)
class DataFile:
  """A config field that names a data file the run reads ("data:<relpath>" paths are checked and fetched)."""
  field: str                # dotted, e.g. "coding.seed_dir"
  expand_dir: bool = False  # the value is a folder: every file of its fetched data set is needed


def _nothing(*_args) -> None:
  return None


def _no_files(_config) -> Sequence[DataFile]:
  return ()


def _no_summary(_config) -> dict:
  return {}


@dataclasses.dataclass(frozen=True)
class SettingSpec:
  """What the run needs to know of a setting, by name."""
  name: str
  config_block: Callable[[], Any]      # () -> ConfigDict: config.<name>, the setting's fields and defaults
  build: Callable[..., Any]            # (config, tokenizer, sampler=None) -> a step.Setting (opens its verifier)
  validate: Callable[[Any], None] = _nothing  # config -> None; raises one-line ConfigErrors before anything loads
  data_files: Callable[[Any], Sequence[DataFile]] = _no_files  # config -> the data files this run reads
  readers: Mapping[str, Callable] = dataclasses.field(default_factory=dict)  # data-dir folder -> loader(path)
  summary_keys: tuple[tuple[str, str], ...] = ()  # (label, metric key) added to the per-step line
  summary: Callable[[Any], dict] = _no_summary  # config -> extra summary.json fields
  reference_set: Callable[[Any], Any] = _nothing  # setting -> the PackedBatch of Session.reference_loss, or None


_SPECS: dict[str, SettingSpec] = {}


def register(spec: SettingSpec, *, replace: bool = False) -> SettingSpec:
  """Makes `spec` the setting named spec.name. Registering another spec under a taken name needs
  replace=True; registering the same spec again is a no-op."""
  if not isinstance(spec, SettingSpec):
    raise TypeError(f"settings.register: want a SettingSpec, got {type(spec).__name__}")
  old = _SPECS.get(spec.name)
  if old is not None and old is not spec and not replace:
    raise ValueError(f"settings.register: a setting named {spec.name!r} is registered already (replace=True)")
  _SPECS[spec.name] = spec
  return spec


def builtin_names() -> tuple[str, ...]:
  """The built-in settings: this package's subpackages."""
  return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg))


def names() -> tuple[str, ...]:
  """Every setting a config may name: the built-ins and the registered plug-ins."""
  return tuple(sorted(set(builtin_names()) | set(_SPECS)))


def get(name: str) -> SettingSpec:
  """The spec of setting `name` (a built-in is imported, and so registered, on its first lookup)."""
  if name not in _SPECS and name in builtin_names():
    importlib.import_module(f"{__name__}.{name}")
  if name not in _SPECS:
    raise ConfigError(f"config.setting: {name!r} is not one of {names()}")
  return _SPECS[name]


def of(config) -> SettingSpec:
  """The spec of config.setting."""
  return get(config.setting)
