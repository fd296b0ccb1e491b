"""The coding setting's config block (`config.coding`), its start-up checks, the data files it reads and
what its summary.json states."""
from __future__ import annotations

import importlib.resources
import pathlib

import ml_collections

from compassplay_jax.domains.coding import tasks
from compassplay_jax.core.errors import InputNotFound
from compassplay_jax.models.config import ConfigError
from compassplay_jax.rewards.proposer_rewards import SOAR_UTILITY, uses_cosine
from compassplay_jax.settings.coding import compact_prompts, local_reference
from compassplay_jax.settings import DataFile

BUILTIN = "builtin:"
PROMPT_STYLES = ("plain", "chat", "compact")


def block() -> ml_collections.ConfigDict:
  """config.coding with its defaults (configs/coding.py sets AZR's values with their sources)."""
  c = ml_collections.ConfigDict()
  c.task_types = "abduction,deduction,induction"
  c.proposals_per_type = 8
  c.solver_tasks_per_type = 8
  c.num_references = 6
  c.induction_inputs = 10
  c.solve_samples = 8
  c.buffer_cap = 16384
  c.seed_dir = ""
  c.seed_limit = 256
  c.prompt_style = "chat"  # "plain": AZR's R1 text ending in "Assistant: <think>"; "chat": chat template
  # Response scaffolds for small models ("" = off, the AZR format). The proposer's turn starts with
  # proposer_prefix; with input_scaffold the program and its input are decoded as two segments.
  c.proposer_prefix = ""
  c.input_scaffold = ""
  c.solver_prefix = ""  # {block}: output | input | python, by task type
  # Where each scaffolded proposal segment stops: a fence (the block's end), or e.g. "\n" for
  # one-line programs and inputs (the loop then closes the block).
  c.segment_stop = "```"
  # Where an unscaffolded proposer or solver response stops besides eos and its budget: AZR's rollouts
  # have no stop string (the response may go on after </answer>; answers are read from the last
  # answer block), so none by default; "</answer>" cuts each response at its first answer.
  c.answer_stop = ""
  return c


def task_types(config) -> list[str]:
  return [t.strip() for t in config.coding.task_types.split(",") if t.strip()]


def seed_dir_path(seed_dir: str):
  """builtin:NAME (a folder in compassplay_jax/data, e.g. the demo's simple programs) or a path."""
  if seed_dir.startswith(BUILTIN):
    path = importlib.resources.files("compassplay_jax") / "data" / seed_dir[len(BUILTIN):]
    if not path.is_dir():
      raise InputNotFound(f"config.coding.seed_dir: no built-in seed folder {seed_dir!r}")
    return pathlib.Path(str(path))
  from compassplay_jax.domains.coding.reference_set import resolve_path
  return resolve_path(seed_dir)


def validate(config) -> None:
  """Checks that need no model: task types, prompt style, reference and held-out files (one-line errors)."""
  from compassplay_jax.domains.coding.reference_set import reference_problems
  types = task_types(config)
  unknown = [t for t in types if t not in tasks.TASK_TYPES]
  if unknown or not types:
    raise ConfigError(f"config.coding.task_types: unknown task type(s) {unknown} (known: {tasks.TASK_TYPES})")
  if config.coding.seed_dir.startswith(BUILTIN):
    seed_dir_path(config.coding.seed_dir)  # a built-in folder that does not exist: fail before loading
  if config.coding.prompt_style not in PROMPT_STYLES:
    raise ConfigError(f"config.coding.prompt_style: {config.coding.prompt_style!r} is not one of {PROMPT_STYLES}")
  if config.coding.prompt_style == "compact" and set(types) - set(compact_prompts.TASK_TYPES):
    raise ConfigError(f"config.coding.task_types: compact prompts cover {compact_prompts.TASK_TYPES} only")
  if config.reward.reference not in local_reference.REFERENCES:
    raise ConfigError(f"config.reward.reference: {config.reward.reference!r} is not one of {local_reference.REFERENCES}")
  if uses_cosine(config.reward.name) and config.reward.reference == local_reference.EXTERNAL:
    reference_problems(config.reward)
  if config.reward.name == SOAR_UTILITY:
    from compassplay_jax.selfplay import soar_measure
    soar_measure.heldout_problems(config.reward)  # disjoint from the reference set, or a one-line error


def data_files(config) -> list[DataFile]:
  """The seed buffers, and the reference set when a cosine reward compares with it."""
  files = [DataFile("coding.seed_dir", expand_dir=True)]
  if uses_cosine(config.reward.name) and config.reward.reference == local_reference.EXTERNAL:
    files.append(DataFile("reward.reference_path"))
  return files


def summary(config) -> dict:
  """summary.json's reference set: drawn by reward.reference_seed, not the run seed."""
  if not config.reward.reference_path:
    return {}
  from compassplay_jax.domains.coding import reference_set
  return {"reference_set": reference_set.describe(config.reward)}


def _read_seed_buffer(path: pathlib.Path) -> None:
  from compassplay_jax.domains.coding import buffers
  task_type = tasks.INDUCTION if "code_f" in path.name else tasks.DEDUCTION
  buffers.load_azr_seed_file(path, task_type, limit=10 ** 9)


def _read_reference_set(path: pathlib.Path) -> None:
  from compassplay_jax.domains.coding.reference_set import load_reference_set
  load_reference_set(str(path), 1, 0)


# Data-dir folder -> the loader the fetch reads its files back with (data_checks.read_back).
READERS = {"math/": _read_reference_set, "azr_seed/": _read_seed_buffer}
