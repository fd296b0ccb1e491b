"""Rollouts for the loop (issue 25): compute-dtype weights cast once per update (no weight convert in
the decode program), rows reported as soon as they are final (on_finish), prompt buckets that reach
the config's max prompt length (a 6000-token prompt under the paper's sampler settings), and slots
from a memory budget (device memory where jax reports it)."""
import pathlib
import re
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.sampling import SamplingConfig, batching, decode, generate
from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import Request
from compassplay_jax.sampling.static_engine import StaticEngine

CFG = ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48)
PROMPTS = [[5, 17, 3, 9, 22], [11, 4, 61], [7, 7, 30, 12, 50, 19, 2], [8, 1], [40, 41, 42], [9, 9, 9, 9]]
BUDGETS = [12, 3, 9, 5, 16, 7]


def _weight_shapes(params):
  return {tuple(x.shape) for x in jax.tree.leaves(params) if x.ndim == 2} | \
      {tuple(x.shape[::-1]) for x in jax.tree.leaves(params) if x.ndim == 2}


def _f32_to_bf16_converts(hlo: str) -> set:
  """Result shapes of every f32 -> bf16 convert in a compiled HLO module's text (fused computations
  included; the text names operands without their types, so types come from their definitions)."""
  types = {m.group(1): m.group(2) for m in re.finditer(r"%([\w.\-]+) = (\w+)\[", hlo)}
  found = re.finditer(r"%[\w.\-]+ = bf16\[([\d,]*)\]\S* convert\(%([\w.\-]+)\)", hlo)
  return {tuple(int(d) for d in m.group(1).split(",") if d) for m in found if types.get(m.group(2)) == "f32"}


def test_weights_cast_once_per_update_and_no_weight_convert_in_the_decode_loop():
  cfg = CFG.replace(dtype="bfloat16")  # fp32 masters (param_dtype), bf16 compute
  graphdef, masters = nnx.split(init_decoder(cfg, seed=5))
  engine = ContinuousEngine(graphdef, None, masters, slots=2, cache_length=64, chunk_tokens=4)
  assert all(x.dtype == np.dtype("bfloat16") for x in jax.tree.leaves(engine.params))
  cast = engine.params
  engine.update_params(masters)  # the same masters again: not re-cast
  assert engine.params is cast
  assert engine.programs.compile_counts()["cast_params"] == 1

  config = SamplingConfig(temperature=0.0, max_new_tokens=16, eos_ids=(), bucket_lengths=(8,))
  engine.precompile(config, (8,), 0)
  state, host_done = engine._state, np.ones((2,), bool)
  kw = dict(sampler=config.sampler, eos_ids=(), window=64)

  def converts(params):
    jitted = engine.programs.decode_chunk_jit(graphdef, params, state, host_done, np.int32(3), **kw)
    return _f32_to_bf16_converts(jitted.lower(params, state, host_done, np.int32(3)).compile().as_text())

  weights = _weight_shapes(masters)
  assert not converts(engine.params) & weights  # bf16 weights in: no weight is converted
  assert converts(masters) & weights  # fp32 masters in: the decoder converts them (the check can fail)

  # Cast once == cast in the loop: greedy rows equal the landed sampler's fed the fp32 masters.
  requests = [Request(p, max_new_tokens=b) for p, b in zip(PROMPTS, BUDGETS)]
  got = engine.generate(requests, config, 0)
  want = generate(graphdef, masters, None, PROMPTS, config, 0)
  for r, b in enumerate(BUDGETS):
    np.testing.assert_array_equal(got.tokens[r], want.tokens[r][:b])
  static = StaticEngine(graphdef, None, masters)
  assert all(x.dtype == np.dtype("bfloat16") for x in jax.tree.leaves(static.params))


class _CountingFns:
  """decode's prefill/decode, counting prefill calls (one per micro-batch)."""

  def __init__(self):
    self.prefills = 0

  def prefill(self, *args, **kw):
    self.prefills += 1
    return decode.prefill(*args, **kw)

  def decode(self, *args, **kw):
    return decode.decode(*args, **kw)


@pytest.mark.parametrize("name", ["static", "continuous"])
def test_on_finish_reports_every_row_once_as_soon_as_it_is_final(name):
  graphdef, params = nnx.split(init_decoder(CFG, seed=5))
  config = SamplingConfig(temperature=1.0, max_new_tokens=16, n_samples=2, eos_ids=(3, 4), bucket_lengths=(8,),
                          micro_batch_size=4)
  # Two budgets, interleaved: the static engine runs one generate per budget (each compiles its own
  # programs), each of 3 prompts in 2 micro-batches, and maps their rows back to request order.
  requests = [Request(p, max_new_tokens=(16, 3)[i % 2]) for i, p in enumerate(PROMPTS)]
  fns = _CountingFns()
  engine = StaticEngine(graphdef, None, params, device_fns=fns) if name == "static" else \
      ContinuousEngine(graphdef, None, params, slots=4, chunk_tokens=2)
  progress = (lambda: fns.prefills) if name == "static" else (lambda: engine.stats.decode_calls)
  reports = []
  res = engine.generate(requests, config, jax.random.key(2),
                        on_finish=lambda r, tokens, text, why: reports.append((r, tokens, text, why, progress())))
  assert sorted(r for r, *_ in reports) == list(range(len(res)))  # every row exactly once
  for r, tokens, text, why, _ in reports:
    np.testing.assert_array_equal(tokens, res.tokens[r])
    assert text is None and why == res.finish_reasons[r]
  # Reported before the engine's work ended: before the last micro-batch's prefill (static) or
  # before the last decode call (continuous).
  assert min(p for *_, p in reports) < progress()
  assert {"eos", "length"} <= set(res.finish_reasons)


