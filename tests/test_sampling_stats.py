"""Token selection statistics on a tiny vocabulary: frequencies match softmax(logits / T) restricted
by top-k/top-p (the numpy reference below follows transformers' warper order: T, top-k, top-p)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.sampling import SamplerParams, SamplingConfig, generate
from compassplay_jax.sampling.token_select import select_tokens

LOGITS = np.array([2.0, 1.5, 0.3, -0.4, 1.1, -2.0], np.float32)


def _reference(logits, temperature, top_k, top_p):
  scaled = logits / temperature
  order = np.argsort(-scaled, kind="stable")
  keep = np.ones(len(logits), bool)
  if top_k:
    keep[order[top_k:]] = False
  p = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
  p /= p.sum()
  if top_p < 1:
    sorted_p = p[order]
    before = np.cumsum(sorted_p) - sorted_p
    keep[order[before >= top_p]] = False
    p = np.where(keep, p, 0.0)
    p /= p.sum()
  return p


def _assert_frequencies(samples, p, n):
  freq = np.bincount(samples, minlength=len(p)) / n
  bound = 5 * np.sqrt(p * (1 - p) / n) + 1e-9  # 5 sigma per token
  assert np.all(np.abs(freq - p) <= bound), (freq, p)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.6, 0, 1.0), (1.4, 3, 1.0), (1.0, 0, 0.8), (0.9, 4, 0.7), (1.0, 0, 0.3)])
def test_frequencies_match_truncated_softmax(temperature, top_k, top_p):
  n = 40000
  keys = jax.random.split(jax.random.key(0), n)
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (n, len(LOGITS)))
  sampler = SamplerParams(temperature, top_p, top_k)
  tokens, logprobs = jax.jit(select_tokens, static_argnums=2)(logits, keys, sampler)
  _assert_frequencies(np.asarray(tokens), _reference(LOGITS, temperature, top_k, top_p), n)
  # Log-probs are of the full tempered distribution, before truncation.
  full = np.asarray(jax.nn.log_softmax(jnp.asarray(LOGITS) / temperature))
  np.testing.assert_allclose(np.asarray(logprobs), full[np.asarray(tokens)], atol=1e-5)


def test_greedy_picks_argmax_and_reports_untempered_logprob():
  tokens, logprobs = select_tokens(jnp.asarray(LOGITS)[None], jax.random.split(jax.random.key(0), 1),
                                   SamplerParams(0.0, 1.0, 0))
  assert int(tokens[0]) == 0
  np.testing.assert_allclose(float(logprobs[0]), float(jax.nn.log_softmax(jnp.asarray(LOGITS))[0]), atol=1e-6)


def test_generate_first_token_frequencies_on_tiny_vocab():
  """End to end through prefill: n samples of one prompt share the prefill, each draws its own key."""
  model = init_decoder(ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1), seed=2)
  model.embed_tokens[...] = model.embed_tokens[...] * 40  # peaky logits, so truncation matters
  graphdef, params = nnx.split(model)
  prompt = [1, 5, 2, 7]
  logits = np.asarray(model(jnp.asarray([prompt])))[0, -1]
  n, temperature, top_k = 4000, 0.8, 3
  config = SamplingConfig(temperature=temperature, top_k=top_k, max_new_tokens=1, n_samples=n, eos_ids=(),
                          bucket_lengths=(4,), micro_batch_size=n)
  res = generate(graphdef, params, None, [prompt], config, jax.random.key(11))
  first = np.array([t[0] for t in res.tokens])
  _assert_frequencies(first, _reference(logits, temperature, top_k, 1.0), n)
  full = np.asarray(jax.nn.log_softmax(jnp.asarray(logits) / temperature))
  np.testing.assert_allclose(np.array([lp[0] for lp in res.logprobs]), full[first], atol=1e-5)
