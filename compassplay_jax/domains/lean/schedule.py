"""Which statements the conjecturer is conditioned on in an iteration (docs/lean.md, "The loop").

  seeds     every seed in the pool (a target with a verified proof): the CompassPlay paper's
            setting, where the proposer sees the seed and g_ref is the gradient of the seed's
            verified proof, so cos x novelty is computable for every eligible conjecture.
  unsolved  every unsolved target, statement only: SGS's TARGET_STATEMENT_ONLY_UNSOLVED. These
            seeds have no verified proof, so cosine rewards are not computable for them.
  all       seeds first, then the unsolved targets (SGS's TARGET_STATEMENT conditions on all).
"""
import random
from collections.abc import Sequence

CONDITIONING = ("seeds", "unsolved", "all")


def conjecture_seeds(conditioning: str, seeds: Sequence[str], unsolved: Sequence[str], limit: int,
                     rng: random.Random) -> list[str]:
  """Target names to write conjectures for, in a stable order; at most `limit` (0 = all), drawn by rng."""
  if conditioning not in CONDITIONING:
    raise ValueError(f"config.lean.conditioning: {conditioning!r} is not one of {CONDITIONING}")
  chosen = {"seeds": list(seeds), "unsolved": list(unsolved),
            "all": list(dict.fromkeys([*seeds, *unsolved]))}[conditioning]
  if limit and len(chosen) > limit:
    keep = set(rng.sample(chosen, limit))
    chosen = [name for name in chosen if name in keep]
  return chosen
