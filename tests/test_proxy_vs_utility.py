"""The pure parts of experiments/proxy_vs_utility.py (issue 26 item 7).

reports/proxy.py's Spearman rho and bootstrap interval against a naive computation (ranks counted pair
by pair, Pearson by explicit sums, the percentile interpolated by hand; scipy too where installed), and
the experiment's loss-drop measurement (one SGD step per candidate through the engine) against a naive
jax.grad SGD step on a hand-written cross-entropy, on a tiny random model.
"""
import importlib.util
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.config import ModelConfig
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.reports import proxy
from compassplay_jax.selfplay.sequences import pack

REPO = pathlib.Path(__file__).resolve().parents[1]


def _script():
  spec = importlib.util.spec_from_file_location("proxy_vs_utility", REPO / "experiments" / "proxy_vs_utility.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# ---- the oracle of the statistics: by hand -----------------------------------------------------

def _naive_ranks(x):
  """rank_i = 1 + #{j: x_j < x_i} + (#{j: x_j == x_i} - 1) / 2, pair by pair."""
  return [1 + sum(b < a for b in x) + (sum(b == a for b in x) - 1) / 2 for a in x]


def _naive_spearman(x, y):
  rx, ry = _naive_ranks(list(x)), _naive_ranks(list(y))
  n = len(rx)
  mx, my = sum(rx) / n, sum(ry) / n
  sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
  sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
  return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _naive_percentile(values, q):
  """numpy's default ('linear') percentile, by hand: position (n - 1) q / 100 between sorted values."""
  v = sorted(values)
  pos = (len(v) - 1) * q / 100
  lo = int(math.floor(pos))
  hi = min(lo + 1, len(v) - 1)
  return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _data(seed, n=23):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=n)
  y = 0.5 * x + rng.normal(size=n)
  x[3] = x[7]                                   # a tie in x
  ties = rng.integers(0, 4, size=n) / 4.0       # heavy ties, like 1 - solve rate
  return x, y, ties


def test_spearman_matches_the_naive_computation_with_ties():
  x, y, ties = _data(0)
  for a, b in ((x, y), (ties, y), (x, ties), (ties, ties[::-1])):
    np.testing.assert_allclose(proxy.spearman(a, b), _naive_spearman(a, b), atol=1e-12)
  np.testing.assert_allclose(proxy.average_ranks(ties), _naive_ranks(list(ties)), atol=0)
  assert proxy.spearman(x, -x) == pytest.approx(-1.0)
  assert proxy.spearman(x, np.exp(x)) == pytest.approx(1.0)   # any increasing map
  assert math.isnan(proxy.spearman(np.ones(5), np.arange(5.0)))  # a constant side: undefined


def test_spearman_matches_scipy_where_installed():
  stats = pytest.importorskip("scipy.stats")
  x, y, ties = _data(1)
  for a, b in ((x, y), (ties, y)):
    np.testing.assert_allclose(proxy.spearman(a, b), stats.spearmanr(a, b).statistic, atol=1e-12)


def test_bootstrap_interval_matches_a_naive_loop_over_the_same_resamples():
  x, y, ties = _data(2, n=12)
  indices = proxy.bootstrap_indices(12, 300, seed=5)
  assert indices.shape == (300, 12) and indices.min() >= 0 and indices.max() < 12
  np.testing.assert_array_equal(indices, proxy.bootstrap_indices(12, 300, seed=5))  # reproducible
  for a in (x, ties):
    rhos = [_naive_spearman(a[idx], y[idx]) for idx in indices]
    rhos = [r for r in rhos if not math.isnan(r)]
    low, high, used = proxy.bootstrap_interval(a, y, indices, level=0.9)
    assert used == len(rhos)
    np.testing.assert_allclose([low, high], [_naive_percentile(rhos, 5), _naive_percentile(rhos, 95)], atol=1e-12)
  # With heavy ties some resamples make a side constant: those are dropped and counted.
  const = np.asarray([0.0] * 10 + [1.0, 1.0])
  assert proxy.bootstrap_interval(const, y, indices)[2] < 300


