"""ModelConfig.attention_query_chunk: query-blocked attention equals plain attention, and bounds memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ConfigError, ModelConfig
from compassplay_jax.models.decoder import init_decoder

CFG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, attention_bias=True)


def _batch(t=37, b=3, seed=0):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (b, t)), jnp.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :5] = 0  # left padding
  if b > 2:
    mask[2, :t - 3] = 0  # mostly padding
  return tokens, jnp.asarray(mask)


def _loss_and_logits(cfg, params, graphdef, tokens, mask):
  def loss(p):
    logits = nnx.merge(graphdef, p)(tokens, attention_mask=mask)
    lp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(nll * mask[:, 1:]), logits
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.mark.parametrize("remat", [False, True])
def test_chunked_matches_plain_logits_and_gradients(remat):
  tokens, mask = _batch()
  graphdef, params = nnx.split(init_decoder(CFG.replace(remat=remat), seed=1))
  (l0, logits0), g0 = _loss_and_logits(CFG, params, graphdef, tokens, mask)
  for chunk in (8, 16):  # 37 = 4 x 8 + 5, 2 x 16 + 5: the last block is padded
    gd = nnx.split(init_decoder(CFG.replace(remat=remat, attention_query_chunk=chunk), seed=1))[0]
    (l1, logits1), g1 = _loss_and_logits(CFG, params, gd, tokens, mask)
    real = np.asarray(mask) > 0
    np.testing.assert_allclose(np.asarray(logits1)[real], np.asarray(logits0)[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_chunked_prefill_and_decode_match_plain():
  """With a KV cache: a chunked prefill (T_q > chunk) then a one-token decode step (plain path)."""
  tokens, mask = _batch(t=21, b=2)
  outs = []
  for chunk in (0, 8):
    model = init_decoder(CFG.replace(attention_query_chunk=chunk), seed=2)
    s = tokens.shape[1] + 4
    full_mask = jnp.zeros((2, s), jnp.int32).at[:, :21].set(mask)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
    logits, cache = model(tokens, full_mask, positions, cache=model.init_cache(2, s), cache_index=0)
    step_mask = full_mask.at[:, 21].set(1)
    nxt, _ = model(tokens[:, -1:], step_mask, positions[:, -1:] + 1, cache=cache, cache_index=21)
    outs.append((np.asarray(logits), np.asarray(nxt)))
  real = np.asarray(mask) > 0
  np.testing.assert_allclose(outs[1][0][real], outs[0][0][real], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-5)


def test_negative_chunk_is_a_config_error():
  with pytest.raises(ConfigError, match="attention_query_chunk"):
    CFG.replace(attention_query_chunk=-1)


def _fwd_bwd_temp(chunk: int, t: int = 1024) -> int:
  cfg = CFG.replace(num_hidden_layers=2, remat=True, attention_query_chunk=chunk)
  graphdef, params = nnx.split(init_decoder(cfg, seed=0))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  tokens = jax.ShapeDtypeStruct((2, t), jnp.int32)

  def loss(p, tok):
    logits = nnx.merge(graphdef, p)(tok)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1))
  compiled = jax.jit(jax.grad(loss)).lower(params, tokens).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def test_chunked_attention_bounds_compiled_temp_memory():
  plain, chunked = _fwd_bwd_temp(0), _fwd_bwd_temp(128)
  # Plain: each layer's fp32 scores are B x heads x T^2 x 4 B = 32 MiB (plus probs); chunked: 1/8 of one.
  assert chunked * 3 < plain, (plain, chunked)


def test_run_config_sets_the_chunk_and_scan_layers():
  from compassplay_jax.runtime import config_base, model_setup
  config = config_base.base_config("coding", "tiny")
  assert config.model.attention_query_chunk == ModelConfig().attention_query_chunk == 0
  assert config.model.scan_layers is ModelConfig().scan_layers is False
  config.model.path = "tiny"
  config.model.attention_query_chunk = 16
  config.model.scan_layers = True  # tests/test_scan_layers.py checks what it does
  model, _ = model_setup.build_model(config)
  assert model.config.attention_query_chunk == 16 and model.config.scan_layers
