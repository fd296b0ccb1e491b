"""The rollout-engine seam: both engines honour the RolloutEngine contract the loop relies on
(prompt-major rows, per-request budgets, draws keyed by request, params from update_params)."""
import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.sampling import SamplingConfig, generate
from compassplay_jax.sampling.continuous import ContinuousEngine
from compassplay_jax.sampling.rollout_engine import Request, RolloutEngine
from compassplay_jax.sampling.static_engine import StaticEngine
from compassplay_jax.sampling.factory import make_engine
from tests.engines import one_device_engine

CFG = ModelConfig(vocab_size=89, hidden_size=32, intermediate_size=48)
PROMPTS = [[5, 17, 3, 9, 22], [11, 4, 61], [7, 7, 30, 12, 50, 19, 2], [8, 1]]


@pytest.fixture(scope="module")
def split():
  return nnx.split(init_decoder(CFG, seed=5))


@pytest.mark.parametrize("name", ["static", "continuous"])
def test_mixed_budgets_keep_each_requests_draws(split, name):
  graphdef, params = split
  options = dict(slots=3, chunk_tokens=4) if name == "continuous" else {}
  engine = make_engine(name, graphdef, None, params, **options)
  assert isinstance(engine, RolloutEngine)
  config = SamplingConfig(temperature=1.0, max_new_tokens=12, n_samples=2, eos_ids=(), bucket_lengths=(8,))
  budgets = [12, 5, 9, 5]
  mixed = engine.generate([Request(p, max_new_tokens=b) for p, b in zip(PROMPTS, budgets)], config, 7)
  # The oracle: today's generate with one budget for all; a row's draws depend on (key, request,
  # sample, token index) only, so each mixed-budget row is a prefix of the uniform one.
  uniform = generate(graphdef, params, None, PROMPTS, config, jax.random.key(7))
  assert list(mixed.prompt_index) == [0, 0, 1, 1, 2, 2, 3, 3] and list(mixed.sample_index) == [0, 1] * 4
  for r in range(len(mixed)):
    b = budgets[r // 2]
    np.testing.assert_array_equal(mixed.tokens[r], uniform.tokens[r][:b])
    np.testing.assert_allclose(mixed.logprobs[r], uniform.logprobs[r][:b], atol=1e-5)
    assert mixed.lengths[r] == b and mixed.finish_reasons[r] == "length"
    np.testing.assert_array_equal(mixed.prompt_tokens[r], PROMPTS[r // 2])


@pytest.mark.parametrize("name", ["static", "continuous"])
def test_update_params_changes_the_policy(split, name):
  graphdef, params = split
  options = dict(slots=2) if name == "continuous" else {}
  engine = make_engine(name, graphdef, None, **options)
  with pytest.raises(ValueError, match="has no params: call update_params first"):
    engine.generate(PROMPTS, SamplingConfig(eos_ids=()), 0)
  config = SamplingConfig(temperature=0.0, max_new_tokens=6, eos_ids=(), bucket_lengths=(8,))
  engine.update_params(params)
  before = engine.generate(PROMPTS, config, 0)
  other = nnx.split(init_decoder(CFG, seed=6))[1]
  engine.update_params(other)
  after = engine.generate(PROMPTS, config, 0)
  want = generate(graphdef, other, None, PROMPTS, config, 0)
  assert all(np.array_equal(a, w) for a, w in zip(after.tokens, want.tokens))
  assert not all(np.array_equal(a, b) for a, b in zip(after.tokens, before.tokens))


def test_unknown_engine_is_one_clear_error(split):
  graphdef, params = split
  with pytest.raises(ValueError, match="sampling engine 'sglang' is not one of"):
    make_engine("sglang", graphdef, None, params)
  with pytest.raises(ValueError, match="requests is empty"):
    StaticEngine(graphdef, None, params).generate([], SamplingConfig(eos_ids=()), 0)
  assert isinstance(make_engine("continuous", graphdef, None, params, slots=2), ContinuousEngine)


def _coding_config(variant):
  import pathlib
  import sys
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
  try:
    import coding
  finally:
    sys.path.pop(0)
  return coding.get_config(variant)


@pytest.fixture(scope="module")
def tiny_loop():
  from compassplay_jax.selfplay.run import build_model
  config = _coding_config("tiny")
  model, tokenizer = build_model(config)
  return config, nnx.split(model), tokenizer


def test_loop_sampling_goes_through_the_configured_engine(tiny_loop):
  from compassplay_jax.sampling import build_prompt
  from compassplay_jax.selfplay import rollout
  config, (graphdef, params), tok = tiny_loop
  prompts = [build_prompt(tok, "Write f(x) = x + 1."), build_prompt(tok, "Say hi.")]
  assert config.sampling.engine == "continuous"  # the default (docs/sampling.md, the loop workload)
  run_engine = one_device_engine(graphdef, params, config)
  cont = rollout.sample(run_engine, params, tok, prompts, config, jax.random.key(0), n_samples=2,
                        max_new_tokens=6, stop_strings=("\n",))
  engine = run_engine.rollout
  assert isinstance(engine, ContinuousEngine)
  assert engine.params is run_engine.sampler_params(params) and engine.stats.inserts == 4
  config.sampling.engine = "static"
  try:
    run_engine = one_device_engine(graphdef, params, config)
    static = rollout.sample(run_engine, params, tok, prompts, config, jax.random.key(0), n_samples=2,
                            max_new_tokens=6, stop_strings=("\n",))
    assert isinstance(run_engine.rollout, StaticEngine)
  finally:
    config.sampling.engine = "continuous"
  # Same keys per (prompt, sample, token) in both engines: the same rollouts.
  assert all(np.array_equal(a, b) for a, b in zip(static.tokens, cont.tokens))
  assert static.finish_reasons == cont.finish_reasons and static.texts == cont.texts
  config.sampling.engine = "sglang"
  try:
    with pytest.raises(ValueError, match="sampling engine 'sglang' is not one of"):
      rollout.sample(one_device_engine(graphdef, params, config), params, tok, prompts, config,
                     jax.random.key(0))
  finally:
    config.sampling.engine = "continuous"


class _CountingEngine(RolloutEngine):
  """An engine the loop knows nothing about (as an external one would be): counts the calls it gets
  and delegates the sampling to the static engine."""

  def __init__(self, graphdef, tokenizer):
    self.inner, self.updates, self.calls = StaticEngine(graphdef, tokenizer), [], 0

  def update_params(self, params):
    self.updates.append(params)
    self.inner.update_params(params)

  def generate(self, requests, config, key, on_finish=None):
    self.calls += 1
    return self.inner.generate(requests, config, key, on_finish=on_finish)


def test_an_engine_plugged_into_the_loop_is_used_without_loop_changes(tiny_loop):
  from compassplay_jax.sampling import build_prompt
  from compassplay_jax.selfplay import rollout
  config, (graphdef, params), tok = tiny_loop
  prompts = [build_prompt(tok, "Say hi.")]
  want = rollout.sample(one_device_engine(graphdef, params, config), params, tok, prompts, config,
                        jax.random.key(1), max_new_tokens=5)
  plugged = _CountingEngine(graphdef, tok)
  run_engine = one_device_engine(graphdef, params, config)
  run_engine.rollout = plugged  # Engine.rollout_engine's documented seam for an external engine
  got = rollout.sample(run_engine, params, tok, prompts, config, jax.random.key(1), max_new_tokens=5)
  assert plugged.calls == 1 and plugged.updates == [run_engine.sampler_params(params)]
  np.testing.assert_array_equal(got.tokens[0], want.tokens[0])


def test_engines_by_name_implement_the_seam():
  """The seam lives in rollout_engine.py (so continuous.py and static_engine.py need not import the
  factory); factory.make_engine picks an engine by name and names the known ones otherwise."""
  from compassplay_jax.sampling import factory, rollout_engine
  assert factory.ENGINES == ("static", "continuous", "vllm")
  assert issubclass(ContinuousEngine, RolloutEngine) and issubclass(StaticEngine, RolloutEngine)
  assert rollout_engine.as_requests([[1, 2], "hi"]) == [Request([1, 2]), Request("hi")]
  with pytest.raises(ValueError, match="is not one of"):
    factory.make_engine("sglang", None, None)
