"""Cumulative coverage: the fraction of targets ever proved, with when each was first proved.

This is SGS's headline metric ("cumulative solve rate"): a target counts once any
verified proof exists, and stays solved. The training loop stores to_json() in
its checkpoint and rebuilds the object with Coverage.from_json() on resume.
"""
import json
from collections.abc import Iterable

from compassplay_jax.domains.lean.state_json import load_versioned

_FORMAT_VERSION = 1


class Coverage:
  """Which targets are solved, the iteration each was first solved, and the curve."""

  def __init__(self, target_names: Iterable[str]):
    self.target_names = tuple(dict.fromkeys(target_names))
    self._targets = frozenset(self.target_names)
    self._first_solved: dict[str, int] = {}
    self._curve: list[dict] = []  # One point per record(): iteration, solved, generations.

  def record(self, iteration: int, solved_target_names: Iterable[str],
             generations: int | None = None) -> list[str]:
    """Marks targets proved at `iteration`; returns those solved for the first time.

    `generations` (cumulative model generations so far) is kept on the curve for
    SGS's coverage-vs-compute plot. Iterations may repeat (a resumed iteration)
    but must not go back.
    """
    if self._curve and iteration < self._curve[-1]["iteration"]:
      raise ValueError(f"Coverage.record: iteration {iteration} is before the last recorded "
                       f"iteration {self._curve[-1]['iteration']}")
    new = []
    for name in solved_target_names:
      if name not in self._targets:
        raise ValueError(f"Coverage.record: unknown target '{name}'")
      if name not in self._first_solved:
        self._first_solved[name] = iteration
        new.append(name)
    point = {"iteration": iteration, "solved": len(self._first_solved)}
    if generations is not None:
      point["generations"] = generations
    self._curve.append(point)
    return new

  @property
  def solved(self) -> frozenset[str]:
    return frozenset(self._first_solved)

  @property
  def unsolved(self) -> list[str]:
    """Targets with no proof yet, in target order (the conjecturer's seeds in SGS)."""
    return [n for n in self.target_names if n not in self._first_solved]

  @property
  def history(self) -> dict[str, int]:
    """Target name -> iteration at which it was first solved."""
    return dict(self._first_solved)

  @property
  def curve(self) -> list[dict]:
    """Cumulative solved count after each record() call."""
    return [dict(p) for p in self._curve]

  @property
  def fraction(self) -> float:
    return len(self._first_solved) / len(self._targets) if self._targets else 0.0

  def to_json(self) -> str:
    return json.dumps({"version": _FORMAT_VERSION, "targets": list(self.target_names),
                       "first_solved": self._first_solved, "curve": self._curve},
                      ensure_ascii=False, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "Coverage":
    data = load_versioned(text, "Coverage.from_json", _FORMAT_VERSION, ("targets", "first_solved", "curve"))
    coverage = cls(data["targets"])
    unknown = set(data["first_solved"]) - coverage._targets
    if unknown:
      raise ValueError(f"Coverage.from_json: key 'first_solved' names unknown target "
                       f"'{sorted(unknown)[0]}'")
    coverage._first_solved = {str(k): int(v) for k, v in data["first_solved"].items()}
    coverage._curve = [dict(p) for p in data["curve"]]
    return coverage
