"""ModelConfig.scan_layers: the blocks as one lax.scan give the per-layer loop's numbers, and bound memory.

The oracle is the per-layer loop (itself checked against transformers' torch models in test_parity*).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards.cosines import COSINE_STATIC_ARGNAMES, gradient_cosines
from compassplay_jax.rewards.reference import reference_gradient_jit
from compassplay_jax.rl import train_step

CFG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
TOL = dict(rtol=1e-5, atol=1e-5)


def _batch(b=3, t=21, seed=0):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (b, t)), jnp.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :6] = 0  # left padding
  loss_mask = np.zeros((b, t), np.int32)
  loss_mask[:, 12:] = 1
  return tokens, jnp.asarray(mask), jnp.asarray(loss_mask)


def _model(cfg, seed=1):
  """graphdef and params, with the params perturbed so norm scales and biases are not at their init."""
  graphdef, params = nnx.split(init_decoder(cfg, seed=seed))
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return graphdef, jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                                for x, k in zip(leaves, keys)])


def _graphdef(cfg):
  return nnx.split(init_decoder(cfg, seed=0))[0]


def _assert_trees_close(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **TOL)


@pytest.mark.parametrize("tied,remat,chunk", [(False, False, 0), (True, True, 8)])
def test_scanned_logits_and_gradients_equal_the_layer_loop(tied, remat, chunk):
  cfg = CFG.replace(tie_word_embeddings=tied, remat=remat, attention_query_chunk=chunk)
  loop_gd, params = _model(cfg)
  scan_gd = _graphdef(cfg.replace(scan_layers=True))
  tokens, mask, loss_mask = _batch()

  def loss(graphdef, p):
    logits = nnx.merge(graphdef, p)(tokens, attention_mask=mask)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(nll * loss_mask[:, 1:]), logits

  (l0, logits0), g0 = jax.jit(jax.value_and_grad(lambda p: loss(loop_gd, p), has_aux=True))(params)
  (l1, logits1), g1 = jax.jit(jax.value_and_grad(lambda p: loss(scan_gd, p), has_aux=True))(params)
  real = np.asarray(mask) > 0
  np.testing.assert_allclose(np.asarray(logits1)[real], np.asarray(logits0)[real], **TOL)
  np.testing.assert_allclose(float(l1), float(l0), **TOL)
  _assert_trees_close(g1, g0)


def test_scan_keeps_the_cache_path_and_its_results():
  """Prefill with a KV cache runs the per-layer loop (the cache is per layer) whatever scan_layers says."""
  tokens, mask, _ = _batch(b=2, t=11)
  loop_gd, params = _model(CFG)
  outs = []
  for gd in (loop_gd, _graphdef(CFG.replace(scan_layers=True))):
    model = nnx.merge(gd, params)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
    logits, cache = model(tokens, mask, positions, cache=model.init_cache(2, 11), cache_index=0)
    outs.append((np.asarray(logits), len(cache)))
  np.testing.assert_allclose(outs[1][0], outs[0][0], **TOL)
  assert outs[0][1] == outs[1][1] == CFG.num_hidden_layers


def test_train_step_with_scanned_layers_makes_the_same_update():
  tokens, mask, loss_mask = _batch(b=4, seed=3)
  rng = np.random.default_rng(4)
  batch = {"tokens": tokens, "attention_mask": mask, "loss_mask": loss_mask,
           "advantages": jnp.asarray([1.0, -0.5, 0.25, -1.0], jnp.float32),
           "old_logprobs": jnp.asarray(-np.log(CFG.vocab_size) + rng.uniform(-0.3, 0.3, tokens.shape), jnp.float32)}
  cfg = CFG.replace(remat=True)
  loop_gd, params = _model(cfg)
  tcfg = train_step.TrainConfig(learning_rate=1e-3, micro_batch_size=2, entropy_coef=0.01)
  results = []
  for gd in (loop_gd, _graphdef(cfg.replace(scan_layers=True))):
    p, opt = train_step.init_train_state(jax.tree.map(jnp.copy, params), tcfg)
    results.append(train_step.make_train_step(gd, tcfg)(p, opt, batch, jax.random.key(0)))
  (p0, o0, m0), (p1, o1, m1) = results
  _assert_trees_close(p1, p0)
  _assert_trees_close(o1, o0)
  for name in ("loss", "pg_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose(float(m1[name]), float(m0[name]), **TOL)
  assert float(m0["grad_norm"]) > 0


def test_reference_gradient_and_cosines_with_scanned_layers():
  """g_ref and the direct method run the scan (plain ops); the fused method keeps the loop (its ops
  address layers by name). All equal the loop's values."""
  loop_gd, params = _model(CFG)
  scan_gd = _graphdef(CFG.replace(scan_layers=True))
  ref_tokens, ref_mask, ref_loss = _batch(seed=5)
  tokens, mask, loss_mask = _batch(b=4, seed=6)
  g_ref = reference_gradient_jit(loop_gd, params, ref_tokens, ref_loss, ref_mask, micro_batch=2)
  _assert_trees_close(reference_gradient_jit(scan_gd, params, ref_tokens, ref_loss, ref_mask, micro_batch=2), g_ref)
  cosines = jax.jit(gradient_cosines, static_argnames=COSINE_STATIC_ARGNAMES)
  for method in ("direct", "fused"):
    want = cosines(loop_gd, params, g_ref, tokens, loss_mask, mask, method=method).cosines
    got = cosines(scan_gd, params, g_ref, tokens, loss_mask, mask, method=method).cosines
    assert np.all(np.abs(np.asarray(want)) > 1e-4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)


def _fwd_bwd_temp(scan: bool, layers: int = 6, t: int = 512) -> int:
  """XLA's compiled temp bytes of one remat fwd+bwd (a stable figure, not a timing)."""
  cfg = CFG.replace(num_hidden_layers=layers, hidden_size=64, intermediate_size=256, remat=True, scan_layers=scan)
  graphdef, params = nnx.split(init_decoder(cfg, seed=0))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)

  def loss(p, tok):
    return jnp.mean(jax.nn.logsumexp(nnx.merge(graphdef, p)(tok), axis=-1))
  compiled = jax.jit(jax.grad(loss)).lower(params, jax.ShapeDtypeStruct((2, t), jnp.int32)).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def test_scan_bounds_compiled_temp_memory():
  """Unrolled, XLA:CPU schedules every layer's recomputation early, so remat saves nothing and temps
  grow with depth (measured on the 7B train step: 96 GiB unrolled, 46 GiB scanned, docs/sharding.md).
  Scanned, the backward recomputes one layer per iteration."""
  loop, scanned = _fwd_bwd_temp(False), _fwd_bwd_temp(True)
  assert scanned * 2 < loop, (loop, scanned)
