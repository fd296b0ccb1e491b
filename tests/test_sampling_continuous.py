"""Continuous batching on tiny random models: greedy parity with transformers and the static sampler
for more requests than slots with mixed lengths and stop conditions, log-probs against a full
forward, order-independent sampling, bounded compilations, memory-budget slots, errors."""
import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.models.loading import load_hf_model
from compassplay_jax.sampling import SamplingConfig, batching, generate
from compassplay_jax.sampling import slots as slots_lib
from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import Request
from tests.hf_fixtures import left_pad, save_tiny_hf_model

torch = pytest.importorskip("torch")

# 7 requests for 3 slots: prompt lengths 2..20 (2 buckets: rows of both decode side by side; each
# bucket x prefill size is another program of every engine here), budgets 1..40. With 128 cache columns
# decode attends to the first 64 until request 2 (bucket 32, budget 40) grows past them.
PROMPT_LENGTHS = (9, 3, 20, 5, 14, 2, 11)
BUDGETS = (24, 6, 40, 1, 12, 20, 9)
BUCKETS = (16, 32)


def _prompts(vocab, seed=0):
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(1, vocab, n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
  directory, hf_model = save_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param)
  return load_hf_model(directory), hf_model


def _hf_greedy(hf_model, prompt, budget, eos):
  hf_model.generation_config.eos_token_id = None
  out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=budget, eos_token_id=eos, pad_token_id=0)
  return out[0, len(prompt):].numpy()


