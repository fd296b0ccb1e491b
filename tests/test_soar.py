"""SOAR as a measured baseline reward (rewards/soar.py, selfplay/soar_measure.py; issue 16 item 3, issue 26 item 6).

The NLL measurement against a naive oracle (a Python loop of jax.grad SGD steps on a hand-written
per-row loss), inner steps on batch_rows rows at a time against the same loop over the rows it names,
the accuracy signal against a naive computation (greedy answers by a plain argmax loop over the
model, answers read with a regex and compared as strings), the acceptance property on a tiny model (a
group made of the held-out problems themselves earns more than a group of unrelated tasks; the outer
params stay bitwise the same), the held-out set kept apart from the reference set, coding steps with
reward.name=soar_utility (scripted proposer and solver texts) for both signals, and the start-up checks.
"""
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.runtime import config_base
from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.core.errors import user_error_line
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
from tests.engines import one_device_engine

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


def _oracle(graphdef, params, train, heldout, steps, lr, batch_rows=0):
  """A Python loop of `steps` SGD steps (jax.grad of the hand-written loss; jitted only for speed);
  batch_rows > 0: step k on rows (k·b + j) mod n, j < b."""
  held = jax.jit(lambda q: _mean_loss(graphdef, q, heldout))
  grads = {}
  before = float(held(params))
  p = params
  for k in range(steps):
    rows = tuple((k * batch_rows + j) % len(train) for j in range(batch_rows)) if batch_rows else tuple(
        range(len(train)))
    if rows not in grads:
      grads[rows] = jax.jit(jax.grad(lambda q, pairs=[train[i] for i in rows]: _mean_loss(graphdef, q, pairs)))
    p = jax.tree.map(lambda x, gx: x - lr * gx, p, grads[rows](p))
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


def test_inner_steps_on_batch_rows_cycle_through_the_group_as_a_naive_loop_does():
  """batch_rows = 2 over a group of 3 real rows (a padding row between them): step k trains on real rows
  (2k, 2k + 1) mod 3, i.e. [0, 1], [2, 0], [1, 2], [0, 1]; the params equal a Python SGD loop over those."""
  graphdef, params = _model()
  train = _seqs(5, 3, 1, 64)
  t = _packed(train, rows=4)
  t = {k: np.concatenate([v[:1], v[3:4], v[1:3]]) for k, v in t.items()}  # rows: 0, padding, 1, 2
  got = jax.jit(lambda p: soar.inner_sgd(graphdef, p, t["tokens"], t["loss_mask"], t["attention_mask"], steps=4,
                                         learning_rate=0.3, micro_batch=2, batch_rows=2))(params)
  want, grads = params, {}
  for rows in ([0, 1], [2, 0], [1, 2], [0, 1]):
    key = tuple(rows)
    if key not in grads:
      grads[key] = jax.jit(jax.grad(lambda q, pairs=[train[i] for i in rows]: _mean_loss(graphdef, q, pairs)))
    want = jax.tree.map(lambda x, g: x - 0.3 * g, want, grads[key](want))
  whole = jax.jit(lambda p: soar.inner_sgd(graphdef, p, t["tokens"], t["loss_mask"], t["attention_mask"], steps=4,
                                           learning_rate=0.3, micro_batch=2))(params)
  for a, b, c in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(whole)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  assert max(float(jnp.max(jnp.abs(a - c))) for a, c in zip(jax.tree.leaves(got), jax.tree.leaves(whole))) > 1e-4
  # The engine's copy (what the accuracy signal decodes with) is the same function's.
  engine = Engine.build(graphdef, params, sh.make_mesh((1, 1, 1), jax.devices()[:1]), EngineSettings())
  copy = engine.soar_trained_params(params, engine.put_batch(t), steps=4, learning_rate=0.3, batch_rows=2)
  for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


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
  assert metrics["soar/groups"] == 2 and metrics["soar/distinct_rewards"] == 2 and metrics["soar/zero_groups"] == 0
  assert metrics["soar/param_change_l2"] > 0 and 0 < metrics["soar/param_change_rms_rel"] < 1
  assert 0 < metrics["soar/param_bf16_changed"] <= 1 and metrics["soar/param_change_max_ulp"] > 1
  assert same > other and same > 0, (same, other)
  np.testing.assert_array_equal(improvement, np.float32([same] * 4 + [other] * 4))
  for a, b in zip(before_params, _host(params)):  # the inner training trained a copy
    np.testing.assert_array_equal(a, b)
  # The engine's number is the oracle's.
  np.testing.assert_allclose(same, _oracle(graphdef, params, heldout, heldout, 3, 0.5), atol=1e-5)
  # Inner steps of 3 of the 4 rows (rows 0-2, 3-1, 2-0), through the engine too.
  batched = SoarOptions(held, group_size=4, steps=3, learning_rate=0.5, batch_rows=3)
  _, m = soar_measure.measure(engine, params, candidates[:4], batched, pad_id=PAD, max_len=64, reward_cfg=RewardConfig())
  want = _oracle(graphdef, params, heldout, heldout, 3, 0.5, batch_rows=3)
  np.testing.assert_allclose(m["soar/group_improvements"], [want], atol=1e-5)
  assert abs(want - same) > 1e-4


