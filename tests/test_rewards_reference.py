"""Reference gradient: micro-batch accumulation equals the full-batch gradient of the mean loss."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.rewards.losses import per_sequence_loss
from compassplay_jax.rewards.reference import reference_gradient_jit, reference_loss_and_gradient
from tests.test_rewards_cosines import batch, tiny_model


@pytest.fixture(scope="module")
def setup():
  graphdef, params = tiny_model("qwen2", tied=True)
  return graphdef, params, batch(n=5, seed=3)  # the last row has no loss tokens


def test_micro_batches_match_the_full_batch_mean(setup):
  graphdef, params, (tokens, loss_mask, attn) = setup

  def mean_loss(p):  # the mean over the 4 rows that have loss tokens
    return jnp.sum(per_sequence_loss(graphdef, p, tokens, loss_mask, attn)) / 4.0

  want = jax.jit(jax.grad(mean_loss))(params)
  for micro_batch in (1, 3, 8):  # 3 does not divide 5: padded; 8 > 5: clamped
    got = reference_gradient_jit(graphdef, params, tokens, loss_mask, attn, micro_batch=micro_batch)
    assert jax.tree.structure(got) == jax.tree.structure(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert g.shape == w.shape and g.dtype == w.dtype
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(w))))


def test_loss_and_empty_reference_set(setup):
  graphdef, params, (tokens, loss_mask, attn) = setup
  loss, _ = jax.jit(reference_loss_and_gradient, static_argnums=(0, 5))(graphdef, params, tokens, loss_mask, attn, 2)
  want = jnp.sum(per_sequence_loss(graphdef, params, tokens, loss_mask, attn)) / 4.0
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  zero = reference_gradient_jit(graphdef, params, tokens, jnp.zeros_like(loss_mask), attn, micro_batch=2)
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(zero))