def _static_rows(graphdef, params, prompts, budgets, config, key):
  """The static sampler's rows for per-request budgets: one `generate` call with the largest budget,
  each row cut to its request's budget (a row's draws depend on (key, request, sample, token index)
  only, so this is what the static engine's per-budget calls give; test_rollout_engine checks that
  equality). One call compiles one prefill and one decode, not one pair per distinct budget."""
  res = generate(graphdef, params, None, prompts, config.replace(max_new_tokens=max(budgets)), key)
  return [t[:budgets[r // config.n_samples]] for r, t in enumerate(res.tokens)]


def _common_eos(hf_model, prompts):
  """A token some greedy completions produce mid-way: as eos it ends those rows early, not all, and
  not the longest one (request 2, which must outgrow the first attention window)."""
  seen, completions = {}, [_hf_greedy(hf_model, p, b, None) for p, b in zip(prompts, BUDGETS)]
  for toks in completions:
    for t in set(toks[1:-1].tolist()) - set(completions[2].tolist()):
      seen[t] = seen.get(t, 0) + 1
  return max(sorted(seen), key=lambda t: (0 < seen[t] < len(prompts) - 1, seen[t]))


def test_greedy_equals_transformers_and_static_with_more_requests_than_slots(tiny):
  model, hf_model = tiny
  graphdef, params = nnx.split(model)
  prompts = _prompts(model.config.vocab_size)
  eos = _common_eos(hf_model, prompts)
  config = SamplingConfig(temperature=0.0, max_new_tokens=40, eos_ids=(eos,), bucket_lengths=BUCKETS)
  requests = [Request(p, max_new_tokens=b) for p, b in zip(prompts, BUDGETS)]
  engine = ContinuousEngine(graphdef, None, params, slots=3, chunk_tokens=4, cache_length=128)
  got = engine.generate(requests, config, 0)
  static = _static_rows(graphdef, params, prompts, BUDGETS, config, 0)
  reasons = set()
  for i, (prompt, budget) in enumerate(zip(prompts, BUDGETS)):
    want = _hf_greedy(hf_model, prompt, budget, eos)
    np.testing.assert_array_equal(got.tokens[i], want)
    np.testing.assert_array_equal(got.tokens[i], static[i])
    assert got.finish_reasons[i] == ("eos" if static[i][-1] == eos else "length") == \
        ("eos" if want[-1] == eos else "length")
    assert got.lengths[i] == len(want) and len(got.logprobs[i]) == len(want)
    reasons.add(got.finish_reasons[i])
  assert reasons == {"eos", "length"}  # both stop conditions occur
  assert engine.stats.slots == 3 and engine.stats.inserts == len(prompts)
  assert set(engine.stats.windows) == {64, 128}  # attention windows switched mid-call


@jax.jit(static_argnums=(0, 4))
def _full_forward_logprobs(graphdef, params, ids, mask, temperature):
  logits = nnx.merge(graphdef, params)(ids, attention_mask=mask)
  return jax.nn.log_softmax(logits / temperature, -1)


# Sampled runs: top-k and top-p cut the candidates, the log-probs stay the full tempered distribution's.
SAMPLED = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=40, n_samples=3, eos_ids=(3,),
                         bucket_lengths=BUCKETS)


@pytest.fixture(scope="module")
def sampled(tiny):
  """One sampled call through 3 slots (longest budgets admitted first), shared by the log-prob and
  the reproducibility tests: (graphdef, params, requests, engine, result)."""
  model, _ = tiny
  graphdef, params = nnx.split(model)
  requests = [Request(p, max_new_tokens=b) for p, b in zip(_prompts(model.config.vocab_size), BUDGETS)]
  engine = ContinuousEngine(graphdef, None, params, slots=3, chunk_tokens=4, cache_length=128,
                            order="longest_first")
  return graphdef, params, requests, engine, engine.generate(requests, SAMPLED, jax.random.key(7))


def test_logprobs_match_full_forward(sampled):
  graphdef, params, _, _, res = sampled
  ids, mask = left_pad([np.concatenate([res.prompt_tokens[r], res.tokens[r]]) for r in range(len(res))])
  width = ids.shape[1]
  lp = np.asarray(_full_forward_logprobs(graphdef, params, ids, mask, SAMPLED.temperature))
  for r, comp in enumerate(res.tokens):
    at = width - len(comp) - 1 + np.arange(len(comp))  # logits at t predict token t + 1
    np.testing.assert_allclose(res.logprobs[r], lp[r, at, comp], atol=1e-4)
    budget = BUDGETS[res.prompt_index[r]]
    assert 3 not in comp[:-1] and len(comp) <= budget
    assert res.finish_reasons[r] == ("eos" if comp[-1] == 3 else "length")
    if res.finish_reasons[r] == "length":
      assert len(comp) == budget


def test_sampling_reproducible_whatever_order_slots_free_up(sampled):
  graphdef, params, requests, engine, base = sampled
  run = lambda key, **kw: ContinuousEngine(graphdef, None, params, **kw).generate(requests, SAMPLED, key)
  # Other admission orders, chunk sizes and refill points put rows in other slots at other times.
  for kw in (dict(slots=3, chunk_tokens=2, order="arrival"), dict(slots=3, chunk_tokens=5, refill_threshold=2),
             dict(slots=4, chunk_tokens=3, order="arrival")):
    other = run(jax.random.key(7), **kw)
    for r in range(len(base)):
      np.testing.assert_array_equal(base.tokens[r], other.tokens[r], err_msg=f"row {r} with {kw}")
      np.testing.assert_allclose(base.logprobs[r], other.logprobs[r], atol=1e-5)
  # The same keys as the static sampler: (request, sample, token index).
  static = _static_rows(graphdef, params, [r.prompt for r in requests], BUDGETS, SAMPLED, jax.random.key(7))
  assert all(np.array_equal(a, b) for a, b in zip(base.tokens, static))
  different = engine.generate(requests, SAMPLED, jax.random.key(8))  # the same engine: its programs are built
  assert not all(np.array_equal(a, b) for a, b in zip(base.tokens, different.tokens))
  assert not np.array_equal(base.tokens[0], base.tokens[1])  # samples of one prompt differ


def test_200_requests_compile_a_bounded_number_of_programs():
  # A model no other test uses, so the counts below are this test's own compilations.
  model = init_decoder(ModelConfig(vocab_size=83, hidden_size=32, intermediate_size=40), seed=11)
  graphdef, params = nnx.split(model)
  buckets = (8, 16, 32, 64)
  config = SamplingConfig(temperature=1.0, max_new_tokens=48, eos_ids=(5,), bucket_lengths=buckets)
  rng = np.random.default_rng(0)
  requests = [Request([int(t) for t in rng.integers(1, 83, int(n))], max_new_tokens=int(b))
              for n, b in zip(rng.integers(1, 65, 200), rng.integers(1, 49, 200))]
  engine = ContinuousEngine(graphdef, None, params, slots=8, cache_length=128, chunk_tokens=8)
  key0, key1 = jax.random.key(0), jax.random.key(1)
  lowered = []  # every program JAX lowers, ours or not (counted even on persistent-cache hits)
  listener = lambda name, secs, **kw: lowered.append(name) if name.endswith("jaxpr_to_mlir_module_duration") \
      else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    res = engine.generate(requests, config, key0)
    first = len(lowered)
    counts = engine.programs.compile_counts()
    engine.generate(requests[:50], config, key1)  # other sizes: nothing new to compile
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  # Documented bound: prefill and insert once per (prompt bucket, prefill size), init once, decode
  # once per (window, slot count), compact once per (slot count, smaller slot count). Prefill sizes:
  # powers of two up to the prompts one admission can bring; slot counts: 8 and the halvings 4, 2, 1.
  windows = slots_lib.windows(128)
  assert windows == (128, 64)
  sizes = len({engine._prefill_size(c, 8) for c in range(1, 9)})
  assert sizes == 4  # 1, 2, 4, 8
  assert counts["prefill_prompts"] <= len(buckets) * sizes and counts["insert"] <= len(buckets) * sizes
  assert counts["init_slots"] == 1 and counts["decode_chunk"] <= len(windows) * 4 and counts["compact"] <= 6
  assert counts["cast_params"] == 0 and counts["compact"] >= 1  # the drain shrank the slots
  assert first == sum(counts.values()) <= 2 * len(buckets) * sizes + 1 + len(windows) * 4 + 6
  assert len(lowered) == first and engine.programs.compile_counts() == counts
  assert engine.stats.prefills < engine.stats.prompts  # several prompts per prefill call
  assert len(res) == 200 and all(1 <= n <= r.max_new_tokens for n, r in zip(res.lengths, requests))


@pytest.mark.parametrize("kv_layout", ["dense", "paged"])
def test_precompile_leaves_nothing_to_compile(kv_layout):
  model = init_decoder(ModelConfig(vocab_size=79, hidden_size=32, intermediate_size=40), seed=12)
  graphdef, params = nnx.split(model)
  config = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=40, eos_ids=(5,), bucket_lengths=(8, 16, 32))
  rng = np.random.default_rng(1)
  requests = [Request([int(t) for t in rng.integers(1, 79, int(n))], max_new_tokens=int(b))
              for n, b in zip(rng.integers(1, 33, 30), rng.integers(1, 41, 30))]
  # paged: a pool of 40 pages of 4 (rows need up to 18: preemptions).
  engine = ContinuousEngine(graphdef, None, params, slots=4, cache_length=128, chunk_tokens=4, shrink_floor=1,
                            kv_layout=kv_layout, page_size=4, num_pages=40)
  key = jax.random.key(0)
  engine.precompile(config, (8, 16, 32), key)
  lowered = []
  listener = lambda name, secs, **kw: lowered.append(name) if name.endswith("jaxpr_to_mlir_module_duration") \
      else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    res = engine.generate(requests, config, key)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert lowered == [] and len(res) == 30
  assert len(engine.stats.slot_sizes) > 1  # the drain shrank the slots: those programs were ready too
  if kv_layout == "dense":
    assert len(engine.stats.windows) == 2  # 64 and 128 both used
  else:
    assert engine.stats.preempted > 0
    want = ContinuousEngine(graphdef, None, params, slots=4, chunk_tokens=4, kv_layout="dense").generate(
        requests, config, key)
    assert all(np.array_equal(a, b) for a, b in zip(res.tokens, want.tokens))


def test_slots_follow_the_memory_budget_and_cache_follows_model_dtype():
  cfg = ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48)
  graphdef, params = nnx.split(init_decoder(cfg, seed=5))
  config = SamplingConfig(temperature=0.0, max_new_tokens=16, eos_ids=(), bucket_lengths=(16,))
  requests = [Request([1 + i] * (3 + i), max_new_tokens=4 + 2 * i) for i in range(6)]
  # Room for 3 slots after reserving a prefill of max_prefill_tokens (32 tokens: 2 prompts of 16).
  budget = 2 * batching.bytes_per_row(cfg, 16, 0) + 3 * batching.bytes_per_slot(cfg, 32, "float32") + 100
  by_budget = ContinuousEngine(graphdef, None, params, memory_budget_bytes=budget, cache_length=32,
                               max_prefill_tokens=32)
  got = by_budget.generate(requests, config, 0)
  assert by_budget.stats.slots == 3
  explicit = ContinuousEngine(graphdef, None, params, slots=2, cache_length=32).generate(requests, config, 0)
  assert all(np.array_equal(a, b) for a, b in zip(got.tokens, explicit.tokens))
  with pytest.raises(ValueError, match="memory budget of 1000 bytes holds no decode slot"):
    ContinuousEngine(graphdef, None, params, memory_budget_bytes=1000, cache_length=32).generate(requests, config, 0)
  # bf16 compute: the KV cache is bf16 too, and greedy still equals the static sampler's.
  bf_graphdef, bf_params = nnx.split(init_decoder(cfg.replace(dtype="bfloat16"), seed=5))
  engine = ContinuousEngine(bf_graphdef, None, bf_params, slots=2, cache_length=32)
  bf = engine.generate(requests, config, 0)
  assert engine._state.cache[0].k.dtype == np.dtype("bfloat16")
  static = _static_rows(bf_graphdef, bf_params, [r.prompt for r in requests], [r.max_new_tokens for r in requests],
                        config, 0)
  assert all(np.array_equal(a, b) for a, b in zip(bf.tokens, static))


def test_bad_input_is_one_clear_error():
  graphdef, params = nnx.split(init_decoder(ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48),
                                            seed=5))
  config = SamplingConfig(max_new_tokens=30, eos_ids=(), bucket_lengths=(8,))
  engine = ContinuousEngine(graphdef, None, params, slots=2, cache_length=32)
  with pytest.raises(ValueError, match="needs 38 cache columns .* cache_length is 32"):
    engine.generate([[1, 2, 3]], config, 0)
  with pytest.raises(ValueError, match="longer than the largest bucket 8"):
    engine.generate([[1] * 9], config.replace(max_new_tokens=2), 0)
  with pytest.raises(ValueError, match="has no params"):
    ContinuousEngine(graphdef, None, slots=2).generate([[1]], config, 0)
  with pytest.raises(ValueError, match="needs slots or memory_budget_bytes"):
    ContinuousEngine(graphdef, None, params)
  with pytest.raises(ValueError, match="order 'random' is not one of"):
    ContinuousEngine(graphdef, None, params, slots=2, order="random")
  with pytest.raises(ValueError, match="Request.max_new_tokens=0"):
    Request([1], max_new_tokens=0)