# ---- the inner optimizer and how far the copy moves (issue 50 item 3) ---------------------------

def test_adam_inner_steps_equal_a_naive_optax_loop_and_move_weights_by_about_lr():
  """optimizer "adam": a fresh optax.adam(lr) state, steps on step_rows; the same as a Python loop of
  jax.grad + optax.adam over the rows it names. Adam's first step moves (almost) every weight by lr."""
  import optax
  graphdef, params = _model()
  train = _seqs(6, 3, 1, 64)
  t = _packed(train)
  run = lambda steps: jax.jit(lambda p: soar.inner_train(
      graphdef, p, t["tokens"], t["loss_mask"], t["attention_mask"], steps=steps, learning_rate=1e-3,
      micro_batch=2, batch_rows=2, optimizer="adam"))(params)
  got = run(3)
  tx = optax.adam(1e-3)
  want, state, first = params, tx.init(params), None
  for rows in ([0, 1], [2, 0], [1, 2]):
    g = jax.grad(lambda q, pairs=[train[i] for i in rows]: _mean_loss(graphdef, q, pairs))(want)
    updates, state = tx.update(g, state, want)
    want = optax.apply_updates(want, updates)
    first = want if first is None else first
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)  # 2% of lr: sign-like steps
  # The first step (the loop's, which the three steps above equal) moves each weight by about lr.
  step = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel()
                         for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(params))])
  assert np.median(step) > 0.9e-3 and step.max() < 1.01e-3  # ~lr each, whatever the gradient's scale
  with pytest.raises(ValueError, match="inner optimizer"):
    soar.inner_train(graphdef, params, t["tokens"], t["loss_mask"], t["attention_mask"], steps=1,
                     learning_rate=1e-3, optimizer="adagrad")


def test_param_change_against_numpy():
  """l2, RMS ratio, the largest change in bf16 ulps and the fraction of weights whose bf16 value changes,
  on weights whose bf16 spacing is known: at 1.0 the spacing is 2^-7, at 0.5 it is 2^-8."""
  before = {"a": jnp.float32([1.0, 1.0, 0.5, 0.5]), "b": jnp.float32([[1.0, -1.0, 0.0]])}
  delta = {"a": jnp.float32([2.0 ** -9, 2.0 ** -6, 0.0, 2.0 ** -8]), "b": jnp.float32([[0.0, -2.0 ** -7, 2.0 ** -20]])}
  after = jax.tree.map(lambda x, d: x + d, before, delta)
  got = {k: float(v) for k, v in jax.jit(soar.param_change)(before, after).items()}
  d = np.concatenate([np.ravel(x) for x in jax.tree.leaves(delta)])
  b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(before)])
  np.testing.assert_allclose(got["l2"], np.linalg.norm(d), rtol=1e-6)
  np.testing.assert_allclose(got["rms_rel"], np.linalg.norm(d) / np.linalg.norm(b), rtol=1e-6)
  # 2^-6 at 1.0 is two ulps, 2^-8 at 0.5 one; the weight at 0 (no meaningful ulp) is left out
  np.testing.assert_allclose(got["max_ulp"], 2.0, rtol=1e-6)
  # bf16 changes: 2^-6 at 1.0, 2^-8 at 0.5, 2^-7 at -1.0, 2^-20 at 0; not 2^-9 at 1.0 (under half an ulp), not 0
  np.testing.assert_allclose(got["bf16_changed"], 4 / 7, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(soar.bf16_ulp(jnp.float32([1.0, 0.75, 0.5, -3.0]))),
                                np.float32([2.0 ** -7, 2.0 ** -8, 2.0 ** -8, 2.0 ** -6]))


