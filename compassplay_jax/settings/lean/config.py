"""The Lean setting's config block (`config.lean`), its start-up checks and the data files it reads."""
from __future__ import annotations

import pathlib

import ml_collections

from compassplay_jax.domains.coding.reference_set import resolve_path
from compassplay_jax.domains.lean.schedule import CONDITIONING
from compassplay_jax.domains.lean.targets import load_targets
from compassplay_jax.core.errors import InputFormatError, InputNotFound
from compassplay_jax.models.config import ConfigError
from compassplay_jax.rewards.proposer_rewards import SOAR_UTILITY
from compassplay_jax.settings import DataFile
from compassplay_jax.verifiers.lean_checker import check_checker_config

PROPOSER_ADVANTAGES = ("floored_baseline", "sgs_minmax")


def block() -> ml_collections.ConfigDict:
  """config.lean with its defaults (configs/lean.py sets SGS's values with their sources)."""
  l = ml_collections.ConfigDict()
  l.command = "lake env repl"
  l.cwd = ""  # a Mathlib project directory
  l.targets_path = "data:minif2f/minif2f.jsonl"
  l.targets_limit = 0  # 0 = all targets
  l.targets_per_iteration = 0  # 0 = every target, solved ones included (SGS: the full batch)
  l.proofs_per_problem = 8
  l.num_workers = 0  # REPL processes (or kimina requests in flight) per host; 0 = its cores, memory allowing
  l.timeout_s = 60.0
  l.memory_limit_mb = 8192
  l.max_checks_per_process = 200
  # Who checks proofs (verifiers/lean_checker.py): "local" = REPL processes here (command, cwd);
  # "kimina" = a kimina-lean-server whose URL and API key are read from these environment variables.
  l.checker = "local"
  l.kimina_url_env = "COMPASSPLAY_KIMINA_URL"
  l.kimina_key_env = "COMPASSPLAY_KIMINA_API_KEY"
  l.kimina_batch_size = 8  # snippets per request (the server checks them in parallel)
  l.kimina_retries = 3  # a failed request is re-sent this often, then its proofs are system errors
  l.kimina_backoff_s = 1.0  # first wait before a retry; doubles each time
  l.kimina_request_timeout_s = 0.0  # 0 = timeout_s x kimina_batch_size + 60
  l.prefill_proof = False  # start the prover's turn with the statement's code block
  l.solver_band_max = 0.5  # REINFORCE-1/2: train on problems with 0 < s <= 0.5
  # The loop's schedule and rules (settings/lean/setting.py; configs/lean.py sets SGS's values with their sources):
  l.conditioning = "seeds"  # seeds | unsolved | all (domains/lean/schedule.py)
  l.conjectures_per_seed = 1
  l.seeds_per_iteration = 0  # 0 = every scheduled statement
  l.proposer_advantage = "floored_baseline"  # floored_baseline | sgs_minmax
  l.zero_weight_try = True  # proofs containing `try` get weight 0
  l.overlong_penalty = True  # DAPO length penalty on kept proofs longer than 0.8 x max_new_tokens
  l.conjecture_length_penalty = True  # the same penalty on trained conjectures
  l.strict_extraction = True  # one ```lean4 block, the whole answer, one declaration
  # SGS's conjecture filters (configs/lean.py turns them on): drop a conjecture whose extracted string equals a
  # target statement or an earlier conjecture, before proving (domains/lean/dedup.py); cap prompt plus
  # generation per request at this many tokens (0 = no cap; each request's budget then max_new_tokens).
  l.dedup_conjectures = False
  l.max_total_tokens = 0
  l.train_batch_size = 32  # rows per optimizer step; 0 = one step over all rows
  l.epochs_per_iteration = 1
  return l


def targets(config):
  """The run's targets (lean.targets_path, the first lean.targets_limit); one-line errors."""
  path = config.lean.targets_path
  if not path:
    raise ConfigError("config.lean.targets_path: empty; set it to a miniF2F / Lean Workbook jsonl or a json list")
  resolved = resolve_path(path)
  if not resolved.is_file():
    raise InputNotFound(f"{path}: target file not found (config.lean.targets_path)")
  found = load_targets(resolved)
  if not found:
    raise InputFormatError(f"{path}: no statements")
  limit = config.lean.targets_limit
  return found[:limit] if limit else found


def validate(config) -> None:
  """The reward the loop supports, the schedule, the target file and the Lean command, before any model loads."""
  l = config.lean
  if config.reward.name == SOAR_UTILITY:
    raise ConfigError("config.reward.name=soar_utility is not supported by the lean setting: SOAR needs a held-out "
                      "set with gold solutions and verified task rows per group, which only the coding loop builds")
  if l.conditioning not in CONDITIONING:
    raise ConfigError(f"config.lean.conditioning: {l.conditioning!r} is not one of {CONDITIONING}")
  if l.proposer_advantage not in PROPOSER_ADVANTAGES:
    raise ConfigError(f"config.lean.proposer_advantage: {l.proposer_advantage!r} is not one of {PROPOSER_ADVANTAGES}")
  for name in ("conjectures_per_seed", "proofs_per_problem", "epochs_per_iteration"):
    if l[name] < 1:
      raise ConfigError(f"config.lean.{name}: must be >= 1, got {l[name]}")
  cap, prompt_cap = l.max_total_tokens, config.sampling.max_prompt_tokens
  if cap < 0 or (cap and cap <= prompt_cap):
    raise ConfigError(f"config.lean.max_total_tokens: {cap} leaves no token to generate after a prompt of "
                      f"sampling.max_prompt_tokens={prompt_cap}; set it above that, or 0 for no cap")
  targets(config)
  check_checker_config(config.lean)


def data_files(config) -> list[DataFile]:
  return [DataFile("lean.targets_path")]


def _read_targets(path: pathlib.Path) -> None:
  load_targets(path)


# Data-dir folder -> the loader the fetch reads its files back with (data_checks.read_back).
READERS = {"minif2f/": _read_targets, "leanworkbook/": _read_targets, "d3k/": _read_targets}
