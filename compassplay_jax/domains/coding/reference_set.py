"""The external reference set of the coding setting: gold solutions of MATH-train problems.

The reference gradient g_ref is the gradient of the mean token cross-entropy of these solutions
(given their problem as the prompt) at the current parameters. The proposer never sees them.

A run's set is drawn once, by reward.reference_seed (default 0), not by the run seed: runs with seeds
0, 1, 2 share the same problems, so their cosines are measured against the same reference.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import pathlib
import random

from compassplay_jax.core import jsonl
from compassplay_jax.data import paths
from compassplay_jax.core.errors import UserError

BUILTIN_PREFIX = "builtin:"


class ReferenceSetError(UserError, ValueError):
  """A reference file that cannot supply problems with gold solutions."""


@dataclasses.dataclass(frozen=True)
class ReferenceProblem:
  problem: str
  solution: str


def _builtin_path(name: str) -> pathlib.Path:
  path = importlib.resources.files("compassplay_jax") / "data" / f"{name}.jsonl"
  if not path.is_file():
    raise ReferenceSetError(f"{BUILTIN_PREFIX}{name}: no such built-in reference set (known: builtin:math_mini)")
  return pathlib.Path(str(path))


def resolve_path(path: str) -> pathlib.Path:
  """A config path: builtin:NAME (shipped in compassplay_jax/data), or any path data.paths resolves
  (data:RELPATH in the data directory, absolute, relative to the working directory or the repo root)."""
  if path.startswith(BUILTIN_PREFIX):
    return _builtin_path(path[len(BUILTIN_PREFIX):])
  return paths.resolve_config_path(path)


def load_reference_set(path: str, size: int, seed: int) -> list[ReferenceProblem]:
  """`size` problems drawn by `seed` from a jsonl file with "problem" and "solution" per line."""
  resolved = resolve_path(path)
  if not resolved.is_file():
    raise ReferenceSetError(f"{path}: reference file not found")
  problems = []
  for line_no, record in jsonl.records(resolved, ReferenceSetError, where=path):
    problem, solution = record.get("problem"), record.get("solution")
    if not isinstance(problem, str) or not problem.strip():
      raise ReferenceSetError(f"{path}:{line_no}: no problem text (key 'problem')")
    if not isinstance(solution, str) or not solution.strip():
      raise ReferenceSetError(f"{path}:{line_no}: no gold solution (key 'solution')")
    problems.append(ReferenceProblem(problem, solution))
  if not problems:
    raise ReferenceSetError(f"{path}: no problems with gold solutions")
  if size > len(problems):
    raise ReferenceSetError(f"{path}: asked for {size} reference problems, the file has {len(problems)}")
  return random.Random(seed).sample(problems, size)


def reference_problems(reward) -> list[ReferenceProblem]:
  """The run's reference set: reward.reference_size problems of reward.reference_path, drawn with
  reward.reference_seed (independent of the run seed)."""
  return load_reference_set(reward.reference_path, reward.reference_size, reward.reference_seed)


def fingerprint(problems) -> str:
  """A short sha256 of the problems and gold solutions, in order (equal sets, equal fingerprints)."""
  digest = hashlib.sha256()
  for p in problems:
    digest.update(p.problem.encode() + b"\0" + p.solution.encode() + b"\0")
  return digest.hexdigest()[:16]


def describe(reward) -> dict:
  """What a run's summary states about its reference set: where it is drawn from, how, and a fingerprint."""
  problems = reference_problems(reward)
  return {"path": str(reward.reference_path), "size": len(problems), "seed": int(reward.reference_seed),
          "fingerprint": fingerprint(problems)}
