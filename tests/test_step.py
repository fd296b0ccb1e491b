"""selfplay/step.py: the parts of a self-play step both settings share, against independent oracles."""
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rewards.proposer_rewards import AZR_CODE
from compassplay_jax.rl import train_step as train_lib
from compassplay_jax.rl.advantages import trr_plus_plus
from compassplay_jax.selfplay import step
from compassplay_jax.selfplay.rollout import Row

MODEL = ModelConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
PAD = 0


def _rows(seed=0, lengths=((40, 20), (45, 70), (10, 3), (12, 5), (9, 30), (50, 2), (11, 4))):
  rng = np.random.default_rng(seed)
  return [Row(rng.integers(1, MODEL.vocab_size, p), rng.integers(1, MODEL.vocab_size, c),
              -np.log(MODEL.vocab_size) + rng.uniform(-0.2, 0.2, c).astype(np.float32), float(rng.normal()),
              "deduction" if i % 2 else "abduction", "proposer" if p > 30 else "solver",
              completion_mask=None if i != 1 else (np.arange(c) % 3 != 1).astype(np.float32))
          for i, (p, c) in enumerate(lengths)]


def test_eligible_is_valid_formatted_in_band_with_a_reference():
  rates = [0.0, 0.5, 1.0, 0.25, 0.75, 0.5]
  valid = [True, True, True, False, True, True]
  formatted = [True, True, True, True, False, True]
  want = [v and f and 0 < s < 1 for s, v, f in zip(rates, valid, formatted)]
  np.testing.assert_array_equal(step.eligible(rates, valid, formatted, config=AZR_CODE), want)
  has_ref = [True] * 5 + [False]
  np.testing.assert_array_equal(step.eligible(rates, valid, formatted, has_ref, config=AZR_CODE),
                                np.array(want) & has_ref)


def test_advantages_are_trr_plus_plus_over_trained_tokens_unless_rows_carry_their_own():
  rows = step.with_advantages(_rows(), None)
  batch = step.padded_batch(rows, PAD, micro_batch_size=4)
  assert batch["tokens"].shape[0] == 8  # 7 rows padded to a multiple of 4
  counts = [float(np.sum(r.completion_mask if r.completion_mask is not None else np.ones(len(r.completion_ids))))
            for r in rows]
  want = trr_plus_plus([r.reward for r in rows], [r.group for r in rows], [r.role for r in rows], counts)
  np.testing.assert_allclose(batch["advantages"][:7], want, rtol=1e-6)
  assert batch["advantages"][7] == 0.0
  own = [Row(r.prompt_ids, r.completion_ids, r.logprobs, r.reward, r.group, r.role, advantage=0.1 * i)
         for i, r in enumerate(rows)]
  np.testing.assert_allclose(step.padded_batch(step.with_advantages(own, None), PAD, 1)["advantages"],
                             0.1 * np.arange(7), rtol=1e-6)
  with pytest.raises(ValueError, match="without advantages"):
    step.padded_batch(_rows(), PAD, 1)
  # Packed by length: the same advantage per row as in the padded batch.
  for mb in step.length_buckets(rows, PAD, token_budget=128):
    for r in range(mb["tokens"].shape[0]):
      if mb["attention_mask"][r].any():
        real = mb["tokens"][r][mb["attention_mask"][r] == 1].tolist()
        i = next(i for i, row in enumerate(rows) if list(row.prompt_ids) + list(row.completion_ids) == real)
        np.testing.assert_allclose(mb["advantages"][r], want[i], rtol=1e-6)


def test_advantage_token_weights_are_the_tokens_the_update_trains_after_truncation():
  """with_advantages weighs each row by its completion tokens left after truncation to max_len: the
  same count as the packed batch's loss mask (the oracle), not the untruncated length."""
  rows, max_len = _rows(3), 40
  packed = step.padded_batch(step.with_advantages(rows, max_len), PAD, 1, max_len=max_len)
  counts = packed["loss_mask"][:len(rows)].sum(-1)
  assert counts.tolist() != [float(np.sum(step._mask(r))) for r in rows]  # truncation changed some rows
  want = trr_plus_plus([r.reward for r in rows], [r.group for r in rows], [r.role for r in rows], counts)
  np.testing.assert_allclose([r.advantage for r in step.with_advantages(rows, max_len)], want, rtol=1e-6)


def test_phase_times_add_up_and_announce_labels():
  said = []
  times = step.PhaseTimes(("generate", "reward"), progress=said.append)
  with times("generate", "generate: proposals"):
    time.sleep(0.02)
  with times("generate", "generate: solutions"):
    time.sleep(0.02)
  assert said == ["generate: proposals", "generate: solutions"]
  assert times.seconds["generate"] >= 0.04 and times.seconds["reward"] == 0.0
  assert set(times.metrics()) == {"time/generate", "time/reward"}


