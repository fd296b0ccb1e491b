"""ModelConfig.attention_impl: the fused-kernel choice, and the kernels' parity with the plain path on CPU.

No GPU or TPU here: the cuDNN path runs its own call (row rotation, per-row lengths, causal flag, GQA)
through jax.nn.dot_product_attention(implementation="xla"), and the splash path runs Pallas' splash
kernel in interpret mode (docs/model.md, "Fused attention").
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models import attention_kernels as ak
from compassplay_jax.models.config import ConfigError, ModelConfig
from compassplay_jax.models.decoder import attend, init_decoder

CFG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, attention_bias=True)


def _mask(b, t):
  mask = np.ones((b, t), np.int32)
  mask[1, :5] = 0  # left padding
  if b > 2:
    mask[2, :3], mask[2, t - 4:] = 0, 0  # left and right padding (prompt | completion | pad)
  if b > 3:
    mask[3] = 0  # an all-padding row (micro-batch filler)
  return mask


def _qkv(b, t, kv, groups, hd, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, kv, groups, hd)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(b, t, kv, hd)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, kv, hd)), jnp.float32)
  return q, k, v


def _reference(q, k, v, mask):
  t = q.shape[1]
  allowed = jnp.tril(jnp.ones((t, t), bool))[None] & (jnp.asarray(mask)[:, None, :] > 0)
  return attend(q, k, v, allowed)


def _check_parity(fn, q, k, v, mask, tol):
  """Outputs at real queries, and gradients of a loss over real queries, equal the plain path's."""
  real = jnp.asarray(mask > 0)[:, :, None, None, None]
  w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)

  @jax.jit
  def out_and_grads(q_, k_, v_):
    results = []
    for f in (fn, _reference):
      loss = lambda *a, f=f: jnp.sum(jnp.where(real, f(*a, mask) * w, 0.0))
      results.append((f(q_, k_, v_, mask), jax.grad(loss, argnums=(0, 1, 2))(q_, k_, v_)))
    return results
  (out, g), (ref, g_ref) = out_and_grads(q, k, v)
  np.testing.assert_allclose(np.asarray(out)[mask > 0], np.asarray(ref)[mask > 0], rtol=tol, atol=tol)
  assert np.all(np.asarray(out)[mask == 0] == 0)  # padding queries: 0 (the plain path: unused averages)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_choose_attention_impl():
  c = ak.choose_attention_impl
  full = dict(head_dim=128, q_len=4096, kv_len=4096, cached=False)
  assert c("auto", backend="cpu", dtype=jnp.bfloat16, **full) == "xla"
  assert c("auto", backend="tpu", dtype=jnp.bfloat16, **full) == "splash"
  assert c("auto", backend="tpu", dtype=jnp.float32, **full) == "splash"
  assert c("auto", backend="gpu", dtype=jnp.bfloat16, **full) == "cudnn"
  assert c("auto", backend="gpu", dtype="float16", **full) == "cudnn"
  assert c("auto", backend="gpu", dtype=jnp.float32, **full) == "xla"  # cuDNN flash: bf16/fp16 only
  assert c("auto", backend="gpu", dtype=jnp.bfloat16, **{**full, "head_dim": 100}) == "xla"  # not a multiple of 8
  assert c("auto", backend="gpu", dtype=jnp.bfloat16, **{**full, "head_dim": 256}) == "xla"  # > 128
  for backend in ("tpu", "gpu"):  # sampler passes keep today's path
    assert c("auto", backend=backend, dtype=jnp.bfloat16, **{**full, "cached": True}) == "xla"
    assert c("auto", backend=backend, dtype=jnp.bfloat16, **{**full, "kv_len": 8192}) == "xla"
    assert c("xla", backend=backend, dtype=jnp.bfloat16, **full) == "xla"
  assert c("splash", backend="cpu", dtype=jnp.float32, **full) == "splash"  # explicit: as asked
  assert c("cudnn", backend="cpu", dtype=jnp.float32, **{**full, "cached": True}) == "xla"
  with pytest.raises(ValueError):
    c("flash", backend="gpu", dtype=jnp.bfloat16, **full)
  with pytest.raises(ConfigError, match="attention_impl"):
    ModelConfig(attention_impl="flash")


