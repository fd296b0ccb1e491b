"""train.ppo_mini_batches (issue 26 item 1): a coding step's rows as K PPO mini-batches, one AdamW step each.

The update through the engine against a naive reference: unpadded rows one at a time, per-token
ratio exp(logπ_new − logπ_old) with logπ_new at the params the previous mini-batch's AdamW step left,
PPO-clip at 1 ± ε, a hand-written AdamW in numpy. With 3 mini-batches the first sees ratio 1 (the
old log-probs are the initial policy's), the second and third see ratios != 1 and the clip binds on
the tokens the formula says; the per-step metrics and the final params match the reference.
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.runtime import config_base
from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.config import ConfigError, ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl import train_step as train_lib
from compassplay_jax.selfplay import step
from compassplay_jax.settings.coding.setting import ppo_mini_batches
from compassplay_jax.selfplay.rollout import Row
from tests.engines import one_device_engine

MODEL = ModelConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
PAD = 0
TYPES = ("abduction", "deduction", "induction")
EPS = 0.2
LR, B1, B2, ADAM_EPS, WD, CLIP = 0.05, 0.9, 0.999, 1e-6, 0.01, 1.0  # eps 1e-6: see the params check


# ---- the naive reference -----------------------------------------------------------------------

def _completion_logps(graphdef, params, prompt, completion):
  """log π(completion token | everything before it), one unpadded row, full vocabulary."""
  ids = jnp.concatenate([jnp.asarray(prompt), jnp.asarray(completion)])[None]
  logits = nnx.merge(graphdef, params)(ids, attention_mask=jnp.ones_like(ids)).astype(jnp.float32)[0, :-1]
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[len(prompt) - 1:, 0]


def _row_fn(graphdef):
  """jitted (params, prompt, completion, old logprobs, advantage, mask, eps) -> ((Σ_t objective, per-row
  sums), gradient of Σ_t objective) for one unpadded row: ρ_t = exp(logπ_t − logπ_old_t), objective
  max(−Aρ, −A·clip(ρ, 1 − eps, 1 + eps)); the clip binds where the clipped term is the larger. eps is
  an argument so that one compiled function serves the unclipped control too."""
  def objective(params, prompt, completion, old, advantage, mask, eps):
    ratio = jnp.exp(_completion_logps(graphdef, params, prompt, completion) - old)
    unclipped, clipped = -advantage * ratio, -advantage * jnp.clip(ratio, 1 - eps, 1 + eps)
    sums = {"ratio": jnp.sum(mask * jax.lax.stop_gradient(ratio)), "bound": jnp.sum(mask * (clipped > unclipped)),
            "tokens": jnp.sum(mask)}
    return jnp.sum(mask * jnp.maximum(unclipped, clipped)), sums
  return jax.jit(jax.value_and_grad(objective, has_aux=True))


def _mini_batch(row_fn, params, rows, eps):
  """(gradient of the token-mean objective, metrics) of one mini-batch, row by row."""
  grads, sums = [], {"ratio": 0.0, "bound": 0.0, "tokens": 0.0}
  for r in rows:
    mask = np.ones(len(r.completion_ids), np.float32) if r.completion_mask is None else r.completion_mask
    (_, row_sums), g = row_fn(params, r.prompt_ids, r.completion_ids, r.logprobs, np.float32(r.advantage), mask,
                              np.float32(eps))
    grads.append([np.asarray(x, np.float64) for x in jax.tree.leaves(g)])
    sums = {k: sums[k] + float(row_sums[k]) for k in sums}
  grad = [sum(gs) / sums["tokens"] for gs in zip(*grads)]
  return grad, {"ratio_mean": sums["ratio"] / sums["tokens"], "clip_frac": sums["bound"] / sums["tokens"],
                "bound_tokens": int(sums["bound"])}


def _naive_updates(row_fn, params, mini_batches, eps):
  """One hand-written AdamW step (global-norm clip, decoupled decay) per mini-batch, in order."""
  leaves, treedef = jax.tree.flatten(jax.tree.map(lambda x: np.asarray(x, np.float64), params))
  m = [np.zeros_like(x) for x in leaves]
  v = [np.zeros_like(x) for x in leaves]
  per_step = []
  for t, rows in enumerate(mini_batches, start=1):
    current = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in leaves])
    g, metrics = _mini_batch(row_fn, current, rows, eps)
    per_step.append(metrics)
    norm = np.sqrt(sum(np.sum(x * x) for x in g))
    g = [x * min(1.0, CLIP / norm) for x in g]
    for i, gi in enumerate(g):
      m[i] = B1 * m[i] + (1 - B1) * gi
      v[i] = B2 * v[i] + (1 - B2) * gi * gi
      m_hat, v_hat = m[i] / (1 - B1 ** t), v[i] / (1 - B2 ** t)
      leaves[i] = leaves[i] - LR * (m_hat / (np.sqrt(v_hat) + ADAM_EPS) + WD * leaves[i])
  return leaves, per_step


# ---- the rows ----------------------------------------------------------------------------------

def _rows(graphdef, params, seed=0):
  """9 rows in AZR's order (type by type, proposer rows first), old log-probs = the initial policy's."""
  rng = np.random.default_rng(seed)
  logps = jax.jit(lambda p, a, b: _completion_logps(graphdef, p, a, b))
  layout = [(t, role) for t in TYPES for role in ("proposer", "solver")]
  rows = []
  for i in range(9):
    t, role = layout[(i * 6) // 9]
    p_len, c_len = ((5, 9), (8, 6))[i % 2]  # two shapes: the reference compiles twice
    prompt = rng.integers(1, MODEL.vocab_size, p_len).astype(np.int32)
    completion = rng.integers(1, MODEL.vocab_size, c_len).astype(np.int32)
    mask = np.ones(c_len, np.float32) if i != 4 else (np.arange(c_len) % 3 != 1).astype(np.float32)
    old = np.asarray(logps(params, prompt, completion), np.float32)
    advantage = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5))
    rows.append(Row(prompt, completion, old, 0.0, t, role, completion_mask=mask, advantage=advantage))
  return rows


def test_three_mini_batches_leave_ratio_one_and_the_clip_binds_where_the_formula_says():
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  rows = _rows(graphdef, params)
  chunks = ppo_mini_batches(rows, TYPES, 3)
  assert [len(c) for c in chunks] == [3, 3, 3] and sum(chunks, []) == rows  # already in AZR's order

  tcfg = train_lib.TrainConfig(learning_rate=LR, b1=B1, b2=B2, adam_eps=ADAM_EPS, weight_decay=WD, grad_clip=CLIP,
                               micro_batch_size=2, clip_eps_low=EPS, clip_eps_high=EPS)
  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=tcfg))
  p, o = engine.init_train_state(jax.tree.map(jnp.copy, params))
  got_p, _, metrics = step.update_params(engine, p, o, chunks, jax.random.key(0), step.UpdateOptions(PAD, 256))

  row_fn, mini_batches = _row_fn(graphdef), [rows[0:3], rows[3:6], rows[6:9]]
  want_leaves, want = _naive_updates(row_fn, params, mini_batches, EPS)
  assert metrics["train/optimizer_steps"] == 3 and metrics["rows"] == 9
  # The first mini-batch is on-policy; the next two see the params earlier AdamW steps moved.
  assert abs(want[0]["ratio_mean"] - 1) < 1e-5 and want[0]["bound_tokens"] == 0
  for k in (1, 2):
    assert abs(want[k]["ratio_mean"] - 1) > 0.02, want
    assert want[k]["bound_tokens"] >= 2, want
  np.testing.assert_allclose(metrics["train/per_step/ratio_mean"], [w["ratio_mean"] for w in want], rtol=1e-4)
  np.testing.assert_allclose(metrics["train/per_step/clip_frac"], [w["clip_frac"] for w in want], atol=1e-6)
  # The params after the three steps: within 1e-4 (measured 3e-5; Adam's m/(√v + eps) amplifies float
  # noise where a gradient is ~0, hence eps 1e-6: at 1e-8 one entry in 4000 was 1.5e-4 off); without the
  # clip (same rows, ε = 1e6) they land 0.15 away.
  for a, b in zip(jax.tree.leaves(got_p), want_leaves):
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-4)
  unclipped, _ = _naive_updates(row_fn, params, mini_batches, 1e6)
  gap = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(jax.tree.leaves(got_p), unclipped))
  assert gap > 1e-2, gap


def test_ppo_mini_batches_cuts_rows_in_azr_order_into_contiguous_chunks():
  rows = [Row(np.int32([i]), np.int32([1]), np.float32([0]), 0.0, t, role)
          for i, (t, role) in enumerate([("deduction", "solver"), ("abduction", "proposer"), ("induction", "proposer"),
                                         ("abduction", "solver"), ("deduction", "proposer"), ("abduction", "proposer"),
                                         ("induction", "solver")])]
  ids = lambda chunks: [[int(r.prompt_ids[0]) for r in c] for c in chunks]
  # AZR's concatenation: gen/pred of code_i (abduction), code_o (deduction), code_f (induction).
  assert ids(ppo_mini_batches(rows, TYPES, 3)) == [[1, 5], [3, 4, 0], [2, 6]]
  assert ids(ppo_mini_batches(rows, TYPES, 7)) == [[1], [5], [3], [4], [0], [2], [6]]
  assert ids(ppo_mini_batches(rows, TYPES, 20)) == [[1], [5], [3], [4], [0], [2], [6]]  # never an empty step
  assert ids(ppo_mini_batches(rows, TYPES, 1)) == [[0, 1, 2, 3, 4, 5, 6]]  # one step: rows as they are
  with pytest.raises(ValueError, match="count must be >= 1"):
    ppo_mini_batches(rows, TYPES, 0)


def test_paper_config_makes_one_update_and_bad_counts_are_refused():
  from tests.test_selfplay import _config
  assert _config("coding").train.ppo_mini_batches == 1  # AZR: mini-batch = the whole 384-row batch
  with pytest.raises(ConfigError, match="config.train.ppo_mini_batches"):
    config_base.check_config(_config("coding:tiny", **{"train.ppo_mini_batches": 0}))


def test_coding_step_makes_one_optimizer_step_per_mini_batch():
  """End to end: a tiny coding step with train.ppo_mini_batches=3 trains all its rows in 3 AdamW steps."""
  from compassplay_jax.settings.coding.setting import CodingSelfPlay
  from compassplay_jax.selfplay.run import build_model
  from compassplay_jax.verifiers.sandbox import SandboxPool
  from tests.test_selfplay import _config
  from tests.test_soar import ScriptedCoder
  config = _config("coding:tiny", **{"reward.name": "difficulty", "train.ppo_mini_batches": 3,
                                     "train.micro_batch_tokens": 0, "train.micro_batch_size": 2})
  config_base.check_config(config)
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  pool = SandboxPool(num_workers=1)
  try:
    setting = CodingSelfPlay(config, tokenizer, pool, sampler=ScriptedCoder(tokenizer))
    engine = one_device_engine(graphdef, params, config)
    p, o = engine.init_train_state(params)
    result = step.run_step(setting, engine, p, o, 1, jax.random.key(0),
                           update=step.UpdateOptions.from_config(config, tokenizer.pad_token_id))
  finally:
    pool.close()
  m = result.metrics
  assert m["train/optimizer_steps"] == 3 and m["rows"] == len(result.rows) >= 3
  assert len(m["train/per_step/ratio_mean"]) == 3 and len(m["train/per_step/clip_frac"]) == 3


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q", "-p", "no:xdist", "-o", "addopts="]))
