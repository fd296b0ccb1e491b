"""The seed pool (checkpointed verified proofs) and the conditioning schedule."""
import random

import pytest

from compassplay_jax.domains.lean.schedule import conjecture_seeds
from compassplay_jax.domains.lean.seed_pool import SeedPool


def test_pool_keeps_newest_proof_in_target_order_and_round_trips():
  pool = SeedPool(["a", "b", "c"])
  pool.add("c", "\n  simp\n```", 1)
  pool.add("a", "\n  omega\n```", 0, source="supplied")
  pool.add("c", "\n  norm_num\n```", 3)
  assert pool.names == ["a", "c"] and len(pool) == 2 and "b" not in pool
  assert pool.get("c").completion == "\n  norm_num\n```" and pool.get("c").iteration == 3
  again = SeedPool.from_json(pool.to_json())
  assert again.to_json() == pool.to_json() and again.get("a").source == "supplied"


@pytest.mark.parametrize("text, message", [
    ("not json", "SeedPool.from_json: invalid JSON"),
    ('{"version": 9}', "expected key 'version' = 1"),
    ('{"version": 1, "targets": []}', "missing key 'seeds'"),
    ('{"version": 1, "targets": ["a"], "seeds": {"z": {"completion": "", "iteration": 1, "source": "prover"}}}',
     "unknown target 'z'"),
])
def test_pool_rejects_bad_state_with_one_line(text, message):
  with pytest.raises(ValueError, match=message):
    SeedPool.from_json(text)


def test_pool_rejects_unknown_source():
  with pytest.raises(ValueError, match="source must be one of"):
    SeedPool(["a"]).add("a", "x", 1, source="guess")


def test_schedule_picks_seeds_unsolved_or_both():
  rng = random.Random(0)
  assert conjecture_seeds("seeds", ["a", "c"], ["b", "d"], 0, rng) == ["a", "c"]
  assert conjecture_seeds("unsolved", ["a", "c"], ["b", "d"], 0, rng) == ["b", "d"]
  assert conjecture_seeds("all", ["a", "c"], ["b", "d"], 0, rng) == ["a", "c", "b", "d"]
  limited = conjecture_seeds("all", ["a", "c"], ["b", "d"], 3, random.Random(1))
  assert len(limited) == 3 and limited == [n for n in ["a", "c", "b", "d"] if n in limited]
  with pytest.raises(ValueError, match="config.lean.conditioning: 'targets' is not one of"):
    conjecture_seeds("targets", [], [], 0, rng)
