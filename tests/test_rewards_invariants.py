"""Invariants of the gradient cosines: self-alignment, loss scale, masked tokens, remat, empty rows."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.rewards import losses
from compassplay_jax.rewards.cosines import gradient_cosines
from compassplay_jax.rewards.reference import reference_gradient
from tests.test_rewards_cosines import batch, reference, run, tiny_model

METHODS = ("direct", "fused")


@pytest.fixture(scope="module")
def tied_qwen():
  graphdef, params = tiny_model("qwen2", tied=True)
  return graphdef, params, reference(graphdef, params), batch(n=4)


def fresh_cosines(*args, **kwargs):
  """An un-cached jit, so a monkeypatched loss is traced anew."""
  return jax.jit(lambda *a: gradient_cosines(*a, **kwargs))(*args)


@pytest.mark.parametrize("method", METHODS)
def test_candidate_equal_to_one_example_reference_has_cosine_one(tied_qwen, method):
  graphdef, params, _, (tokens, loss_mask, attn) = tied_qwen
  g_ref = jax.jit(reference_gradient, static_argnums=(0, 5))(graphdef, params, tokens[1:2], loss_mask[1:2],
                                                            attn[1:2], 1)
  res = run(graphdef, params, g_ref, (tokens, loss_mask, attn), method)
  np.testing.assert_allclose(res.cosines[1], 1.0, atol=1e-5)
  assert np.all(np.abs(np.asarray(res.cosines)[[0, 2]]) < 0.999)


def test_scaling_the_loss_changes_no_cosine(tied_qwen, monkeypatch):
  graphdef, params, _, (tokens, loss_mask, attn) = tied_qwen
  ref_data = batch(n=3, seed=5)

  def all_methods():
    g_ref = jax.jit(lambda p, *d: reference_gradient(graphdef, p, *d, micro_batch=2))(params, *ref_data)
    return [fresh_cosines(graphdef, params, g_ref, tokens, loss_mask, attn, method=m, chunk_size=2) for m in METHODS]

  base = all_methods()
  original = losses.masked_token_mean_ce
  monkeypatch.setattr(losses, "masked_token_mean_ce", lambda *a: 3.5 * original(*a))
  scaled = all_methods()
  for b, s in zip(base, scaled):
    np.testing.assert_allclose(s.cosines, b.cosines, atol=1e-6)
    np.testing.assert_allclose(s.inner_products, 3.5 ** 2 * b.inner_products, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(s.sq_norms, 3.5 ** 2 * b.sq_norms, rtol=1e-5)
    np.testing.assert_allclose(s.ref_sq_norm, 3.5 ** 2 * b.ref_sq_norm, rtol=1e-5)
  # A scaled g_ref alone changes the raw inner products, not the cosines.
  g_ref = reference(graphdef, params)
  a = run(graphdef, params, g_ref, (tokens, loss_mask, attn), "fused")
  b = run(graphdef, params, jax.tree.map(lambda g: 0.01 * g, g_ref), (tokens, loss_mask, attn), "fused")
  np.testing.assert_allclose(b.cosines, a.cosines, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_tokens_outside_the_solution_mask_change_nothing(tied_qwen, method):
  graphdef, params, g_ref, (tokens, loss_mask, attn) = tied_qwen
  # Padding ids, and tokens after each solution ends (nothing later is scored), are free.
  t = tokens.shape[1]
  last = np.array([max(np.nonzero(row)[0], default=0) for row in np.asarray(loss_mask)])
  after = np.arange(t)[None, :] > last[:, None]
  after[np.asarray(loss_mask).sum(1) == 0] = False  # an empty row has no "after"
  free = (np.asarray(attn) == 0) | after
  assert free.any()
  changed = jnp.where(jnp.asarray(free), (tokens + 11) % 97, tokens)
  a = run(graphdef, params, g_ref, (tokens, loss_mask, attn), method)
  b = run(graphdef, params, g_ref, (changed, loss_mask, attn), method)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-12)


def test_remat_on_and_off_agree():
  data = batch(n=4)
  for method in METHODS:
    out = []
    for remat in (False, True):
      graphdef, params = tiny_model("llama", tied=True, remat=remat, layers=2)
      out.append(run(graphdef, params, reference(graphdef, params), data, method, chunk_size=2))
    for x, y in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])):
      np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_no_loss_tokens_and_zero_reference_give_zero_not_nan(tied_qwen, method):
  graphdef, params, g_ref, (tokens, loss_mask, attn) = tied_qwen
  res = run(graphdef, params, g_ref, (tokens, loss_mask, attn), method)
  assert not bool(res.has_loss_tokens[-1])
  assert float(res.cosines[-1]) == 0.0 and float(res.sq_norms[-1]) == 0.0 and float(res.inner_products[-1]) == 0.0
  zero = run(graphdef, params, jax.tree.map(jnp.zeros_like, g_ref), (tokens, loss_mask, attn), method)
  assert np.all(np.asarray(zero.cosines) == 0.0) and np.all(np.isfinite(zero.cosines))
  none = run(graphdef, params, g_ref, (tokens, jnp.zeros_like(loss_mask), attn), method)
  assert np.all(np.asarray(none.cosines) == 0.0) and not np.any(np.asarray(none.has_loss_tokens))