# ---- the accuracy signal: greedy held-out answers, checked --------------------------------------

def _greedy_oracle(graphdef, tokenizer, prompts, max_new_tokens):
  """prompt -> greedy completion text: a plain loop of full forwards over a fixed-size buffer (causal, so
  the padding after the live tokens changes nothing), argmax of the last live position, up to an EOS."""
  from compassplay_jax.models.tokenizer import eos_token_ids
  eos = set(eos_token_ids(tokenizer))
  ids_of = {p: list(tokenizer.encode(p, add_special_tokens=True)) for p in prompts}
  width = max(len(ids) for ids in ids_of.values()) + max_new_tokens
  forward = jax.jit(lambda q, x: nnx.merge(graphdef, q)(x, attention_mask=jnp.ones_like(x)))

  def greedy(params, prompt):
    ids, out = list(ids_of[prompt]), []
    for _ in range(max_new_tokens):
      buf = np.full((1, width), tokenizer.pad_token_id, np.int32)
      buf[0, :len(ids)] = ids
      token = int(np.argmax(np.asarray(forward(params, buf))[0, len(ids) - 1]))
      if token in eos:
        break
      ids.append(token)
      out.append(token)
    return tokenizer.decode(out, skip_special_tokens=True)
  return greedy


def _boxed(text):
  found = re.findall(r"\\boxed\{([^{}]*)\}", text)
  return found[-1].strip() if found else None


