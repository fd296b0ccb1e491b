"""The device engine on one device: each function equals the plain library function it wraps.

The 8-device equality cases (meshes (8,1,1), (1,8,1), (2,2,2), (1,2,4)) are in tests/sharding_cases.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards import cosines, reference
from compassplay_jax.rl import losses as rl_losses
from compassplay_jax.rl import train_step as train_lib

CFG = ModelConfig(model_type="qwen2", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
TOL = dict(rtol=1e-5, atol=1e-5)


def rows(n, t, seed):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, CFG.vocab_size, (n, t)).astype(np.int32)
  mask = np.ones((n, t), np.int32)
  mask[1, :3] = 0
  loss = np.zeros((n, t), np.int32)
  loss[:, t // 2:] = 1
  return {"tokens": tokens, "attention_mask": mask, "loss_mask": loss}


def tree_close(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **TOL)


@pytest.fixture(scope="module")
def model():
  return nnx.split(init_decoder(CFG, seed=3))


def test_reward_functions_equal_the_library(model):
  graphdef, params = model
  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(reward_micro_batch=2, reward_chunk_size=2))
  ref, cand = rows(4, 12, 0), rows(6, 12, 1)
  # The library's own jits: op by op, the un-jitted functions cost more CPU (16 s vs 9 s for this test).
  want_g = reference.reference_gradient_jit(graphdef, params, ref["tokens"], ref["loss_mask"], ref["attention_mask"],
                                            micro_batch=2)
  g_ref = engine.reference_gradient(params, ref["tokens"], ref["loss_mask"], ref["attention_mask"])
  tree_close(g_ref, want_g)
  want = jax.jit(cosines.gradient_cosines, static_argnames=cosines.COSINE_STATIC_ARGNAMES)(
      graphdef, params, want_g, cand["tokens"], cand["loss_mask"], cand["attention_mask"], method="fused", chunk_size=2)
  got = engine.cosines(params, g_ref, cand["tokens"], cand["loss_mask"], cand["attention_mask"])
  np.testing.assert_allclose(np.asarray(got.cosines), np.asarray(want.cosines), **TOL)
  assert float(jnp.abs(got.cosines).max()) > 1e-3


def train_batch(graphdef, params, n, t, seed):
  b = rows(n, t, seed)
  logits = jax.jit(lambda p: nnx.merge(graphdef, p)(b["tokens"], attention_mask=b["attention_mask"]))(params)
  b["old_logprobs"] = np.asarray(rl_losses.token_logprobs(logits, jnp.asarray(b["tokens"])))
  b["advantages"] = np.linspace(-1.0, 1.0, n).astype(np.float32)
  return b


def test_train_steps_equal_the_library(model):
  graphdef, params = model
  fresh = lambda: jax.tree.map(jnp.copy, params)  # the steps donate their params
  tcfg = train_lib.TrainConfig(learning_rate=1e-3, micro_batch_size=2)
  b = train_batch(graphdef, params, 4, 10, 2)
  p0, o0 = train_lib.init_train_state(fresh(), tcfg)
  want_p, _, want_m = train_lib.make_train_step(graphdef, tcfg, donate=False)(p0, o0, b, jax.random.key(0))

  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=tcfg))
  p, o = engine.init_train_state(fresh())
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(p))
  new_p, _, metrics = engine.train_step(p, o, engine.put_batch(b), jax.random.key(0))
  tree_close(new_p, want_p)
  np.testing.assert_allclose(metrics["loss"], want_m["loss"], **TOL)

  # The length-bucketed step: the same rows as two micro-batches of different lengths.
  halves = [{k: v[:2] for k, v in b.items()}, {k: v[2:, 4:] if v.ndim == 2 else v[2:] for k, v in b.items()}]
  want_p2, _, _ = train_lib.make_bucketed_train_step(graphdef, tcfg)(*train_lib.init_train_state(fresh(), tcfg),
                                                                     halves, jax.random.key(0))
  got_p2, _, _ = engine.bucketed_train_step(*engine.init_train_state(fresh()), halves, jax.random.key(0))
  tree_close(got_p2, want_p2)
  assert np.abs(np.asarray(jax.tree.leaves(got_p2)[0]) - np.asarray(jax.tree.leaves(params)[0])).max() > 1e-5


def test_micro_batches_are_rounded_to_the_mesh_where_results_do_not_change():
  mesh = jax.sharding.AbstractMesh((2, 2, 2), sh.AXES)
  fitted = EngineSettings(train=train_lib.TrainConfig(micro_batch_size=1), reward_micro_batch=3).fitted(mesh)
  assert (fitted.train.micro_batch_size, fitted.reward_micro_batch) == (4, 4)
  per_micro = train_lib.TrainConfig(micro_batch_size=1, aggregation="microbatch_token_mean")
  with pytest.raises(sh.ShardingError, match="micro_batch_size=1 is not a multiple of data\\*fsdp=4"):
    EngineSettings(train=per_micro).fitted(mesh)
