"""Generation on tiny random models: cache consistency, parity with transformers, ragged batches,
reproducibility, log-probs, and bounded compilations."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import default_positions, init_decoder
from compassplay_jax.models.loading import load_hf_model
from compassplay_jax.sampling import SamplingConfig, generate
from compassplay_jax.sampling import decode as decode_lib
from tests.hf_fixtures import left_pad, left_padded_batch, save_tiny_hf_model

torch = pytest.importorskip("torch")

PROMPTS = [[5, 17, 3, 9, 22, 40, 8, 1, 2], [11, 4, 61], [7, 7, 30, 12, 50, 19, 2, 3, 66, 70, 13, 14]]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
  directory, hf_model = save_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param)
  return load_hf_model(directory), hf_model


@jax.jit(static_argnums=0)
def _forward(graphdef, params, ids, mask):
  return nnx.merge(graphdef, params)(ids, attention_mask=mask)


@jax.jit(static_argnums=0)
def _cached_forward(graphdef, params, ids, mask, positions, cache, index):
  return nnx.merge(graphdef, params)(ids, mask, positions, cache=cache, cache_index=index)


def test_cached_decoding_matches_full_forward(tiny):
  model, _ = tiny
  graphdef, params = nnx.split(model)
  ids, mask = left_padded_batch(model.config.vocab_size, lengths=(9, 5, 12))
  b, t = ids.shape
  extra = np.random.default_rng(1).integers(1, model.config.vocab_size, (b, 6)).astype(np.int32)
  full_ids = np.concatenate([ids, extra], 1)
  full_mask = np.concatenate([mask, np.ones_like(extra)], 1)
  full = np.asarray(_forward(graphdef, params, full_ids, full_mask))
  s = full_ids.shape[1]
  cache_mask = np.zeros((b, s), np.int32)
  cache_mask[:, :t] = mask
  pos = np.asarray(default_positions(jnp.asarray(full_mask)))
  logits, cache = _cached_forward(graphdef, params, ids, cache_mask, pos[:, :t], model.init_cache(b, s), 0)
  got = [np.asarray(logits)]
  for i in range(extra.shape[1]):
    cache_mask[:, t + i] = 1
    logits, cache = _cached_forward(graphdef, params, extra[:, i:i + 1], cache_mask, pos[:, t + i:t + i + 1],
                                    cache, t + i)
    got.append(np.asarray(logits))
  got = np.concatenate(got, 1)
  real = full_mask.astype(bool)
  assert np.max(np.abs(got[real] - full[real])) <= 1e-4


def _hf_greedy(hf_model, prompt, steps):
  hf_model.generation_config.eos_token_id = None
  out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=steps, min_new_tokens=steps, pad_token_id=0)
  return out[0, len(prompt):].numpy()


def test_greedy_matches_transformers_and_ragged_rows_match_alone(tiny):
  model, hf_model = tiny
  graphdef, params = nnx.split(model)
  config = SamplingConfig(temperature=0.0, max_new_tokens=32, eos_ids=(), bucket_lengths=(16,))
  batch = generate(graphdef, params, None, PROMPTS, config, 0)
  for i, prompt in enumerate(PROMPTS):
    np.testing.assert_array_equal(batch.tokens[i], _hf_greedy(hf_model, prompt, 32))
    alone = generate(graphdef, params, None, [prompt], config, 0)
    np.testing.assert_array_equal(batch.tokens[i], alone.tokens[0])
  assert batch.finish_reasons == ["length"] * 3 and list(batch.lengths) == [32] * 3


def test_logprobs_match_full_forward(tiny):
  model, _ = tiny
  graphdef, params = nnx.split(model)
  temp = 0.8
  config = SamplingConfig(temperature=temp, top_k=5, top_p=0.9, max_new_tokens=10, n_samples=2, eos_ids=(3,),
                          bucket_lengths=(16,))
  res = generate(graphdef, params, None, PROMPTS, config, jax.random.key(3))
  ids, mask = left_pad([np.concatenate([res.prompt_tokens[r], res.tokens[r]]) for r in range(len(res))])
  width = ids.shape[1]
  lp = np.asarray(jax.nn.log_softmax(_forward(graphdef, params, ids, mask) / temp, -1))
  for r, comp in enumerate(res.tokens):
    at = width - len(comp) - 1 + np.arange(len(comp))  # logits at t predict token t + 1
    np.testing.assert_allclose(res.logprobs[r], lp[r, at, comp], atol=1e-4)
    assert res.finish_reasons[r] == ("eos" if comp[-1] == 3 else "length")
    assert 3 not in comp[:-1]


def test_sampling_is_reproducible_and_key_dependent(tiny):
  model, _ = tiny
  graphdef, params = nnx.split(model)
  config = SamplingConfig(temperature=1.0, max_new_tokens=12, n_samples=3, eos_ids=(), bucket_lengths=(16,))
  a = generate(graphdef, params, None, PROMPTS, config, jax.random.key(7))
  b = generate(graphdef, params, None, PROMPTS, config, jax.random.key(7))
  c = generate(graphdef, params, None, PROMPTS, config, jax.random.key(8))
  assert all(np.array_equal(x, y) for x, y in zip(a.tokens, b.tokens))
  assert not all(np.array_equal(x, y) for x, y in zip(a.tokens, c.tokens))
  # Samples of one prompt differ from each other (independent keys after a shared prefill).
  assert not np.array_equal(a.tokens[0], a.tokens[1])
  # Micro-batching does not change a row's draws: keys depend on (key, prompt, sample) only.
  small = generate(graphdef, params, None, PROMPTS, config.replace(micro_batch_size=3), jax.random.key(7))
  assert all(np.array_equal(x, y) for x, y in zip(a.tokens, small.tokens))


def test_compilations_bounded_by_buckets():
  # A model no other test uses, so the jit caches start empty for it.
  model = init_decoder(ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48), seed=5)
  graphdef, params = nnx.split(model)
  buckets = (8, 16, 32, 64)
  config = SamplingConfig(temperature=1.0, max_new_tokens=4, eos_ids=(), bucket_lengths=buckets,
                          stop_check_every=2)
  before = decode_lib.compile_counts()
  rng = np.random.default_rng(0)
  for i in range(20):
    prompts = [list(rng.integers(1, 89, int(n))) for n in rng.integers(1, 65, 2)]
    generate(graphdef, params, None, prompts, config, i)
  after = decode_lib.compile_counts()
  assert after["prefill"] - before["prefill"] <= len(buckets)
  assert after["decode"] - before["decode"] <= len(buckets)


def test_micro_batches_under_memory_budget_cover_every_row():
  model = init_decoder(ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48), seed=5)
  graphdef, params = nnx.split(model)
  from compassplay_jax.sampling import batching
  config = SamplingConfig(temperature=0.0, max_new_tokens=4, eos_ids=(), bucket_lengths=(8, 16), n_samples=2)
  row_bytes = batching.bytes_per_row(model.config, 16, 4)
  tight = config.replace(memory_budget_bytes=4 * row_bytes)
  prompts = [[1 + i] * (3 + 2 * i) for i in range(7)]
  plans = batching.plan(prompts, model.config, tight, 0)
  for mb in plans:
    fits = tight.memory_budget_bytes // batching.bytes_per_row(model.config, mb.input_ids.shape[1], 4)
    assert len(mb.live) * 2 <= fits
  assert sorted(int(i) for mb in plans for i in mb.prompt_index[mb.live]) == list(range(7))
  loose = generate(graphdef, params, None, prompts, config, 0)
  split = generate(graphdef, params, None, prompts, tight, 0)
  assert all(np.array_equal(x, y) for x, y in zip(loose.tokens, split.tokens))


def test_prompt_longer_than_largest_bucket_is_one_clear_error():
  model = init_decoder(ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48), seed=5)
  graphdef, params = nnx.split(model)
  config = SamplingConfig(max_new_tokens=2, eos_ids=(), bucket_lengths=(8,))
  with pytest.raises(ValueError, match="longer than the largest bucket 8"):
    generate(graphdef, params, None, [[1] * 9], config, 0)