def test_proxy_rows_and_first_order():
  x, y, ties = _data(3)
  drops = np.stack([y, 2 * y + 0.1 * x], axis=1)
  rows = proxy.proxy_rows(drops, [1e-4, 1e-3], {"a": x, "b": ties}, resamples=200, seed=1)
  assert [(r["lr"], r["proxy"]) for r in rows] == [(1e-4, "a"), (1e-4, "b"), (1e-3, "a"), (1e-3, "b")]
  for r, (j, values) in zip(rows, [(0, x), (0, ties), (1, x), (1, ties)]):
    assert r["n"] == 23 and r["rho"] == pytest.approx(_naive_spearman(values, drops[:, j]))
    assert r["low"] <= r["rho"] <= r["high"]
  ip = np.asarray([1.0, -2.0, 3.0, 0.5])
  f = proxy.first_order(1e-3 * ip * 0.5, ip, lr=1e-3)   # drops exactly half the prediction
  assert f["slope"] == pytest.approx(0.5) and f["median_ratio"] == pytest.approx(0.5)
  assert f["pearson"] == pytest.approx(1.0) and f["max_rel_error"] == pytest.approx(0.5)
  assert f["sign_agrees"] == 1.0 and f["positive"] == 0.75
  f = proxy.first_order(np.asarray([1e-3, -2e-3, -1e-3, -1e-3]), ip, lr=1e-3)  # predicted signs +, -, +, +
  assert f["sign_agrees"] == 0.5 and f["positive"] == 0.25
  with pytest.raises(ValueError, match="want"):
    proxy.proxy_rows(drops, [1e-4], {"a": x})


# ---- the loss-drop measurement against a naive SGD step ------------------------------------------

MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2)  # one layer: compile time is this test's cost
PAD = 0


def _seqs(seed, n, prompt=(6, 7), completion=(8, 9)):  # one row shape: few compilations
  rng = np.random.default_rng(seed)
  return [(rng.integers(1, 64, rng.integers(*prompt)).astype(np.int32),
           rng.integers(1, 64, rng.integers(*completion)).astype(np.int32)) for _ in range(n)]


def _row_loss(graphdef, params, prompt, completion):
  """Token-mean cross-entropy of the completion given the prompt, one unpadded row."""
  ids = jnp.concatenate([jnp.asarray(prompt), jnp.asarray(completion)])[None]
  logits = nnx.merge(graphdef, params)(ids, attention_mask=jnp.ones_like(ids)).astype(jnp.float32)[0, :-1]
  token_logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), ids[0, 1:, None], axis=-1)[:, 0]
  return -jnp.mean(token_logp[len(prompt) - 1:])


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def test_loss_drops_match_a_naive_sgd_step():
  graphdef, params = nnx.split(init_decoder(MODEL, seed=0))
  reference, candidates = _seqs(1, 3), _seqs(2, 2) + [_seqs(1, 1)[0]]  # the last: a reference row itself
  ref_loss = jax.jit(lambda q: sum(_row_loss(graphdef, q, p, c) for p, c in reference) / len(reference))
  g_ref = _flat(jax.grad(ref_loss)(params))
  row_grad = jax.jit(jax.grad(lambda q, p, c: _row_loss(graphdef, q, p, c)))
  sgd = jax.jit(lambda q, g, lr: jax.tree.map(lambda x, gx: x - lr * gx, q, g))
  engine = Engine.build(graphdef, params, sh.make_mesh((1, 1, 1), jax.devices()[:1]), EngineSettings(reward_method="direct"))
  packed = pack([p for p, _ in reference], [c for _, c in reference], PAD)
  lrs = [1e-3, 0.5]
  got = _script().loss_drops(engine, params, packed, candidates, lrs, pad_id=PAD, max_len=64)
  before = float(ref_loss(params))
  assert got["before"] == pytest.approx(before, abs=1e-5)
  assert got["ref_sq_norm"] == pytest.approx(float(g_ref @ g_ref), rel=1e-5)
  for i, (prompt, completion) in enumerate(candidates):
    grad = row_grad(params, prompt, completion)
    g = _flat(grad)
    np.testing.assert_allclose(got["inner_products"][i], g @ g_ref, rtol=1e-4)
    np.testing.assert_allclose(got["cosines"][i], g @ g_ref / np.linalg.norm(g) / np.linalg.norm(g_ref), atol=1e-5)
    for j, lr in enumerate(lrs):
      stepped = sgd(params, grad, lr)
      np.testing.assert_allclose(got["drops"][i, j], before - float(ref_loss(stepped)), atol=2e-5)
  # The premise in its own regime: at a small step the drop is lr·<g, g_ref> to first order.
  np.testing.assert_allclose(got["drops"][:, 0], lrs[0] * got["inner_products"], rtol=0.05)
  assert got["drops"][2, 1] > 0.05  # a step on a reference row lowers the reference loss
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))  # the params were read, not donated
