"""Both cosine methods against an independent oracle: one jax.grad per candidate, numpy dot products."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards.cosines import COSINE_STATIC_ARGNAMES, gradient_cosines
from compassplay_jax.rewards.losses import per_sequence_loss
from compassplay_jax.rewards.reference import reference_gradient_jit
from tests import xla_env

TOL = 1e-5
cosines_jit = jax.jit(gradient_cosines, static_argnames=COSINE_STATIC_ARGNAMES)
# SmolLM2's 30 unrolled layers compile faster with XLA:CPU's default emitters than with the tests' classic ones.
cosines_jit_deep = jax.jit(gradient_cosines, static_argnames=COSINE_STATIC_ARGNAMES,
                           compiler_options=xla_env.DEEP_MODEL_COMPILER_OPTIONS)


def tiny_model(model_type="qwen2", tied=False, remat=False, bias=None, seed=0, vocab=97, layers=1):
  """A random tiny decoder with perturbed norm scales and biases (so every formula is exercised)."""
  cfg = ModelConfig(model_type=model_type, vocab_size=vocab, hidden_size=32, intermediate_size=48,
                    num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                    attention_bias=(model_type == "qwen2") if bias is None else bias, remat=remat)
  graphdef, params = nnx.split(init_decoder(cfg, seed))
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  leaves = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return graphdef, jax.tree.unflatten(treedef, leaves)


def batch(n=6, t=16, vocab=97, seed=0):
  """Left-padded (prompt, solution) candidates; the last one has no solution tokens."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (n, t))
  attn = np.ones((n, t), np.int32)
  loss = np.zeros((n, t), np.int32)
  for i in range(n):
    pad = int(rng.integers(0, t // 3))
    prompt = int(rng.integers(2, t // 3))
    attn[i, :pad] = 0
    loss[i, pad + prompt:] = 1
    loss[i, t - int(rng.integers(0, 3)):] = 0  # some candidates stop before the end
  loss[-1] = 0
  return jnp.asarray(tokens), jnp.asarray(loss), jnp.asarray(attn)


def reference(graphdef, params, vocab=97, r=3, t=16, seed=7):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, vocab, (r, t)))
  loss = jnp.asarray(np.arange(t)[None, :] >= 5).astype(jnp.int32).repeat(r, 0)
  return reference_gradient_jit(graphdef, params, tokens, loss, None, micro_batch=2)


def leaves(tree):
  """A gradient pytree as flat float32 numpy vectors, one per leaf (views of the host arrays)."""
  return [np.asarray(x).ravel() for x in jax.tree.leaves(tree)]


def dot64(a, b):
  """<a, b> over all leaves, accumulated in float64: einsum casts in small buffers, so a 135M-parameter
  gradient needs no float64 copy of itself (a concatenated float64 copy cost ~1 s per vector)."""
  return sum(float(np.einsum("i,i->", x, y, dtype=np.float64)) for x, y in zip(a, b))


def _candidate_loss(params, graphdef, tokens, loss_mask, attention_mask):
  return per_sequence_loss(graphdef, params, tokens, loss_mask, attention_mask)[0]


# One candidate's gradient by plain jax.grad; compiled once per model and row shape.
grad_one = jax.jit(jax.grad(_candidate_loss), static_argnums=1)
grad_one_deep = jax.jit(jax.grad(_candidate_loss), static_argnums=1, compiler_options=xla_env.DEEP_MODEL_COMPILER_OPTIONS)


def oracle(graphdef, params, g_ref, tokens, loss_mask, attention_mask, known=None, grad_fn=grad_one):
  """(cos, ip, sq, ref_sq) from per-candidate jax.grad, reduced in float64. known: {row: its grad_one
  gradient} already computed by the caller (not recomputed)."""
  r = leaves(g_ref)
  ref_sq = dot64(r, r)
  ips, sqs = [], []
  for i in range(tokens.shape[0]):
    g = (known or {}).get(i)
    g = leaves(grad_fn(params, graphdef, tokens[i:i + 1], loss_mask[i:i + 1], attention_mask[i:i + 1])
               if g is None else g)
    ips.append(dot64(g, r))
    sqs.append(dot64(g, g))
  ips, sqs = np.array(ips), np.array(sqs)
  denom = np.sqrt(sqs * ref_sq)
  cos = np.where(denom > 0, ips / np.where(denom > 0, denom, 1.0), 0.0)
  return cos, ips, sqs, ref_sq


def assert_matches(res, want, raw_rtol=TOL):
  cos, ips, sqs, ref_sq = want
  np.testing.assert_allclose(res.cosines, cos, atol=TOL, rtol=0)
  np.testing.assert_allclose(res.sq_norms, sqs, rtol=raw_rtol, atol=1e-12)
  # Inner products to 1e-5 of the scale that sets the cosine: ||g_i|| ||g_ref||.
  assert np.all(np.abs(np.asarray(res.inner_products) - ips) <= raw_rtol * np.sqrt(sqs * ref_sq) + 1e-12)
  np.testing.assert_allclose(res.ref_sq_norm, ref_sq, rtol=TOL)


def run(graphdef, params, g_ref, data, method, chunk_size=4, norm_mode="auto", micro_batch=None, jitted=cosines_jit):
  return jitted(graphdef, params, g_ref, *data, method=method, chunk_size=chunk_size, norm_mode=norm_mode,
                micro_batch=micro_batch)


@pytest.mark.parametrize("model_type,tied", [("qwen2", False), ("qwen2", True), ("llama", False), ("llama", True)])
def test_methods_match_oracle(model_type, tied):
  graphdef, params = tiny_model(model_type, tied)
  g_ref = reference(graphdef, params)
  data = batch()
  want = oracle(graphdef, params, g_ref, *data)
  assert np.all(np.abs(want[0][:-1]) > 1e-4)  # non-trivial cosines
  for method in ("direct", "fused"):
    res = run(graphdef, params, g_ref, data, method)
    assert_matches(res, want)
    assert not bool(res.has_loss_tokens[-1]) and bool(np.all(res.has_loss_tokens[:-1]))
  if model_type == "qwen2" and tied:  # every formula at once: biases, tied cross term
    for chunk, norm_mode in [(None, "gram"), (None, "direct"), (5, "gram")]:
      assert_matches(run(graphdef, params, g_ref, data, "fused", chunk, norm_mode), want)
    # Micro-batched passes: 6 candidates as strided micro-batches of 4 (the last padded with rows
    # that have no loss tokens) give the oracle's values in the candidates' own order.
    for method in ("direct", "fused"):
      assert_matches(run(graphdef, params, g_ref, data, method, chunk_size=2, micro_batch=4), want)


def test_methods_match_oracle_with_mlp_bias_and_remat():
  cfg = ModelConfig(model_type="llama", vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, attention_bias=True,
                    mlp_bias=True, remat=True)
  graphdef, params = nnx.split(init_decoder(cfg, 3))
  params = jax.tree.map(lambda x: x + 0.05, params)
  g_ref = reference(graphdef, params, vocab=61)
  data = batch(n=4, vocab=61, seed=2)
  want = oracle(graphdef, params, g_ref, *data)
  for method in ("direct", "fused"):
    assert_matches(run(graphdef, params, g_ref, data, method, chunk_size=2), want)


@pytest.mark.slow
def test_smollm2_matches_oracle(smollm2):
  model, tokenizer = smollm2
  graphdef, params = nnx.split(model)
  texts = ["def add(a, b):\n    return a + b", "print(sorted([3, 1, 2]))", "x = 2 ** 10\nprint(x)",
           "for i in range(3): print(i)"]
  t = 24
  ids = [tokenizer.encode(s)[:t] for s in texts]
  tokens = np.zeros((4, t), np.int32)
  attn = np.zeros((4, t), np.int32)
  for i, row in enumerate(ids):  # left padding
    tokens[i, t - len(row):] = row
    attn[i, t - len(row):] = 1
  loss_mask = attn.copy()
  loss_mask[:, :t - 8] = 0  # the last 8 tokens are the "solution"
  tokens, loss_mask, attn = map(jnp.asarray, (tokens, loss_mask, attn))
  # g_ref: the mean loss gradient of the first two candidates (what reference_gradient computes:
  # tests/test_rewards_reference.py), by the oracle's compiled jax.grad: one 30-layer program fewer. The
  # oracle reuses these two candidates' gradients, and the mean is taken in numpy (eager jnp compiles per leaf).
  g0, g1 = (grad_one_deep(params, graphdef, tokens[i:i + 1], loss_mask[i:i + 1], attn[i:i + 1]) for i in (0, 1))
  g_ref = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / np.float32(2), g0, g1)
  want = oracle(graphdef, params, g_ref, tokens, loss_mask, attn, known={0: g0, 1: g1}, grad_fn=grad_one_deep)
  del g0, g1
  # The fused method (the default) only: the direct method meets the same oracle on the small models
  # above, and its 30-layer per-row program would be the suite's largest compile for no other path.
  # Raw statistics of a trained model carry fp32 noise of ~1e-5 in the oracle itself (1 - p with
  # p ~ 1 on confident tokens), so they get 2e-5; the cosines still meet 1e-5.
  got = run(graphdef, params, g_ref, (tokens, loss_mask, attn), "fused", chunk_size=2, jitted=cosines_jit_deep)
  assert_matches(got, want, raw_rtol=2e-5)
