"""The coding setting's reference set is drawn by reward.reference_seed, not the run seed: runs with seeds
0, 1 and 2 measure their cosines against the same problems (issue 26 item 4)."""
import pathlib
import sys

import numpy as np
import pytest

from compassplay_jax.domains.coding import reference_set
from tests.conftest import shared_file

REPO = pathlib.Path(__file__).resolve().parents[1]


def _tiny_config(**reward):
  sys.path.insert(0, str(REPO / "configs"))
  try:
    import coding  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  config = coding.get_config("tiny")
  config.reward.update(reward)
  return config


@pytest.fixture(scope="module")
def tokenizer():
  """The tiny config's tokenizer (the embedded SmolLM2 one); no model is needed to pack the set."""
  from compassplay_jax.models.gguf_io import embedded_gguf_path, load_gguf_tokenizer
  return load_gguf_tokenizer(embedded_gguf_path())


def _packed_reference(config, tokenizer):
  """The reference tokens the coding setting packs for g_ref (the run's own code path)."""
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  setting = CodingSelfPlay(config, tokenizer, pool=None)
  assert setting.reference is not None
  return np.asarray(setting.reference.tokens)


def _same_for_run_seeds(tokenizer, **reward):
  packed, described = [], []
  for seed in (0, 1, 2):
    config = _tiny_config(**reward)
    config.seed = seed
    packed.append(_packed_reference(config, tokenizer))
    described.append(reference_set.describe(config.reward))
  assert all(np.array_equal(packed[0], p) for p in packed[1:])
  assert described[0] == described[1] == described[2]
  return packed[0], described[0]


def test_run_seeds_share_the_builtin_reference_set(tokenizer):
  """Fixture: the demo's 12-problem built-in set, 4 drawn (a seed-dependent draw would differ)."""
  packed, described = _same_for_run_seeds(tokenizer, reference_size=4)
  expected = reference_set.load_reference_set("builtin:math_mini", 4, 0)
  assert described == {"path": "builtin:math_mini", "size": 4, "seed": 0,
                       "fingerprint": reference_set.fingerprint(expected)}
  # The setting is live: another reference_seed draws another set.
  other = _tiny_config(reference_size=4, reference_seed=1)
  assert reference_set.fingerprint(reference_set.reference_problems(other.reward)) != described["fingerprint"]
  assert not np.array_equal(_packed_reference(other, tokenizer), packed)


def test_run_seeds_share_the_32_math_train_problems(tokenizer):
  """The paper's set: 32 problems of the MATH-train file, the same for seeds 0, 1 and 2."""
  path = shared_file("math/train.jsonl")
  _, described = _same_for_run_seeds(tokenizer, reference_path=str(path), reference_size=32)
  problems = reference_set.load_reference_set(str(path), 32, 0)
  assert described["size"] == 32 and described["fingerprint"] == reference_set.fingerprint(problems)
  # What the old draw (by the run seed) gave: three disjoint sets.
  drawn = [{p.problem for p in reference_set.load_reference_set(str(path), 32, s)} for s in (0, 1, 2)]
  assert not (drawn[0] & drawn[1]) and not (drawn[0] & drawn[2]) and not (drawn[1] & drawn[2])