def test_update_through_the_engine_equals_the_library_train_step():
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  rows = step.with_advantages(_rows(1), 256)
  tcfg = train_lib.TrainConfig(learning_rate=1e-3, micro_batch_size=4)
  batch = step.padded_batch(rows, PAD, micro_batch_size=4, max_len=256)
  p0, o0 = train_lib.init_train_state(jax.tree.map(jnp.copy, params), tcfg)
  want_p, _, want_m = train_lib.make_train_step(graphdef, tcfg)(p0, o0, batch, jax.random.key(0))

  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=tcfg))
  p, o = engine.init_train_state(jax.tree.map(jnp.copy, params))
  got_p, _, metrics = step.update_params(engine, p, o, [rows], jax.random.key(0), step.UpdateOptions(PAD, 256))
  for a, b in zip(jax.tree.leaves(got_p), jax.tree.leaves(want_p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["train/loss"], float(want_m["loss"]), rtol=1e-5)
  assert metrics["rows"] == 7 and metrics["train/optimizer_steps"] == 1
  assert metrics["tokens/trained"] == int(batch["loss_mask"].sum())


def test_kl_term_uses_the_frozen_reference_policy_log_probs():
  """train.kl_coef > 0: the engine computes the reference policy's log-probs for the batch; the update
  equals the library step given those log-probs from make_logprob_fn (an independent path)."""
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  ref = jax.tree.map(lambda x: x * 3.0, params)  # a reference policy far from the current one
  rows = step.with_advantages(_rows(2), 256)
  tcfg = train_lib.TrainConfig(learning_rate=1e-3, micro_batch_size=4, kl_coef=0.5)
  batch = step.padded_batch(rows, PAD, micro_batch_size=4, max_len=256)
  full = train_lib.make_logprob_fn(graphdef)(ref, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))
  batch["ref_logprobs"] = np.asarray(full)[:, -batch["loss_mask"].shape[1]:]
  p0, o0 = train_lib.init_train_state(jax.tree.map(jnp.copy, params), tcfg)
  want_p, _, want_m = train_lib.make_train_step(graphdef, tcfg)(p0, o0, batch, jax.random.key(0))
  assert float(want_m["kl"]) > 1e-4

  engine = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=tcfg))
  p, o = engine.init_train_state(jax.tree.map(jnp.copy, params))
  got_p, _, metrics = step.update_params(engine, p, o, [rows], jax.random.key(0), step.UpdateOptions(PAD, 256),
                                         ref_params=engine.place_params(ref))
  np.testing.assert_allclose(metrics["train/kl"], float(want_m["kl"]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got_p), jax.tree.leaves(want_p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  # Packed by length, the same reference log-probs enter each micro-batch.
  p, o = engine.init_train_state(jax.tree.map(jnp.copy, params))
  _, _, bucketed = step.update_params(engine, p, o, [rows], jax.random.key(0), step.UpdateOptions(PAD, 256, 256),
                                      ref_params=engine.place_params(ref))
  np.testing.assert_allclose(bucketed["train/kl"], float(want_m["kl"]), rtol=1e-4)


def test_recomputed_old_logprobs_put_the_first_ratio_at_exactly_one_in_bf16():
  """train.recompute_logprobs: in bf16 the sampler's log-probs (here: the fp32 forward's, as a KV-cache
  decode would differ) put the first PPO ratio off 1; recomputed, the first chunk's ratio is exactly 1
  and the second chunk's old log-probs are the train forward's at the params before any step."""
  cfg = MODEL.replace(dtype="bfloat16")
  graphdef, params = nnx.split(init_decoder(cfg, seed=0))
  rows = _rows(4, lengths=((20, 12), (18, 9), (25, 14), (16, 11)) * 2)
  fp32_graphdef, _ = nnx.split(init_decoder(MODEL, seed=0))
  batch = step.padded_batch(step.with_advantages(rows, 64), PAD, 8, 64)
  sampler = np.asarray(train_lib.make_logprob_fn(fp32_graphdef)(params, batch["tokens"], batch["attention_mask"]))
  window = batch["loss_mask"].shape[1]
  rows = [dataclasses.replace(r, logprobs=sampler[i, -window:][batch["loss_mask"][i] > 0])
          for i, r in enumerate(step.with_advantages(rows, 64))]
  chunks = [rows[:4], rows[4:]]
  tcfg = train_lib.TrainConfig(learning_rate=1e-2, micro_batch_size=4)

  def run(recompute, lr=1e-2, token_budget=0):
    eng = Engine.build(graphdef, params, sh.make_mesh(None), EngineSettings(train=tcfg.replace(learning_rate=lr)))
    p, o = eng.init_train_state(jax.tree.map(jnp.copy, params))
    return step.update_params(eng, p, o, chunks, jax.random.key(0),
                              step.UpdateOptions(PAD, 64, token_budget, recompute))[2]

  off, on = run(False), run(True)
  assert off["train/per_step/approx_kl"][0] > 1e-9  # the sampler's log-probs are off the bf16 forward
  assert on["train/per_step/ratio_mean"][0] == 1.0 and on["train/per_step/approx_kl"][0] == 0.0
  assert on["train/per_step/clip_frac"][0] == 0.0
  # Rows packed by length (the paper configs: config_base.pack_update_rows), 2 rows of (32, 32) a pass.
  packed_off, packed_on = run(False, token_budget=128), run(True, token_budget=128)
  assert packed_off["train/per_step/approx_kl"][0] > 1e-9
  assert packed_on["train/per_step/ratio_mean"][0] == 1.0 and packed_on["train/per_step/approx_kl"][0] == 0.0
  # With a zero learning rate the params never move: every chunk's recomputed ratio is 1 (to the bf16
  # forward's reproducibility), while the sampler's stay off.
  still = run(True, lr=0.0)
  np.testing.assert_allclose(still["train/per_step/ratio_mean"], 1.0, atol=1e-6)
  assert max(still["train/per_step/approx_kl"]) < 1e-10 < min(run(False, lr=0.0)["train/per_step/approx_kl"])
