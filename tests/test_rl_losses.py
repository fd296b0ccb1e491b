"""The policy-gradient loss and its gradient against a hand computation in numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compassplay_jax.rl import losses

B, T, V = 3, 6, 5
TEMP = 0.7


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _case(seed=0):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(B, T, V)) * 2.0
  tokens = rng.integers(0, V, size=(B, T))
  mask = np.zeros((B, T))
  mask[0, 2:] = 1
  mask[1, 3:5] = 1
  mask[2, 1:] = 1
  adv = np.array([1.3, -0.7, 0.4])
  logp = np.zeros((B, T))
  for b in range(B):
    for t in range(1, T):
      logp[b, t] = _log_softmax(logits[b, t - 1] / TEMP)[tokens[b, t]]
  # Old log-probs off by up to ±0.6 so that some ratios leave [0.8, 1.2] and the clip binds.
  old = logp + rng.uniform(-0.6, 0.6, size=(B, T))
  ref = logp + rng.uniform(-0.5, 0.5, size=(B, T))
  return logits, tokens, mask, adv, old, ref


def _hand(logits, tokens, mask, adv, old, ref, ent_c, kl_c, eps_lo=0.2, eps_hi=0.2):
  """Loss and d loss / d logits written out token by token."""
  n = mask.sum()
  loss = 0.0
  grad = np.zeros_like(logits)
  clipped_tokens = 0
  for b in range(B):
    for t in range(1, T):
      if not mask[b, t]:
        continue
      z = logits[b, t - 1] / TEMP
      lp = _log_softmax(z)
      p = np.exp(lp)
      y = tokens[b, t]
      l = lp[y]
      a = adv[b]
      rho = np.exp(l - old[b, t])
      unclipped, clipped = -a * rho, -a * np.clip(rho, 1 - eps_lo, 1 + eps_hi)
      onehot = np.eye(V)[y]
      d_l = 0.0
      if unclipped >= clipped:
        d_l += -a * rho  # d(-a·ρ)/dl; the clipped branch is constant in l when it wins
      else:
        clipped_tokens += 1
      h = -(p * lp).sum()
      d_h_dz = -p * (lp + h)
      diff = ref[b, t] - l
      k3 = np.exp(diff) - diff - 1
      d_l += kl_c * (1 - np.exp(diff))
      loss += (max(unclipped, clipped) - ent_c * h + kl_c * k3) / n
      grad[b, t - 1] = (d_l * (onehot - p) - ent_c * d_h_dz) / TEMP / n
  return loss, grad, clipped_tokens


@pytest.mark.parametrize("ent_c,kl_c", [(0.0, 0.0), (0.01, 0.0), (0.003, 0.05)])
def test_loss_and_gradient_match_hand_computation(ent_c, kl_c):
  logits, tokens, mask, adv, old, ref = _case()
  want_loss, want_grad, n_clipped = _hand(logits, tokens, mask, adv, old, ref, ent_c, kl_c)
  assert n_clipped > 0  # the case exercises the clip

  def f(lg):
    return losses.policy_gradient_loss(
        lg, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(adv, jnp.float32), jnp.asarray(old, jnp.float32),
        entropy_coef=ent_c, kl_coef=kl_c, ref_logprobs=jnp.asarray(ref, jnp.float32) if kl_c else None,
        temperature=TEMP)

  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logits, jnp.float32))
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-6)
  assert float(metrics["num_tokens"]) == mask.sum()
  assert 0 < float(metrics["clip_frac"]) < 1


def test_token_logprobs_alignment_and_padding():
  logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]))
  tokens = jnp.array([[2, 1, 2]])
  got = losses.token_logprobs(logits, tokens)
  # Column 0 unused; column t is logits[t - 1] at tokens[t].
  np.testing.assert_allclose(got, np.log([[1.0, 0.25, 0.8]]), rtol=1e-6)
  ent = losses.token_entropy(logits)
  np.testing.assert_allclose(ent[0, 1], -(0.5 * np.log(0.5) + 0.5 * np.log(0.25)), rtol=1e-6)
  assert float(ent[0, 0]) == 0.0


def test_padding_garbage_and_empty_mask_stay_finite():
  logits, tokens, mask, adv, old, _ = _case(1)
  old = np.where(mask > 0, old, -np.inf)  # padding positions may hold anything
  f = lambda lg, m: losses.policy_gradient_loss(lg, jnp.asarray(tokens), m, jnp.asarray(adv, jnp.float32),
                                                jnp.asarray(old, jnp.float32))[0]
  for m in (jnp.asarray(mask), jnp.zeros((B, T))):
    loss, grad = jax.value_and_grad(f)(jnp.asarray(logits, jnp.float32), m)
    assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grad)).all()


def test_kl_without_reference_is_an_error():
  logits, tokens, mask, adv, old, _ = _case()
  with pytest.raises(ValueError, match="ref_logprobs is None"):
    losses.policy_gradient_loss(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(adv),
                                jnp.asarray(old), kl_coef=0.1)