def test_right_aligned_rotation():
  mask = jnp.asarray(_mask(4, 10))
  leading, lengths, gather, scatter = ak.right_aligned(mask)
  np.testing.assert_array_equal(leading, [0, 5, 3, 10])
  np.testing.assert_array_equal(lengths, [10, 5, 3, 1])
  rotated = np.take_along_axis(np.asarray(mask), np.asarray(gather), axis=1)
  for row, n in zip(rotated, [10, 5, 3, 0]):  # real tokens first, contiguous
    assert row[:n].all() and not row[n:].any()
  x = np.arange(40).reshape(4, 10)
  np.testing.assert_array_equal(np.take_along_axis(np.take_along_axis(x, np.asarray(gather), 1),
                                                   np.asarray(scatter), 1), x)


def test_cudnn_path_matches_plain_attention():
  """The cuDNN path's call through JAX's reference implementation: left/right/all padding, GQA, fp32."""
  q, k, v = _qkv(4, 19, kv=2, groups=3, hd=8)
  _check_parity(lambda *a: ak.cudnn_attention(*a, implementation="xla"), q, k, v, _mask(4, 19), 1e-5)


def test_splash_segment_ids_mask_equals_reference_mask():
  """Causal & same segment == the decoder's allowed mask at every real query (padding slots included)."""
  t, tp = 37, ak.splash_block(37)
  assert tp == 128 and ak.splash_block(1000) == 512
  mask = _mask(4, t)
  seg = np.asarray(ak.splash_segment_ids(jnp.asarray(mask), tp))
  assert seg.shape == (4, tp) and not seg[:, t:].any()
  splash = np.tril(np.ones((tp, tp), bool))[None] & (seg[:, :, None] == seg[:, None, :])
  ref = np.tril(np.ones((t, t), bool))[None] & (mask[:, None, :] > 0)
  real = mask > 0
  np.testing.assert_array_equal(splash[:, :t, :t][real], ref[real])
  assert not splash[:, :t, t:][real].any()  # the slots added for the block size are never attended
  assert splash[np.arange(4)[:, None], np.arange(tp), np.arange(tp)].all()  # every row has a key: finite


def test_splash_interpret_matches_plain_attention():
  """The splash kernel itself (Pallas interpret mode on CPU), forward and backward: GQA (2 kv heads x 2),
  left padding and an all-padding row, T = 100 padded to one 128 block."""
  q, k, v = _qkv(2, 100, kv=2, groups=2, hd=8, seed=1)
  mask = _mask(2, 100)
  mask[0] = 0
  _check_parity(lambda *a: ak.splash_attention(*a, interpret=True), q, k, v, mask, 1e-4)


def test_decoder_with_cudnn_path_matches_plain(monkeypatch):
  """The decoder with attention_impl="cudnn" (through the XLA reference on CPU) against "xla": logits at
  real slots and the gradients of a masked loss through remat'ed scanned blocks."""
  monkeypatch.setattr(ak, "CUDNN_IMPLEMENTATION", "xla")
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (4, 23)), jnp.int32)
  mask = jnp.asarray(_mask(4, 23))
  real = np.asarray(mask) > 0
  results = []
  for impl in ("xla", "cudnn"):
    graphdef, params = nnx.split(init_decoder(CFG.replace(attention_impl=impl, remat=True, scan_layers=True), seed=1))

    def loss(p, graphdef=graphdef):
      logits = nnx.merge(graphdef, p)(tokens, attention_mask=mask)
      lp = jax.nn.log_softmax(logits[:, :-1])
      nll = -jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[..., 0]
      return jnp.sum(nll * mask[:, :-1] * mask[:, 1:]), logits  # padding slots' logits differ: unused
    results.append(jax.jit(jax.value_and_grad(loss, has_aux=True))(params))
  ((l0, logits0), g0), ((l1, logits1), g1) = results
  np.testing.assert_allclose(np.asarray(logits1)[real], np.asarray(logits0)[real], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
