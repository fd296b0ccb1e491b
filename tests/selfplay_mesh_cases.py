"""One full coding step of the tiny config through the engine: 8 devices == 1 device.

Run by tests/test_eight_devices.py in its 8-device subprocess with the other 8-device cases (the device
count is fixed before jax is imported). For meshes (8,1,1), (1,8,1), (2,2,2), (1,2,4), one step (propose ->
verify -> reward -> advantages -> update, selfplay/step.py) gives the same cosines, rewards and
updated params as the same step on one device, and g_ref, the params after the update and the
sampler's KV cache carry the shardings the rules name.

The proposer and solver texts are scripted (a random tiny model writes no valid programs): the
sampler still runs the real engine sampler on every request, then answers with valid one-line
programs and solver answers that are right for even samples only, so every proposal is valid and in
band (solve rate 1/2) and its cosine pays it.

The last case runs the main command's entry on (2, 2, 2) with the tiny model's own texts and compares
its metrics with the same run on one device.
"""
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from compassplay_jax.infra import sharding as sh  # noqa: E402
from compassplay_jax.runtime.engine import Engine, EngineSettings  # noqa: E402
from compassplay_jax.runtime.model_setup import build_model  # noqa: E402
from compassplay_jax.selfplay import alignment  # noqa: E402
from compassplay_jax.selfplay import step as step_lib  # noqa: E402
from compassplay_jax.settings.coding.setting import CodingSelfPlay  # noqa: E402
from compassplay_jax.verifiers.sandbox import SandboxPool  # noqa: E402
from tests import compile_events  # noqa: E402
from tests.scripted_coder import SHORT_SEQUENCES, ScriptedCoder  # noqa: E402
from tests.test_selfplay import _config  # noqa: E402

if jax.device_count() != 8:
  pytest.skip(f"needs 8 devices, have {jax.device_count()}", allow_module_level=True)

# The full step on three meshes: all-data, all three axes, tensor-heavy. fsdp=8 alone is covered by the
# sharding cases (train step, g_ref and cosines against one device) and by the multi-host runs (the
# full step on fsdp=8, one process against two): dropped here for the suite's time (~15 CPU-s).
# (2, 2, 2) runs through the main command below (test_main_on_a_2x2x2_mesh_matches_one_device), record by record.
MESHES = [(8, 1, 1), (1, 2, 4)]
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def setup():
  config = _config("coding:tiny", compile_ahead="on", **SHORT_SEQUENCES)  # "auto" is off on 2 cores
  model, tokenizer = build_model(config)
  graphdef, params = nnx.split(model)
  pool = SandboxPool(num_workers=2)
  yield config, tokenizer, graphdef, params, pool
  pool.close()


def one_step(config, tokenizer, graphdef, params, pool, mesh):
  """The run loop's step on `mesh` (step.run_step, as Session.step calls it)."""
  engine = Engine.build(graphdef, params, mesh, EngineSettings.from_config(config))
  p, o = engine.init_train_state(jax.tree.map(lambda x: np.asarray(x), params))
  setting = CodingSelfPlay(config, tokenizer, pool, sampler=ScriptedCoder(tokenizer))
  g_ref = alignment.reference_gradient(engine, p, setting.reference, tokenizer.pad_token_id)
  with compile_events.recorded() as compiles:
    result = step_lib.run_step(setting, engine, p, o, 1, jax.random.key(7),
                               update=step_lib.UpdateOptions.from_config(config, tokenizer.pad_token_id))
  engine.ahead.close()
  # The optimizer update compiles ahead while the step generates and the cosine pass (its shape guessed
  # from the gold answers) while the solver samples (infra/compile_ahead.py): the step's main thread compiles
  # neither. (g_ref compiled above, on the main thread.)
  assert not {"jit(update)", "jit(gradient_cosines)"} & compile_events.on_main(compiles), compiles
  train_metrics = {k: v for k, v in result.metrics.items() if k.startswith("train/")}
  return engine, result.metrics, g_ref, result.params, train_metrics


_ONE = {}


def single_device(setup):
  if not _ONE:
    config, tokenizer, graphdef, params, pool = setup
    _ONE["result"] = one_step(config, tokenizer, graphdef, params, pool, sh.make_mesh((1, 1, 1), jax.devices()[:1]))
  return _ONE["result"]


def assert_rule_shardings(tree, mesh, head_dim):
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    path = sh.path_str(key_path)
    assert leaf.sharding.spec == sh.param_spec(path, leaf.shape, mesh, head_dim), path
    assert leaf.sharding.mesh.shape == mesh.shape, path


