"""SOAR as a measured baseline reward (rewards/soar.py, selfplay/soar_measure.py, issue 16 item 3).

The measurement against a naive oracle (a Python loop of jax.grad SGD steps on a hand-written
per-row loss), the acceptance property on a tiny model (a group made of the held-out problems
themselves earns more than a group of unrelated tasks; the outer params stay bitwise the same), one
coding step with reward.name=soar_utility (scripted proposer and solver texts), and the Lean refusal.
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax import config_base
from compassplay_jax import sharding as sh
from compassplay_jax.engine import Engine, EngineSettings
from compassplay_jax.errors import user_error_line
from compassplay_jax.models.config import ConfigError, ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards import soar
from compassplay_jax.sampling.generate import GenerationResult
from compassplay_jax.rewards.proposer_rewards import RewardConfig
from compassplay_jax.selfplay import soar_measure
from compassplay_jax.selfplay import step as step_lib
from compassplay_jax.selfplay.sequences import pack
from compassplay_jax.selfplay.step import Candidate, SoarOptions
from tests.test_selfplay import _config, _lean_overrides

MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
PAD = 0


def _seqs(seed, n, low, high, prompt=(4, 9), completion=(5, 12)):
  """n (prompt ids, completion ids) pairs with tokens in [low, high), random lengths."""
  rng = np.random.default_rng(seed)
  return [(rng.integers(low, high, rng.integers(*prompt)).astype(np.int32),
           rng.integers(low, high, rng.integers(*completion)).astype(np.int32)) for _ in range(n)]


def _packed(pairs, rows=None):
  p = pack([a for a, _ in pairs], [b for _, b in pairs], PAD, row_multiple=1)
  out = {k: getattr(p, k) for k in ("tokens", "loss_mask", "attention_mask")}
  if rows:
    out = {k: np.pad(v, ((0, rows - len(v)), (0, 0))) for k, v in out.items()}
  return out


def _model():
  return nnx.split(init_decoder(MODEL, seed=0))


def _host(tree):
  return [np.array(x) for x in jax.tree.leaves(tree)]


# ---- the oracle: unpadded rows, one at a time, a hand-written CE, a Python loop of SGD steps ------

def _row_loss(graphdef, params, prompt, completion):
  ids = jnp.asarray(np.concatenate([prompt, completion]))[None]
  logits = nnx.merge(graphdef, params)(ids, attention_mask=jnp.ones_like(ids)).astype(jnp.float32)[0, :-1]
  logp = jax.nn.log_softmax(logits, axis=-1)
  token_logp = jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[:, 0]
  return -jnp.mean(token_logp[len(prompt) - 1:])


def _mean_loss(graphdef, params, pairs):
  return sum(_row_loss(graphdef, params, p, c) for p, c in pairs) / len(pairs)


def _oracle(graphdef, params, train, heldout, steps, lr):
  """A Python loop of `steps` SGD steps (jax.grad of the hand-written loss; jitted only for speed)."""
  held = jax.jit(lambda q: _mean_loss(graphdef, q, heldout))
  grad = jax.jit(jax.grad(lambda q: _mean_loss(graphdef, q, train)))
  before = float(held(params))
  p = params
  for _ in range(steps):
    g = grad(p)
    p = jax.tree.map(lambda x, gx: x - lr * gx, p, g)
  return before - float(held(p))


def test_improvement_equals_a_naive_sgd_loop():
  graphdef, params = _model()
  heldout, train = _seqs(1, 3, 1, 64), _seqs(2, 3, 1, 64)
  h, t = _packed(heldout), _packed(train, rows=4)  # a padding row (no loss tokens) changes nothing
  got = soar.soar_improvement_jit(graphdef, params, t["tokens"], t["loss_mask"], t["attention_mask"],
                                  h["tokens"], h["loss_mask"], h["attention_mask"], steps=3, learning_rate=0.3,
                                  micro_batch=2)
  want = _oracle(graphdef, params, train, heldout, steps=3, lr=0.3)
  assert abs(want) > 1e-3
  np.testing.assert_allclose(float(got["improvement"]), want, atol=1e-5)
  np.testing.assert_allclose(float(got["before"]), float(jax.jit(lambda q: _mean_loss(graphdef, q, heldout))(params)),
                             atol=1e-5)


def test_heldout_group_earns_more_than_unrelated_tasks_and_outer_params_stay():
  """The acceptance test: fixed seeds, through the engine as the loop calls it."""
  graphdef, params = _model()
  before_params = _host(params)
  heldout = _seqs(3, 4, 1, 32)   # held-out problems: tokens 1..31
  unrelated = _seqs(4, 4, 32, 64)  # unrelated tasks: tokens 32..63
  engine = Engine.build(graphdef, params, sh.make_mesh((1, 1, 1), jax.devices()[:1]), EngineSettings())
  held = pack([p for p, _ in heldout], [c for _, c in heldout], PAD)
  candidates = [Candidate(group="deduction", formatted=True, valid=True, solve_rate=0.5, solution=s)
                for s in heldout + unrelated]
  options = SoarOptions(held, group_size=4, steps=3, learning_rate=0.5)
  improvement, metrics = soar_measure.measure(engine, params, candidates, options, pad_id=PAD, max_len=64,
                                              reward_cfg=RewardConfig())
  same, other = metrics["soar/group_improvements"]
  assert metrics["soar/groups"] == 2
  assert same > other and same > 0, (same, other)
  np.testing.assert_array_equal(improvement, np.float32([same] * 4 + [other] * 4))
  for a, b in zip(before_params, _host(params)):  # the inner training trained a copy
    np.testing.assert_array_equal(a, b)
  # The engine's number is the oracle's.
  np.testing.assert_allclose(same, _oracle(graphdef, params, heldout, heldout, 3, 0.5), atol=1e-5)


# ---- one coding step with reward.name = soar_utility -------------------------------------------

PROGRAMS = {"x * 2": "3", "x + 5": "4", "x - 7": "9", "x * x": "2"}  # one-line body -> its input


class ScriptedCoder:
  """rollout.sample's signature, without the model: valid one-line proposals; solvers right on even
  samples (solve rate 1/2). Prompt ids are the real encoded prompts, so the SOAR rows are real."""

  def __init__(self, tokenizer):
    self.tok = tokenizer

  def answer(self, prompt, sample, index):
    if not isinstance(prompt, str):  # the proposal's second segment: its input
      body = self.tok.decode(list(prompt)).rsplit("return ", 1)[1].split("\n")[0]
      return PROGRAMS[body] + "\n"
    if prompt.endswith("return "):
      return list(PROGRAMS)[index % len(PROGRAMS)] + "\n"
    task = prompt[prompt.rindex("```python\n"):]
    body = next((b for b in PROGRAMS if f"return {b}\n" in task), None)
    if body is None:
      return "0\n"
    x = int(PROGRAMS[body])
    if prompt.endswith("```output\n"):
      return f"{eval(body)}\n" if sample % 2 == 0 else "-1000\n"
    return f"{x}\n" if sample % 2 == 0 else "1000\n"

  def __call__(self, engine, params, tokenizer, prompts, config, key, *, n_samples=1, **kwargs):
    from compassplay_jax.selfplay.rollout import truncate_prompt
    ids = [np.asarray(truncate_prompt(tokenizer, p, config.sampling.max_prompt_tokens) if isinstance(p, str)
                      else p, np.int32) for p in prompts]
    texts = [self.answer(p, s, i) for i, p in enumerate(prompts) for s in range(n_samples)]
    tokens = [np.asarray(tokenizer.encode(t, add_special_tokens=False), np.int32) for t in texts]
    n = len(texts)
    return GenerationResult(prompt_index=np.repeat(np.arange(len(prompts)), n_samples),
                            sample_index=np.tile(np.arange(n_samples), len(prompts)),
                            prompt_tokens=[ids[r // n_samples] for r in range(n)], tokens=tokens,
                            logprobs=[np.full(len(t), -1.0, np.float32) for t in tokens],
                            lengths=np.asarray([len(t) for t in tokens]), finish_reasons=["stop"] * n, texts=texts)


def test_coding_step_pays_each_group_its_measured_improvement():
  from compassplay_jax.selfplay.coding import CodingSelfPlay
  from compassplay_jax.selfplay.run import build_model
  from compassplay_jax.verifiers.sandbox import SandboxPool
  config = _config("coding:tiny", **{"reward.name": "soar_utility", "reward.soar_group_size": 2,
                                     "reward.soar_inner_steps": 2, "reward.soar_inner_lr": 0.05})
  config_base.check_config(config)
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  before_params = _host(params)
  pool = SandboxPool(num_workers=1)
  try:
    setting = CodingSelfPlay(config, tokenizer, pool, sampler=ScriptedCoder(tokenizer))
    assert setting.reference is None and setting.soar_heldout.tokens.shape[0] == config.reward.reference_size
    engine = step_lib.one_device_engine(graphdef, params, config)
    metrics = step_lib.run_step(setting, engine, params, None, 1, jax.random.key(0), update=None).metrics
  finally:
    pool.close()
  records = metrics["candidates"]
  valid = [r for r in records if r["valid"]]
  assert len(valid) == len(records) == 4, records
  groups = metrics["soar/group_improvements"]
  assert metrics["soar/groups"] == len(groups) == 2 and metrics["time/soar"] > 0
  # Valid candidates in proposal order, two per group; each is paid its group's improvement.
  want = [groups[i // 2] for i in range(len(valid))]
  np.testing.assert_allclose([r["reward"] for r in valid], want, rtol=1e-6, atol=1e-7)
  assert all(abs(g) > 0 for g in groups), groups
  for a, b in zip(before_params, _host(params)):
    np.testing.assert_array_equal(a, b)


# ---- start-up checks ----------------------------------------------------------------------------

def test_lean_refuses_soar_with_one_line_before_anything_starts():
  from compassplay_jax.selfplay import lean
  config = _config("lean:tiny", **_lean_overrides(), **{"reward.name": "soar_utility"})
  with pytest.raises(ConfigError) as e:
    lean.validate_config(config)
  line = user_error_line(e.value)
  assert "\n" not in line and "reward.name=soar_utility is not supported by the lean setting" in line


@pytest.mark.parametrize("field,value", [("soar_group_size", 0), ("soar_inner_steps", 0), ("soar_inner_lr", 0.0),
                                         ("soar_heldout_size", -1)])
def test_bad_soar_fields_are_refused_at_start_up(field, value):
  config = _config("coding:tiny", **{"reward.name": "soar_utility", f"reward.{field}": value})
  with pytest.raises(ConfigError, match=f"config.reward.{field}"):
    config_base.check_config(config)


def test_missing_heldout_file_is_refused_at_start_up():
  from compassplay_jax.selfplay import coding
  config = _config("coding:tiny", **{"reward.name": "soar_utility", "reward.soar_heldout_path": "/nonexistent.jsonl"})
  with pytest.raises(Exception) as e:
    coding.validate_config(config)
  assert user_error_line(e.value) and "/nonexistent.jsonl" in str(e.value)


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q", "-p", "no:xdist"]))
