"""Compiled memory (XLA memory analysis, compile only) of the fused and direct cosine methods."""
import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import Decoder
from compassplay_jax.rewards.cosines import gradient_cosines
from compassplay_jax.rewards.losses import per_sequence_loss

T = 32


def abstract_model(tied, remat=False):
  cfg = ModelConfig(model_type="llama", vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied, remat=remat)
  return nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))


def peak_bytes(fn, *args):
  """Arguments + outputs + temporaries of the compiled program: its whole footprint."""
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def batch(n):
  return jax.ShapeDtypeStruct((n, T), jnp.int32)


def train_step_bytes(graphdef, params, n):
  """One batched forward + backward: the gradient of the mean loss."""
  step = lambda p, t, m: jax.grad(lambda q: jnp.mean(per_sequence_loss(graphdef, q, t, m, m)))(p)
  return peak_bytes(step, params, batch(n), batch(n))


def cosine_bytes(graphdef, params, n, method, chunk_size):
  fn = functools.partial(gradient_cosines, graphdef, method=method, chunk_size=chunk_size)
  return peak_bytes(lambda p, g, t, m: fn(p, g, t, m, m), params, params, batch(n), batch(n))


@pytest.mark.parametrize("tied,remat", [(False, False), (True, True)])
def test_fused_memory_is_that_of_a_training_step(tied, remat):
  graphdef, params = abstract_model(tied, remat)
  p_bytes = 4 * sum(x.size for x in jax.tree.leaves(params))
  fused = {n: cosine_bytes(graphdef, params, n, "fused", 8) for n in (32, 64)}
  train = {n: train_step_bytes(graphdef, params, n) for n in (32, 64)}
  assert fused[64] <= 1.5 * train[64], (fused, train)
  # Growing N adds activations only (as a training step does), never per-example gradients.
  assert fused[64] - fused[32] <= 1.5 * (train[64] - train[32]), (fused, train)
  assert fused[64] - fused[32] < 32 * p_bytes  # 32 more per-example gradients would be this


def test_direct_peak_is_bounded_by_its_chunk():
  graphdef, params = abstract_model(tied=False)
  p_bytes = 4 * sum(x.size for x in jax.tree.leaves(params))
  small = cosine_bytes(graphdef, params, 64, "direct", 2)
  large = cosine_bytes(graphdef, params, 64, "direct", 16)
  assert small < large
  assert small < 16 * p_bytes  # far from vmap(grad)'s N x P
  # The peak follows the chunk, not N: 4x the candidates at chunk 2 costs (almost) nothing.
  assert small <= 1.1 * cosine_bytes(graphdef, params, 16, "direct", 2)