@pytest.mark.parametrize("shape", MESHES, ids=["dp8", "fsdp2tp4"])
def test_full_coding_step_matches_one_device(setup, shape):
  config, tokenizer, graphdef, params, pool = setup
  _, want, want_g, want_p, want_train = single_device(setup)
  # Every proposal valid and in band, each paid by its cosine: the step exercised the whole chain.
  assert want["cos_paid_count"] == len(want["candidates"]) > 0, want["candidates"]

  mesh = sh.make_mesh(shape)
  engine, got, g_ref, new_p, got_train = one_step(config, tokenizer, graphdef, params, pool, mesh)
  for a, b in zip(got["candidates"], want["candidates"]):
    assert (a["valid"], a["in_band"], a["paid_by"]) == (b["valid"], b["in_band"], b["paid_by"])
    np.testing.assert_allclose(a["cosine"], b["cosine"], **TOL)
    np.testing.assert_allclose(a["reward"], b["reward"], **TOL)
  for name in ("reward/proposer", "reward/solver", "cos_valid_mean"):
    np.testing.assert_allclose(got[name], want[name], **TOL)
  np.testing.assert_allclose(got_train["train/loss"], want_train["train/loss"], **TOL)
  for a, b in zip(jax.tree.leaves(new_p), jax.tree.leaves(want_p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
  for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)

  head_dim = engine.model_config.head_dim
  assert_rule_shardings(g_ref, mesh, head_dim)
  assert_rule_shardings(new_p, mesh, head_dim)
  # The sampler's KV cache: rows over (data, fsdp), kv heads over tensor where they divide it.
  rows = 8
  state = engine.sampler.prefill(graphdef, new_p, np.ones((rows, 8), np.int32), np.ones((rows, 8), np.int32),
                                 np.arange(rows, dtype=np.int32), np.ones((rows,), bool), jax.random.key(0),
                                 n_samples=1, max_new_tokens=4, sampler=_greedy(), eos_ids=(0,), pad_id=0)
  for layer in state.cache:
    for cache in layer:
      want_spec = sh.fit_spec(jax.sharding.PartitionSpec(sh.BATCH_AXES, None, "tensor"), cache.shape, mesh)
      assert cache.sharding.spec == want_spec, (cache.shape, cache.sharding.spec, want_spec)
      assert cache.sharding.mesh.shape == mesh.shape


def _greedy():
  from compassplay_jax.sampling.config import SamplingConfig
  return SamplingConfig(temperature=0.0).sampler


def test_main_on_a_2x2x2_mesh_matches_one_device(tmp_path, monkeypatch, capsys):
  """The main command (compassplay_jax.main's entry, in this process) with --config.mesh.data=2
  --config.mesh.fsdp=2 --config.mesh.tensor=2: the run loop on (2, 2, 2), the tiny model's own texts
  through the sharded sampler, reward and train step, gives the metrics of the same run on one device.
  (Was tests/test_selfplay.py::test_coding_tiny_on_a_2x2x2_mesh_matches_one_device, which ran the one-device
  run in the main pytest process and the command in a subprocess of its own.)"""
  import sys

  from compassplay_jax import main as main_lib
  from compassplay_jax.selfplay.run import run
  # Both runs pad rows to one shape (packing by length across processes: tests/test_multihost_selfplay.py).
  # The scripted coder's short sequences (shorter passes over the 49k vocabulary), in both runs.
  config = _config("coding:tiny", **{"steps": 1, "train.micro_batch_size": 4, "train.micro_batch_tokens": 0,
                                     **SHORT_SEQUENCES})
  with monkeypatch.context() as patch:
    # The one-device run: its mesh (config.mesh resolves to (1, 1, 1)) on this process's first device.
    real_make_mesh = sh.make_mesh
    patch.setattr(sh, "make_mesh", lambda mesh_config=None, devices=None: real_make_mesh(
        mesh_config, jax.devices()[:1] if devices is None else devices))
    run(config, tmp_path / "one")
  assert "[compassplay] mesh" not in capsys.readouterr().out  # the run above was on one device
  monkeypatch.setattr(sys, "argv", [
      "compassplay_jax.main", "--config=configs/coding.py:tiny", "--config.steps=1",
      "--config.train.micro_batch_size=4", "--config.mesh.data=2", "--config.mesh.fsdp=2",
      "--config.mesh.tensor=2", *[f"--config.{k}={v}" for k, v in SHORT_SEQUENCES.items()],
      f"--workdir={tmp_path / 'mesh'}"])
  with pytest.raises(SystemExit) as exit_info:  # absl's app.run ends with sys.exit(main's result)
    main_lib.entry()
  out, err = capsys.readouterr()
  assert exit_info.value.code in (None, 0), err[-3000:]
  assert "[compassplay] mesh data=2, fsdp=2, tensor=2" in out, out[-2000:]
  one = json.loads((tmp_path / "one" / "metrics.jsonl").read_text().splitlines()[0])
  mesh = json.loads((tmp_path / "mesh" / "metrics.jsonl").read_text().splitlines()[0])
  for key in ("train/loss", "train/grad_norm", "train/entropy", "tokens/generated", "reward/proposer",
              "rows", "train/num_tokens", "cos_paid_count"):
    assert mesh[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
  # Per candidate, in order: the sharded sampler's texts gave the same records. (The tiny model's own
  # proposals are rarely in band, so cosines on (2, 2, 2) are compared in sharding_cases.py's reward
  # cases and the full step's in test_full_coding_step_matches_one_device on the other meshes.)
  assert len(one["candidates"]) > 0
  for a, b in zip(mesh["candidates"], one["candidates"], strict=True):
    assert (a["type"], a["valid"], a["formatted"], a["in_band"], a["paid_by"], a["solve_rate"], a["jaccard"]) == \
           (b["type"], b["valid"], b["formatted"], b["in_band"], b["paid_by"], b["solve_rate"], b["jaccard"])
    np.testing.assert_allclose(a["reward"], b["reward"], **TOL)
