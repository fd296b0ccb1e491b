"""The drain of a slot count that is not a power of two (what a memory budget gives: 43 slots at 4 GB):
the live rows move to the largest power of two below it as soon as they fit (6 -> 4 here), not only
once half the slots are free, and precompile has that size ready."""
import jax
import numpy as np
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.sampling import SamplingConfig
from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import Request


def test_six_slots_shrink_to_four_and_keep_every_token():
  graphdef, params = nnx.split(init_decoder(ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=40), seed=3))
  config = SamplingConfig(temperature=0.8, max_new_tokens=24, eos_ids=(), bucket_lengths=(8,))
  # Budgets 4..24: the short rows end first, so 4 or fewer rows stay live while 6 slots would still run.
  requests = [Request([1 + i, 2 + i, 3], max_new_tokens=4 + 4 * (i % 6)) for i in range(9)]
  key = jax.random.key(7)
  shrinking = ContinuousEngine(graphdef, None, params, slots=6, cache_length=32, chunk_tokens=2, shrink_floor=1)
  shrinking.precompile(config, (8,), key)
  compiled = dict(shrinking.programs.compile_counts())
  got = shrinking.generate(requests, config, key)
  fixed = ContinuousEngine(graphdef, None, params, slots=6, cache_length=32, chunk_tokens=2, shrink=False)
  want = fixed.generate(requests, config, key)
  # Same draws, however the rows moved between slots (each row's tokens come from its own key).
  assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
  np.testing.assert_allclose(np.concatenate(got.logprobs), np.concatenate(want.logprobs), rtol=1e-5, atol=1e-6)
  assert [len(t) for t in got.tokens] == [r.max_new_tokens for r in requests]
  sizes = shrinking.stats.slot_sizes
  assert set(fixed.stats.slot_sizes) == {6}
  assert 4 in sizes and max(sizes) == 6  # 6 -> 4 (the old rule, halving only, went 6 -> 2 at the earliest)
  assert shrinking.stats.slot_steps < fixed.stats.slot_steps  # fewer idle slot-steps in the drain
  assert shrinking.stats.useful_slot_steps == fixed.stats.useful_slot_steps
  assert shrinking.programs.compile_counts() == compiled  # precompile had every size the drain reached
