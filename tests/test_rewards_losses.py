"""Per-sequence token-mean CE over solution tokens only."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from compassplay_jax.rewards.losses import per_sequence_loss, token_counts
from tests.test_rewards_cosines import tiny_model


def test_loss_is_token_mean_ce_over_solution_targets():
  graphdef, params = tiny_model("llama")
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 97, (3, 10)))
  attn = jnp.asarray(np.array([[1] * 10, [0, 0] + [1] * 8, [1] * 10]))
  loss_mask = np.zeros((3, 10), np.int32)
  loss_mask[0, 0:] = 1  # position 0 has no predecessor: ignored
  loss_mask[1, :6] = 1  # padded targets (0, 1) never count
  loss_mask[2, 4:7] = 1
  loss_mask = jnp.asarray(loss_mask)
  got = np.asarray(jax.jit(per_sequence_loss, static_argnums=0)(graphdef, params, tokens, loss_mask, attn))
  # Jitted only for speed (op by op, a forward compiles each op): the oracle is numpy over these logits.
  logits = np.asarray(jax.jit(lambda p: nnx.merge(graphdef, p)(tokens, attention_mask=attn))(params), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  for i, targets in enumerate([range(1, 10), range(2, 6), range(4, 7)]):
    want = np.mean([-logp[i, t - 1, int(tokens[i, t])] for t in targets])
    np.testing.assert_allclose(got[i], want, rtol=1e-5)
  np.testing.assert_array_equal(token_counts(loss_mask, attn), [9, 4, 3])


def test_no_loss_tokens_gives_zero_loss_and_zero_gradient():
  graphdef, params = tiny_model("qwen2")
  tokens = jnp.ones((2, 6), jnp.int32)
  loss_mask = jnp.zeros((2, 6), jnp.int32).at[1, 0].set(1)  # only the ignored position 0
  total = lambda p: jnp.sum(per_sequence_loss(graphdef, p, tokens, loss_mask))
  loss = jax.jit(per_sequence_loss, static_argnums=0)(graphdef, params, tokens, loss_mask)
  assert np.all(np.asarray(loss) == 0.0)
  grads = jax.jit(jax.grad(total))(params)  # jitted: op by op, the backward pass compiles each op
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(grads))