def test_on_finish_texts_are_the_results_texts():
  from compassplay_jax.models.gguf_io import embedded_gguf_path, load_gguf_tokenizer
  tok = load_gguf_tokenizer(embedded_gguf_path())
  cfg = CFG.replace(vocab_size=len(tok))
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  config = SamplingConfig(temperature=1.0, max_new_tokens=10, n_samples=2, bucket_lengths=(16,),
                          stop_strings=("e",))
  texts = {}
  res = ContinuousEngine(graphdef, tok, params, slots=2, chunk_tokens=3).generate(
      ["Hello there", "Say hi"], config, 0, on_finish=lambda r, t, text, why: texts.setdefault(r, text))
  assert [texts[r] for r in range(len(res))] == res.texts
  assert "stop" in res.finish_reasons  # a cut text among them


def _paper_config():
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
  try:
    import coding
  finally:
    sys.path.pop(0)
  return coding.get_config("paper")


@pytest.mark.parametrize("engine_name", ["continuous", "static"])
def test_a_6000_token_prompt_goes_through_the_paper_sampler_settings(engine_name):
  """AZR keeps prompts of up to 6144 tokens; the largest default bucket was 4096, so such a prompt
  raised 'longer than the largest bucket'. Tiny model, the paper's sampling block otherwise."""
  from compassplay_jax.runtime.model_setup import build_model
  from compassplay_jax.selfplay import rollout
  from tests.engines import one_device_engine
  config = _paper_config()
  config.model.path = "tiny"
  # The smallest tiny model (the prefill of 6144 tokens dominates): the sampler settings are the paper's.
  config.model.tiny_hidden_size, config.model.tiny_layers = 16, 1
  config.model.tiny_heads = config.model.tiny_kv_heads = 1
  config.sampling.engine = engine_name
  assert config.sampling.max_prompt_tokens == 6144 and config.sampling.max_new_tokens == 8096
  model, tok = build_model(config)
  graphdef, params = nnx.split(model)
  ids = [int(t) for t in np.random.default_rng(0).integers(100, len(tok), 6000)]
  run_engine = one_device_engine(graphdef, params, config)
  res = rollout.sample(run_engine, params, tok, [ids], config, jax.random.key(0), n_samples=2, max_new_tokens=3)
  assert len(res) == 2 and list(res.lengths) == [3, 3] and res.finish_reasons == ["length", "length"]
  np.testing.assert_array_equal(res.prompt_tokens[0], ids)  # not cut
  assert all(np.all(np.isfinite(lp)) and np.all(lp <= 0) for lp in res.logprobs)
  assert 6144 in rollout.sampling_config(config).bucket_lengths


def test_prompt_buckets_reach_the_max_prompt_length():
  assert batching.prompt_buckets(6144, 8096)[-4:] == (4096, 6144, 8192, 16384)
  assert batching.prompt_buckets(1024, 24) == (32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
  assert batching.prompt_buckets(1000)[:10] == (32, 64, 128, 192, 256, 384, 512, 768, 1000, 1024)
  with pytest.raises(ValueError, match="max_prompt_tokens=0"):
    batching.prompt_buckets(0)


class _Device:
  def __init__(self, stats):
    self.stats = stats

  def memory_stats(self):
    return self.stats


def test_memory_budget_from_the_devices_free_memory():
  gib = 1 << 30
  gpus = [_Device({"bytes_limit": 80 * gib, "bytes_in_use": 30 * gib}),
          _Device({"bytes_limit": 80 * gib, "bytes_in_use": 20 * gib})]
  assert batching.device_memory_budget(gpus, fraction=0.5) == 25 * gib  # half the least free memory
  assert batching.device_memory_budget([_Device(None)]) == batching.CPU_MEMORY_BUDGET
  assert batching.device_memory_budget(jax.devices("cpu")[:1], cpu_default=123) == 123


def test_slots_per_device_from_the_budget_and_split_kv_heads():
  cfg = ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                    num_key_value_heads=2)
  one = batching.bytes_per_slot(cfg, 64, "float32")
  split = batching.bytes_per_slot(cfg, 64, "float32", tensor=2)
  cache = 2 * cfg.num_hidden_layers * 64 * cfg.num_key_value_heads * cfg.head_dim * 4
  assert one - split == cache // 2 + 2 * 2 * 64 * 4  # half the kv heads and half the attention heads
  assert batching.bytes_per_slot(cfg, 64, "float32", tensor=4) == one - 2 * 3 * 64 * 4  # kv heads replicated
  reserve = 2 * batching.bytes_per_row(cfg, 16, 0)
  assert batching.slots_for_budget(cfg, 64, "float32", reserve + 5 * split, 16, tensor=2, prefill_rows=2) == 5


def test_the_run_engine_builds_the_continuous_engine_with_budget_slots():
  from compassplay_jax.runtime.model_setup import build_model
  from tests.engines import one_device_engine
  config = _paper_config()
  config.model.path = "tiny"
  config.model.dtype = "float32"
  config.sampling.engine = "continuous"
  graphdef, params = nnx.split(build_model(config)[0])
  run = one_device_engine(graphdef, params, config)
  engine = run.rollout_engine(None, config.sampling)
  assert isinstance(engine, ContinuousEngine) and engine.mesh is run.mesh
  assert engine.memory_budget_bytes == batching.CPU_MEMORY_BUDGET  # 0: the CPU default
  config.sampling.memory_budget_gb = 0.25
  run = one_device_engine(graphdef, params, config)
  assert run.rollout_engine(None, config.sampling).memory_budget_bytes == 1 << 28
