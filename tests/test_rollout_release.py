"""The rollout engine's memory goes back before the update (issue 47 item 2): after a generate call
the continuous engine holds its KV cache and a compute-dtype weight copy; `Engine.release_rollout_memory`
returns both (live device buffers counted before and after, against the cache's size by formula), and
the next call allocates them again and samples the same tokens without compiling anything. That the
step calls it before every update: test_session.py (memory/rollout_released_bytes in a run's metrics)."""
import gc

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl.train_step import TrainConfig
from compassplay_jax.sampling import SamplingConfig
from compassplay_jax.sampling.rollout_engine import Request


def _live_bytes() -> int:
  gc.collect()
  return sum(x.nbytes for x in jax.live_arrays())


@pytest.mark.parametrize("kv_layout", ["dense", "paged"])
def test_release_returns_the_cache_and_the_weight_copy_and_the_next_call_matches(kv_layout):
  cfg = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  params = jax.tree.map(jnp.asarray, params)
  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=TrainConfig(compute_dtype="bfloat16")))
  sampling = ml_collections.ConfigDict({"engine": "continuous", "memory_budget_gb": 2 ** -8, "chunk_tokens": 4,
                                        "kv_layout": kv_layout})
  config = SamplingConfig(temperature=0.7, max_new_tokens=12, eos_ids=(), bucket_lengths=(8,))
  requests = [Request([1 + i, 2, 3, 4 + i], max_new_tokens=4 + 2 * i) for i in range(5)]

  def generate():
    rollout = engine.rollout_engine(None, sampling)
    rollout.update_params(engine.sampler_params(params))
    return rollout.generate(requests, config, jax.random.key(3))

  baseline = _live_bytes()  # the policy's params
  first = generate()
  rollout = engine.rollout
  held = _live_bytes()
  # What the engine keeps between calls, by formula: the KV cache it kept (k and v per layer: slots x
  # cache columns, or the pool's pages x page size, x kv heads x head dim in the cache dtype) and a bf16
  # copy of every weight.
  if kv_layout == "dense":
    slots, columns = rollout._state.cache[0].k.shape[:2]  # pylint: disable=protected-access
  else:
    kv, pages, page_size, _ = rollout._state.pages[0].k.shape  # pylint: disable=protected-access
    slots, columns = pages, page_size
    assert kv == cfg.num_key_value_heads and rollout.stats.pages > 0
  cache = 2 * cfg.num_hidden_layers * slots * columns * cfg.num_key_value_heads * cfg.head_dim * \
      np.dtype(rollout.cache_dtype).itemsize
  weights = sum(x.size * 2 for x in jax.tree.leaves(params))
  assert held - baseline >= cache + weights
  released = engine.release_rollout_memory()
  after = _live_bytes()
  assert after == baseline, (baseline, held, after)  # every buffer the engine held is gone
  assert released >= cache + weights
  counts = lambda: (rollout.programs.compile_counts(), rollout.paged_programs.compile_counts())
  compiles = counts()
  second = generate()  # allocates again: same shapes, so no program compiles
  assert counts() == compiles
  assert [t.tolist() for t in second.tokens] == [t.tolist() for t in first.tokens]
  np.testing.assert_array_equal(np.concatenate(second.logprobs), np.concatenate(first.logprobs))