@pytest.mark.slow  # 100 inner steps per copy: a random tiny model needs them to answer "\\boxed{7}"
def test_accuracy_signal_equals_greedy_answers_checked_naively():
  """The accuracy signal end to end on a tiny model: per group, the copy engine.soar_trained_params
  returns (kept as measure() makes it; the inner SGD itself is the NLL and batch_rows tests' subject)
  answers the held-out problems greedily; the oracle decodes the same params with a plain argmax loop,
  reads the last \\boxed{} with a regex and compares strings. A group that teaches the held-out prompts the answer 7 earns 1/2 (one of
  the two golds is 7); an unrelated group earns 0."""
  from compassplay_jax.evals.math_check import MathChecker
  from compassplay_jax.selfplay.run import build_model
  config = _config("coding:tiny")
  model, tok = build_model(config)
  graphdef, params = nnx.split(model)
  engine = one_device_engine(graphdef, params, config)
  questions = (("Q: What is 3+4?\nA:", "7"), ("Q: What is 2*5?\nA:", "10"))
  enc = lambda text: np.asarray(tok.encode(text, add_special_tokens=True), np.int32)
  answer = lambda text: np.asarray(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id], np.int32)
  taught = [(enc(q), answer(" \\boxed{7}")) for q, _ in questions]
  unrelated = [(enc("Name a colour.\nA:"), answer(" blue")), (enc("Say hi.\nA:"), answer(" hi"))]
  candidates = [Candidate(group="deduction", formatted=True, valid=True, solve_rate=0.5, solution=s)
                for s in taught + unrelated]
  steps, lr, max_new, max_len = 100, 0.4, 8, 64
  checker = MathChecker(num_workers=1)
  heldout = soar_measure.HeldoutAnswers(prompts=tuple(q for q, _ in questions), answers=tuple(a for _, a in questions),
                                        tokenizer=tok, checker=checker, max_new_tokens=max_new, batch_size=2)
  options = SoarOptions(None, group_size=2, steps=steps, learning_rate=lr, accuracy=heldout)
  before_params = _host(params)
  copies, train_copy = [], engine.soar_trained_params  # keep each copy measure() decodes with
  engine.soar_trained_params = lambda *a, **k: copies.append(train_copy(*a, **k)) or copies[-1]
  try:
    improvement, metrics = soar_measure.measure(engine, params, candidates, options, pad_id=tok.pad_token_id,
                                                max_len=max_len, reward_cfg=RewardConfig())
  finally:
    checker.close()
  greedy = _greedy_oracle(graphdef, tok, heldout.prompts, max_new)
  accuracy = lambda p: float(np.mean([_boxed(greedy(p, q)) == gold for q, gold in questions]))
  before = accuracy(params)
  want = [accuracy(copy) - before for copy in copies]
  assert want == [0.5, 0.0], want
  assert metrics["soar/signal"] == "accuracy" and metrics["soar/heldout_accuracy"] == before == 0.0
  assert metrics["soar/group_improvements"] == want and metrics["soar/distinct_values"] == 2
  assert metrics["soar/distinct_rewards"] == 2 and metrics["soar/zero_groups"] == 1
  # The taught copy's answers changed (it now writes \boxed{7}); every copy moved its weights.
  assert 0 < metrics["soar/answers_changed"] <= 1 and 0 < metrics["soar/final_answers_changed"] <= 1
  assert metrics["soar/param_change_l2"] > 0
  np.testing.assert_array_equal(improvement, np.float32([0.5, 0.5, 0.0, 0.0]))
  assert metrics["soar/heldout_answers"] == 2 * 3 and metrics["soar/inner_sgd_steps"] == 2 * steps
  assert metrics["soar/seconds"] > 0
  for a, b in zip(before_params, _host(params)):  # the copies were trained, not the solver
    np.testing.assert_array_equal(a, b)


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
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  from compassplay_jax.selfplay.run import build_model
  from compassplay_jax.verifiers.sandbox import SandboxPool
  config = _config("coding:tiny", **{"reward.name": "soar_utility", "reward.soar_signal": "nll",
                                     "reward.soar_group_size": 2, "reward.soar_inner_steps": 2,
                                     "reward.soar_inner_batch": 0, "reward.soar_inner_lr": 0.05, "reward.soar_inner_optimizer": "sgd"})
  config_base.check_config(config)
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  before_params = _host(params)
  pool = SandboxPool(num_workers=1)
  try:
    setting = CodingSelfPlay(config, tokenizer, pool, sampler=ScriptedCoder(tokenizer))
    assert setting.reference is None and setting.soar_heldout.tokens.shape[0] == config.reward.reference_size
    assert setting.soar_answers is None
    engine = one_device_engine(graphdef, params, config)
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
  assert metrics["soar/signal"] == "nll" and metrics["soar/heldout_passes"] == 3
  for a, b in zip(before_params, _host(params)):
    np.testing.assert_array_equal(a, b)


