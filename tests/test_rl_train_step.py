"""The jitted train step on a tiny random decoder: accumulation, aggregation, dtypes, safety."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl import losses, optim, train_step

MODEL = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
B, T = 4, 8


@pytest.fixture(scope="module")
def model():
  return nnx.split(init_decoder(MODEL, seed=0))


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  loss_mask = np.zeros((B, T), np.int32)
  for b, start in enumerate([3, 5, 2, 6]):  # unequal completion lengths per row
    loss_mask[b, start:] = 1
  attention_mask = np.ones((B, T), np.int32)
  attention_mask[1, :2] = 0  # a left-padded prompt
  return {"tokens": jnp.asarray(rng.integers(0, MODEL.vocab_size, (B, T)), jnp.int32),
          "attention_mask": jnp.asarray(attention_mask), "loss_mask": jnp.asarray(loss_mask),
          "advantages": jnp.asarray([1.0, -0.5, 0.25, -1.0], jnp.float32),
          "old_logprobs": jnp.asarray(-np.log(MODEL.vocab_size) + rng.uniform(-0.3, 0.3, (B, T)), jnp.float32)}


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _direct_grad(graphdef, params, batch, rows=slice(None)):
  """The gradient of the loss on batch[rows] in one pass, no train step involved."""
  def f(p, mb):
    logits = nnx.merge(graphdef, p)(mb["tokens"], attention_mask=mb["attention_mask"])
    return losses.policy_gradient_loss(logits, mb["tokens"], mb["loss_mask"], mb["advantages"], mb["old_logprobs"])[0]
  return jax.jit(jax.grad(f))(params, {k: v[rows] for k, v in batch.items()})


def _accumulated_grad(graphdef, params, batch, **cfg_kwargs):
  cfg = train_step.TrainConfig(grad_clip=None, **cfg_kwargs)
  # SGD at lr 1 (its schedule state carries the step count the train step reads).
  optimizer = optax.sgd(lambda count: 1.0)
  step = train_step.make_train_step(graphdef, cfg, optimizer=optimizer)
  p0 = _copy(params)
  new, _, metrics = step(_copy(params), optimizer.init(params), batch, jax.random.key(0))
  return jax.tree.map(lambda a, b: a - b, p0, new), metrics


def _assert_tree_close(a, b, **tol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def test_accumulated_gradient_equals_full_batch_gradient(model, batch):
  graphdef, params = model
  want = _direct_grad(graphdef, params, batch)
  # Two micro-batches with unequal token counts (8 and 9): token_mean must still be the global mean.
  got, metrics = _accumulated_grad(graphdef, params, batch, micro_batch_size=2)
  _assert_tree_close(got, want, rtol=2e-4, atol=1e-7)
  assert float(metrics["num_tokens"]) == float(batch["loss_mask"].sum())
  assert int(metrics["skipped"]) == 0


@pytest.mark.parametrize("layout,rows", [("contiguous", ([0, 1], [2, 3])), ("strided", ([0, 2], [1, 3]))])
def test_microbatch_token_mean_weights_each_micro_batch_equally(model, batch, layout, rows):
  graphdef, params = model
  got, _ = _accumulated_grad(graphdef, params, batch, micro_batch_size=2, aggregation="microbatch_token_mean",
                             micro_batch_layout=layout)
  g0, g1 = (_direct_grad(graphdef, params, batch, np.array(r)) for r in rows)
  _assert_tree_close(got, jax.tree.map(lambda a, b: (a + b) / 2, g0, g1), rtol=2e-4, atol=1e-7)


BASE = train_step.TrainConfig(learning_rate=1e-3, micro_batch_size=2, entropy_coef=1e-3)


@pytest.fixture(scope="module")
def fp32_step(model):
  return train_step.make_train_step(model[0], BASE)


def test_adamw_step_bf16_remat_and_ratio_one(model, batch, fp32_step):
  graphdef, params = model
  base = BASE
  logprob_fn = train_step.make_logprob_fn(graphdef, micro_batch_size=2)
  old = logprob_fn(params, batch["tokens"], batch["attention_mask"])
  logits = nnx.merge(graphdef, params)(batch["tokens"], attention_mask=batch["attention_mask"])
  np.testing.assert_allclose(old, losses.token_logprobs(logits, batch["tokens"]), rtol=1e-5, atol=1e-6)
  on_policy = {**batch, "old_logprobs": old}
  results = {}
  for name, cfg in {"fp32": base, "bf16_remat": base.replace(compute_dtype="bfloat16", remat=True)}.items():
    p, opt = train_step.init_train_state(_copy(params), cfg)
    step = fp32_step if cfg is base else train_step.make_train_step(graphdef, cfg)
    p, opt, metrics = step(p, opt, on_policy, jax.random.key(0))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(p))  # fp32 master weights
    assert int(optim.optimizer_step(opt)) == 1
    results[name] = (p, metrics)
  m = results["fp32"][1]
  np.testing.assert_allclose(float(m["ratio_mean"]), 1.0, atol=1e-5)
  assert float(m["clip_frac"]) == 0.0
  np.testing.assert_allclose(float(m["learning_rate"]), 1e-3, rtol=1e-6)
  # bf16 compute moves the same parameters nearly the same way (Adam's first step is ~lr·sign(g)).
  _assert_tree_close(results["bf16_remat"][0], results["fp32"][0], atol=2e-3)


def test_non_finite_step_is_skipped(model, batch, fp32_step):
  _, params = model
  p, opt = train_step.init_train_state(_copy(params), BASE)
  before = _copy(p)
  p, opt, metrics = fp32_step(p, opt, {**batch, "advantages": batch["advantages"].at[0].set(jnp.nan)}, jax.random.key(0))
  assert float(metrics["skipped"]) == 1.0
  assert int(optim.optimizer_step(opt)) == 0
  _assert_tree_close(p, before, rtol=0, atol=0)


def test_bad_micro_batch_size(model, batch):
  graphdef, params = model
  cfg = train_step.TrainConfig(micro_batch_size=3)
  p, opt = train_step.init_train_state(_copy(params), cfg)
  with pytest.raises(ValueError, match="not a multiple of micro_batch_size 3"):
    train_step.make_train_step(graphdef, cfg)(p, opt, batch, jax.random.key(0))
  with pytest.raises(ValueError, match="aggregation"):
    train_step.TrainConfig(aggregation="sum")


def test_schedules():
  warm_cos = optim.make_schedule(1.0, "cosine", warmup_steps=10, total_steps=110, end_lr_ratio=0.1)
  np.testing.assert_allclose([warm_cos(0), warm_cos(5), warm_cos(10), warm_cos(60), warm_cos(110)],
                             [0.0, 0.5, 1.0, 0.55, 0.1], rtol=1e-5, atol=1e-6)
  lin = optim.make_schedule(2.0, "linear", total_steps=4)
  np.testing.assert_allclose([lin(0), lin(2), lin(4)], [2.0, 1.0, 0.0], atol=1e-6)
  assert float(optim.make_schedule(3e-6)(1000)) == pytest.approx(3e-6)
  with pytest.raises(ValueError, match="needs total_steps"):
    optim.make_schedule(1.0, "cosine")
