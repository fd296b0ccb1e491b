"""The seed pool: every target with a verified proof, and the proof the local reference uses.

A seed's proof is the completion text of a verified proof (what the prover wrote after its
prompt), so g_ref = the solver's loss gradient on (prover prompt of the seed, that completion) at
the current parameters. A seed keeps its most recent verified proof (the current policy's), the
iteration it came from, and where it came from ("prover", or "supplied" with the target file).
The pool only grows: a target once proved stays a seed. Saved in checkpoints via to_json().
"""
import dataclasses
import json
from collections.abc import Iterable

from compassplay_jax.domains.lean.state_json import load_versioned

_FORMAT_VERSION = 1
SOURCES = ("prover", "supplied")


@dataclasses.dataclass(frozen=True)
class SeedProof:
  completion: str  # the prover's completion (after any prefill) whose proof body Lean accepted
  iteration: int   # when it was verified (0: a supplied proof checked before iteration 1)
  source: str      # "prover" | "supplied"


class SeedPool:
  """Target name -> SeedProof, in target order."""

  def __init__(self, target_names: Iterable[str]):
    self.target_names = tuple(dict.fromkeys(target_names))
    self._order = {name: i for i, name in enumerate(self.target_names)}
    self._seeds: dict[str, SeedProof] = {}

  def add(self, name: str, completion: str, iteration: int, source: str = "prover") -> None:
    """Records a verified proof of target `name` (replacing an older one)."""
    if name not in self._order:
      raise ValueError(f"SeedPool.add: unknown target '{name}'")
    if source not in SOURCES:
      raise ValueError(f"SeedPool.add: source must be one of {SOURCES}, got {source!r}")
    self._seeds[name] = SeedProof(completion, int(iteration), source)

  def copy(self) -> "SeedPool":
    """A pool with the same seeds that changes apart from this one (a step's plan adds to its copy)."""
    other = SeedPool(self.target_names)
    other._seeds = dict(self._seeds)
    return other

  def get(self, name: str) -> SeedProof | None:
    return self._seeds.get(name)

  @property
  def names(self) -> list[str]:
    """Seeds in target order."""
    return sorted(self._seeds, key=self._order.__getitem__)

  def __len__(self) -> int:
    return len(self._seeds)

  def __contains__(self, name: str) -> bool:
    return name in self._seeds

  def to_json(self) -> str:
    return json.dumps({"version": _FORMAT_VERSION, "targets": list(self.target_names),
                       "seeds": {n: dataclasses.asdict(s) for n, s in self._seeds.items()}},
                      ensure_ascii=False, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "SeedPool":
    data = load_versioned(text, "SeedPool.from_json", _FORMAT_VERSION, ("targets", "seeds"))
    pool = cls(data["targets"])
    for name, seed in data["seeds"].items():
      pool.add(name, seed["completion"], seed["iteration"], seed["source"])
    return pool