def test_coding_step_with_the_accuracy_signal_decodes_the_heldout_set_per_group():
  """reward.soar_signal=accuracy through a coding step: the held-out problems (outside the reference
  set) are posed with the math evaluation's prompt and answered greedily once before and once per group."""
  from compassplay_jax.domains.coding.reference_set import reference_problems
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  from compassplay_jax.selfplay.run import build_model
  from compassplay_jax.verifiers.sandbox import SandboxPool
  config = _config("coding:tiny", **{"reward.name": "soar_utility", "reward.soar_signal": "accuracy",
                                     "reward.soar_group_size": 2, "reward.soar_inner_steps": 2,
                                     "reward.soar_inner_batch": 1, "reward.soar_inner_lr": 0.05, "reward.soar_inner_optimizer": "sgd",
                                     "reward.soar_answer_tokens": 4, "eval.num_workers": 1})
  config_base.check_config(config)
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  pool = SandboxPool(num_workers=1)
  setting = None
  try:
    setting = CodingSelfPlay(config, tokenizer, pool, sampler=ScriptedCoder(tokenizer))
    answers = setting.soar_answers
    assert setting.soar_heldout is None and len(answers.prompts) == config.reward.reference_size
    reference = [p.problem for p in reference_problems(config.reward)]
    assert not any(r in q for r in reference for q in answers.prompts)  # none of the reference problems
    engine = one_device_engine(graphdef, params, config)
    metrics = step_lib.run_step(setting, engine, params, None, 1, jax.random.key(0), update=None).metrics
  finally:
    if setting is not None:
      setting.close()
    else:
      pool.close()
  assert metrics["soar/signal"] == "accuracy" and metrics["soar/groups"] == 2
  assert metrics["soar/heldout_answers"] == len(answers.prompts) * 3 and metrics["soar/inner_sgd_steps"] == 4
  assert metrics["time/soar"] >= metrics["soar/seconds"] > 0
  valid = [r for r in metrics["candidates"] if r["valid"]]
  want = [metrics["soar/group_improvements"][i // 2] for i in range(len(valid))]
  np.testing.assert_allclose([r["reward"] for r in valid], want, atol=1e-7)


# ---- start-up checks ----------------------------------------------------------------------------

def test_lean_refuses_soar_with_one_line_before_anything_starts():
  from compassplay_jax.settings.lean import config as lean
  config = _config("lean:tiny", **_lean_overrides(), **{"reward.name": "soar_utility"})
  with pytest.raises(ConfigError) as e:
    lean.validate(config)
  line = user_error_line(e.value)
  assert "\n" not in line and "reward.name=soar_utility is not supported by the lean setting" in line


@pytest.mark.parametrize("field,value", [("soar_group_size", 0), ("soar_inner_steps", 0), ("soar_inner_lr", 0.0),
                                         ("soar_heldout_size", -1)])
def test_bad_soar_fields_are_refused_at_start_up(field, value):
  config = _config("coding:tiny", **{"reward.name": "soar_utility", f"reward.{field}": value})
  with pytest.raises(ConfigError, match=f"config.reward.{field}"):
    config_base.check_config(config)


@pytest.mark.parametrize("signal", ["accuracy", "nll"])
def test_heldout_set_never_holds_a_reference_problem(signal):
  """math_mini has 12 problems; with 4 drawn as the reference set, the held-out set is drawn from the
  other 8 (all of them for size 8; size 9 is a one-line error), by reward.reference_seed."""
  from compassplay_jax.domains.coding.reference_set import load_reference_set, reference_problems
  base = {"reward.name": "soar_utility", "reward.soar_signal": signal, "reward.reference_size": 4}
  config = _config("coding:tiny", **base, **{"reward.soar_heldout_size": 8})
  every = {p.problem for p in load_reference_set("builtin:math_mini", 12, 0)}
  reference = {p.problem for p in reference_problems(config.reward)}
  held = soar_measure.heldout_problems(config.reward)
  assert len(reference) == 4 and {p.problem for p in held} == every - reference
  assert all(p.answer and p.answer in p.solution for p in held)  # the last \boxed{} of the gold solution
  small = soar_measure.heldout_problems(_config("coding:tiny", **base).reward)  # size 0 = reference_size
  assert len(small) == 4 and not {p.problem for p in small} & reference
  other_seed = _config("coding:tiny", **base, **{"reward.reference_seed": 3}).reward
  assert not {p.problem for p in soar_measure.heldout_problems(other_seed)} & {
      p.problem for p in reference_problems(other_seed)}
  with pytest.raises(Exception) as e:
    soar_measure.heldout_problems(_config("coding:tiny", **base, **{"reward.soar_heldout_size": 9}).reward)
  line = user_error_line(e.value)
  assert "\n" not in line and "asked for 9 SOAR held-out problems" in line and "the file has 8" in line


@pytest.mark.parametrize("field,value,message", [
    ("soar_signal", "loss", "is not one of ('accuracy', 'nll')"), ("soar_inner_batch", -1, "is negative"),
    ("soar_answer_tokens", 0, "must be >= 1"),
    ("soar_inner_optimizer", "adamw", "is not one of ('sgd', 'adam')")])
def test_bad_new_soar_fields_are_refused_at_start_up(field, value, message):
  config = _config("coding:tiny", **{"reward.name": "soar_utility", f"reward.{field}": value})
  with pytest.raises(ConfigError, match=f"config.reward.{field}") as e:
    config_base.check_config(config)
  assert message in str(e.value)


def test_missing_heldout_file_is_refused_at_start_up():
  from compassplay_jax.settings.coding import config as coding
  config = _config("coding:tiny", **{"reward.name": "soar_utility", "reward.soar_heldout_path": "/nonexistent.jsonl"})
  with pytest.raises(Exception) as e:
    coding.validate(config)
  assert user_error_line(e.value) and "/nonexistent.jsonl" in str(e.value)


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q", "-p", "no:xdist", "-o", "addopts="]))
