"""Rows packed by real length (pack_by_length + make_bucketed_train_step) give the same update as one
padded batch through make_train_step, whose gradient tests/test_rl_train_step.py checks by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl import train_step
from compassplay_jax.selfplay import sequences
from compassplay_jax.selfplay.rollout import Row
from compassplay_jax.selfplay.step import length_buckets as rows_to_micro_batches
from compassplay_jax.selfplay.step import padded_batch as rows_to_batch
from compassplay_jax.selfplay.step import with_advantages

MODEL = ModelConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
PAD = 0


SMALL_BUCKETS = (16, 32, 64, 128)


def _rows(seed=0, lengths=((40, 20), (45, 70), (10, 3), (12, 5), (9, 30), (50, 2), (11, 4))):
  rng = np.random.default_rng(seed)
  rows = []
  # Two length regimes (long "proposer" prompts, short "solver" ones) so several buckets appear.
  for i, (p_len, c_len) in enumerate(lengths):
    mask = None if i != 1 else (np.arange(c_len) % 3 != 1).astype(np.float32)  # a scaffolded row
    rows.append(Row(rng.integers(1, MODEL.vocab_size, p_len), rng.integers(1, MODEL.vocab_size, c_len),
                    -np.log(MODEL.vocab_size) + rng.uniform(-0.2, 0.2, c_len).astype(np.float32),
                    float(rng.normal()), "deduction" if i % 2 else "abduction", "proposer" if p_len > 30 else "solver",
                    completion_mask=mask))
  return rows


def test_pack_by_length_places_every_row_once_in_few_shapes():
  rows = _rows()
  masks = [np.ones(len(r.completion_ids)) if r.completion_mask is None else r.completion_mask for r in rows]
  packed = sequences.pack_by_length([r.prompt_ids for r in rows], [r.completion_ids for r in rows], PAD,
                                    [r.logprobs for r in rows], masks, token_budget=128, buckets=SMALL_BUCKETS)
  seen = sorted(i for idx, _ in packed for i in idx)
  assert seen == list(range(len(rows)))
  window_before = None
  for n, (idx, batch) in enumerate(packed):
    rows_in_mb, length = batch.tokens.shape
    window = batch.loss_mask.shape[1] - 1  # completion columns
    assert rows_in_mb & (rows_in_mb - 1) == 0  # a power of two
    assert rows_in_mb == 1 or rows_in_mb * length <= 128
    assert window in SMALL_BUCKETS and length - window in SMALL_BUCKETS  # a bucket pair
    assert window_before is None or window <= window_before  # longest first
    window_before = window
    for r, i in enumerate(idx):
      p, c = list(rows[i].prompt_ids), list(rows[i].completion_ids)
      assert batch.tokens[r][batch.attention_mask[r] == 1].tolist() == p + c
      np.testing.assert_array_equal(batch.loss_mask[r][batch.loss_mask[r] != 0], masks[i][masks[i] != 0])
      assert sequences.bucket(len(c), SMALL_BUCKETS) <= window
      assert sequences.bucket(len(p), SMALL_BUCKETS) <= length - window
    assert not batch.attention_mask[len(idx):].any()  # padding rows are empty
    if n < len(packed) - 1:
      assert len(idx) == rows_in_mb  # only the last micro-batch is short of rows
  # Longest first; (10, 3), (12, 5), (11, 4) share one micro-batch of 4 rows (3 real: the last one).
  assert [b.tokens.shape for _, b in packed] == [(1, 192), (1, 96), (1, 48), (1, 80), (4, 32)]


def test_bad_token_budget_is_an_error():
  with pytest.raises(ValueError, match="token_budget"):
    sequences.pack_by_length([[1]], [[2]], PAD, [[0.0]], [[1.0]], token_budget=0)


@pytest.mark.parametrize("budget", [512, 1024])
def test_bucketed_update_equals_one_padded_batch(budget):
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  # On TRAIN_BUCKETS: (192, 32), (192, 192) and (32, 32) bucket pairs (prompt, completion).
  rows = with_advantages(_rows(1, lengths=((140, 20), (150, 130), (10, 3), (12, 5), (9, 30), (160, 2), (11, 4))), None)
  cfg = train_step.TrainConfig(grad_clip=None, micro_batch_size=None, entropy_coef=0.01)
  sgd = optax.sgd(lambda count: 1.0)  # the update is minus the accumulated gradient

  def delta(step, batch):
    new, _, metrics = step(jax.tree.map(jnp.copy, params), sgd.init(params), batch, jax.random.key(0))
    return jax.tree.map(lambda a, b: a - b, params, new), metrics

  want, want_m = delta(train_step.make_train_step(graphdef, cfg, optimizer=sgd, donate=False),
                       rows_to_batch(rows, PAD, micro_batch_size=1))
  micro = rows_to_micro_batches(rows, PAD, token_budget=budget)
  got, got_m = delta(train_step.make_bucketed_train_step(graphdef, cfg, optimizer=sgd), micro)
  # Columns: prompt bucket + completion bucket (the window's extra column is the last prompt token's).
  # At 1024 tokens short rows ride in longer rows' micro-batches: (140, 20) beside (150, 130), the
  # 10-12-token prompts beside (160, 2).
  assert [mb["tokens"].shape for mb in micro] == ([(1, 384), (2, 224), (4, 64)] if budget == 512 else
                                                  [(2, 384), (4, 224), (1, 64)])
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=3e-4, atol=1e-7)
  for name in ("loss", "pg_loss", "entropy", "num_tokens"):
    np.testing.assert_allclose(float(got_m[name]), float(want_m[name]), rtol=1e-4, atol=1e-7)
