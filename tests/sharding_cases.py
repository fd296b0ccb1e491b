"""Sharded == single-device, on 8 simulated CPU devices. Run by tests/test_eight_devices.py in a subprocess.

Not collected by the main pytest run (the name has no test_ prefix): the device count must be set
before jax is imported, so this module runs in tests/test_eight_devices.py's 8-device pytest process
(with the other *_cases.py modules), or by hand:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python3 -m pytest tests/sharding_cases.py
Tiny models: hidden 64, 8 heads of 8, 2 layers, vocab 96; the Qwen2 one has 2 kv heads (sharded over
tensor=2, replicated over tensor=4), the Llama one is tied with 8 kv heads (always sharded).
"""
import math
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from compassplay_jax.infra import sharding as sh  # noqa: E402
from compassplay_jax.runtime.engine import Engine, EngineSettings, ShardedSampler  # noqa: E402
from compassplay_jax.models.config import ModelConfig  # noqa: E402
from compassplay_jax.models.decoder import init_decoder  # noqa: E402

if jax.device_count() != 8:
  pytest.skip(f"needs 8 devices, have {jax.device_count()} (set XLA_FLAGS before jax is imported)",
              allow_module_level=True)

REPO = pathlib.Path(__file__).resolve().parents[1]
MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]
MESH_IDS = ["dp8", "fsdp8", "dp2fsdp2tp2", "fsdp2tp4"]
TOL = dict(rtol=1e-5, atol=1e-5)
CONFIGS = {
    "qwen2": ModelConfig(model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, attention_bias=True),
    "llama_tied": ModelConfig(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
                              tie_word_embeddings=True),
}
N, T = 8, 16


_ONE_DEVICE = {}


def one_device(key, compute):
  """compute()'s result, computed once per key: the one-device references do not depend on the mesh,
  so each is compiled and run once, not once per mesh."""
  if key not in _ONE_DEVICE:
    _ONE_DEVICE[key] = compute()
  return _ONE_DEVICE[key]


def close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def tree_close(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    close(x, y)


def batch(vocab, seed=0):
  """Left-padded rows, loss on the last 6 real tokens; row 3 has no loss tokens (cosine 0)."""
  rng = np.random.default_rng(seed)
  lengths = [16, 12, 9, 14, 16, 10, 11, 15]
  tokens = np.zeros((N, T), np.int32)
  mask = np.zeros((N, T), np.int32)
  loss = np.zeros((N, T), np.int32)
  for r, n in enumerate(lengths):
    tokens[r, T - n:] = rng.integers(1, vocab, n)
    mask[r, T - n:] = 1
    if r != 3:
      loss[r, T - 6:] = 1
  return {"tokens": tokens, "attention_mask": mask, "loss_mask": loss}


@pytest.fixture(scope="module", params=list(CONFIGS))
def family(request):
  cfg = CONFIGS[request.param]
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  return cfg, graphdef, params


@pytest.fixture(scope="module", params=MESHES, ids=MESH_IDS)
def mesh(request):
  return sh.make_mesh(request.param)


def expected_shard_shape(shape, spec, mesh):
  """Shard shape computed from the spec alone (independent of jax's own bookkeeping)."""
  out = list(shape)
  for dim, axes in enumerate(spec):
    if axes is not None:
      names = axes if isinstance(axes, tuple) else (axes,)
      out[dim] //= math.prod(mesh.shape[a] for a in names)
  return tuple(out)


def assert_rule_shardings(tree, mesh, cfg, prefix_ok=False):
  """Every leaf's actual sharding is the one its rule names, and its shards have that shape."""
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    path = sh.path_str(key_path)
    spec = sh.param_spec(path, leaf.shape, mesh, cfg.head_dim)
    assert leaf.sharding.spec == spec, (path, leaf.sharding.spec, spec)
    assert leaf.sharding.mesh.shape == mesh.shape, path
    want = expected_shard_shape(leaf.shape, spec, mesh)
    assert all(s.data.shape == want for s in leaf.addressable_shards), (path, want)
    # The rule applies verbatim except where whole heads do not divide `tensor` (replicated there).
    rule = sh.rule_for(path)
    if spec != rule:
      assert "tensor" in rule and mesh.shape["tensor"] > 1 and (
          cfg.num_key_value_heads % mesh.shape["tensor"] and (".k_proj" in path or ".v_proj" in path)), path


# ---- mesh and rules -----------------------------------------------------------------------------------

def test_mesh_from_config():
  assert sh.make_mesh((2, 2, 2)).shape == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sh.make_mesh({"data": 2, "tensor": 2}).shape == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sh.make_mesh("data=-1,fsdp=1,tensor=4").shape == {"data": 2, "fsdp": 1, "tensor": 4}
  assert sh.make_mesh(None).shape == {"data": 1, "fsdp": 8, "tensor": 1}
  with pytest.raises(sh.ShardingError, match="needs 12 devices"):
    sh.make_mesh((3, 2, 2))


def test_every_param_has_its_rule_sharding(family, mesh):
  cfg, _, _ = family
  _, params = sh.init_params_sharded(cfg, mesh, seed=1)
  assert_rule_shardings(params, mesh, cfg)
  # Sharded init creates the same values as the single-device init.
  tree_close(params, nnx.split(init_decoder(cfg, seed=1))[1])


# ---- forward and gradients ----------------------------------------------------------------------------

def mean_loss(graphdef, params, b):
  from compassplay_jax.rewards.losses import per_sequence_loss
  return jnp.mean(per_sequence_loss(graphdef, params, b["tokens"], b["loss_mask"], b["attention_mask"]))


def test_forward_and_gradients_match_single_device(family, mesh):
  cfg, graphdef, params = family
  b = batch(cfg.vocab_size)
  fn = lambda p, b: jax.value_and_grad(lambda p: mean_loss(graphdef, p, b))(p)
  logits_fn = lambda p, b: nnx.merge(graphdef, p)(b["tokens"], attention_mask=b["attention_mask"])
  want_loss, want_grads, want_logits = one_device(
      ("forward", cfg), lambda: (*jax.jit(fn)(params, b), jax.jit(logits_fn)(params, b)))

  sparams = sh.shard_params(params, mesh, cfg.head_dim)
  assert_rule_shardings(sparams, mesh, cfg)
  p_sh, b_sh = sh.tree_shardings(params, mesh, cfg.head_dim), sh.batch_tree_shardings(b, mesh)
  sb = sh.shard_batch(b, mesh)
  loss, grads = jax.jit(fn, in_shardings=(p_sh, b_sh), out_shardings=(sh.replicated(mesh), p_sh))(sparams, sb)
  logits = jax.jit(logits_fn, in_shardings=(p_sh, b_sh),
                   out_shardings=jax.sharding.NamedSharding(mesh, sh.logical_spec("batch", "length", "vocab")))(
                       sparams, sb)
  close(loss, want_loss)
  close(logits, want_logits)
  tree_close(grads, want_grads)
  assert_rule_shardings(grads, mesh, cfg)


# ---- reward: reference gradient and both cosine methods -----------------------------------------------

_REWARD_REFERENCE = {}


def reward_reference(name):
  """Single-device params, g_ref and cosines of both methods for one family (computed once)."""
  from compassplay_jax.rewards import cosines, reference
  if name not in _REWARD_REFERENCE:
    cfg = CONFIGS[name]
    graphdef, params = nnx.split(init_decoder(cfg, seed=1))
    ref, cand = batch(cfg.vocab_size, seed=2), batch(cfg.vocab_size, seed=3)
    g_ref = jax.jit(lambda p, b: reference.reference_gradient(graphdef, p, b["tokens"], b["loss_mask"],
                                                              b["attention_mask"], micro_batch=4))(params, ref)
    out = {method: jax.jit(lambda p, g, b, m=method: cosines.gradient_cosines(
        graphdef, p, g, b["tokens"], b["loss_mask"], b["attention_mask"], method=m, chunk_size=4))(
            params, g_ref, cand) for method in cosines.METHODS}
    _REWARD_REFERENCE[name] = (cfg, graphdef, params, ref, cand, g_ref, out)
  return _REWARD_REFERENCE[name]


# Qwen2 (biases, replicated kv heads at tensor=4) on every mesh with the fused method (the default);
# the direct method (per-row gradients, no fused pass) on the two meshes that split rows and weights
# at once; the tied Llama (the head's cross term under a vocab-parallel table) on the tensor-parallel
# mesh only, to keep the suite's compile time down.
REWARD_CASES = [("qwen2", shape, "fused") for shape in MESHES] + [
    ("qwen2", shape, "direct") for shape in MESHES if shape[2] > 1] + [
    ("llama_tied", (1, 2, 4), "fused"), ("llama_tied", (1, 2, 4), "direct")]


@pytest.mark.parametrize("name,shape,method", REWARD_CASES,
                         ids=[f"{n}-{MESH_IDS[MESHES.index(s)]}-{m}" for n, s, m in REWARD_CASES])
def test_reward_cosines_match_single_device(name, shape, method):
  cfg, graphdef, params, ref, cand, want_g_ref, want = reward_reference(name)
  mesh = sh.make_mesh(shape)
  sparams = sh.shard_params(params, mesh, cfg.head_dim)
  sref, scand = sh.shard_batch(ref, mesh), sh.shard_batch(cand, mesh)
  engine = Engine.build(graphdef, sparams, mesh, EngineSettings(reward_method=method, reward_chunk_size=4,
                                                                 reward_micro_batch=4))
  g_ref = engine.reference_gradient(sparams, sref["tokens"], sref["loss_mask"], sref["attention_mask"])
  tree_close(g_ref, want_g_ref)
  assert_rule_shardings(g_ref, mesh, cfg)  # stored with the parameters' sharding
  got = engine.cosines(sparams, g_ref, scand["tokens"], scand["loss_mask"], scand["attention_mask"])
  for field in ("cosines", "inner_products", "sq_norms", "ref_sq_norm"):
    close(getattr(got, field), getattr(want[method], field))
  np.testing.assert_array_equal(got.has_loss_tokens, want[method].has_loss_tokens)
  assert got.cosines.sharding.spec == sh.logical_spec("batch")
  assert float(jnp.abs(got.cosines).max()) > 0.01  # a meaningful signal, not all zeros


# ---- train step ---------------------------------------------------------------------------------------

def test_train_step_matches_single_device(mesh):
  from compassplay_jax.rl import losses as rl_losses
  from compassplay_jax.rl import train_step as train_lib
  cfg = CONFIGS["qwen2"]
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  first = np.array(jax.tree.leaves(params)[0])  # a host copy: donation may free buffers params shares
  b = batch(cfg.vocab_size, seed=4)
  logits = nnx.merge(graphdef, params)(b["tokens"], attention_mask=b["attention_mask"])
  b["old_logprobs"] = np.asarray(rl_losses.token_logprobs(logits, jnp.asarray(b["tokens"])))
  b["advantages"] = np.linspace(-1.0, 1.0, N).astype(np.float32)
  tcfg = train_lib.TrainConfig(learning_rate=1e-3, micro_batch_size=N // 2 if mesh.shape["data"] < 8 else N)
  optimizer = train_lib.make_optimizer(tcfg)

  want_p, want_o, want_m = one_device(("train_step", tcfg), lambda: train_lib.make_train_step(
      graphdef, tcfg, optimizer=optimizer, donate=False)(*train_lib.init_train_state(params, tcfg, optimizer), b,
                                                         jax.random.key(0)))

  sp = sh.shard_params(params, mesh, cfg.head_dim)
  sp, so = train_lib.init_train_state(sp, tcfg, optimizer)
  so = jax.device_put(so, sh.tree_shardings(so, mesh, cfg.head_dim, strict=False))
  engine = Engine.build(graphdef, sp, mesh, EngineSettings(train=tcfg), optimizer=optimizer)
  new_p, new_o, metrics = engine.train_step(sp, so, sh.shard_batch(b, mesh), jax.random.key(0))
  close(metrics["loss"], want_m["loss"])
  close(metrics["grad_norm"], want_m["grad_norm"])
  tree_close(new_p, want_p)
  tree_close(new_o, want_o)
  assert_rule_shardings(new_p, mesh, cfg)
  assert np.abs(np.asarray(jax.tree.leaves(new_p)[0]) - first).max() > 1e-4  # the step moved the params


def test_engine_train_state_and_bucketed_step_match_single_device(mesh):
  """Engine.init_train_state lays params and Adam moments out by the rules; the length-bucketed step
  (micro-batches of 3 and 5 rows, padded to the mesh by the engine) equals one device's."""
  from compassplay_jax.rl import losses as rl_losses
  from compassplay_jax.rl import train_step as train_lib
  cfg = CONFIGS["qwen2"]
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  b = batch(cfg.vocab_size, seed=6)
  logits = nnx.merge(graphdef, params)(b["tokens"], attention_mask=b["attention_mask"])
  b["old_logprobs"] = np.asarray(rl_losses.token_logprobs(logits, jnp.asarray(b["tokens"])))
  b["advantages"] = np.linspace(-1.0, 1.0, N).astype(np.float32)
  micro = [{k: v[:3] for k, v in b.items()}, {k: v[3:, 6:] if v.ndim == 2 else v[3:] for k, v in b.items()}]
  tcfg = train_lib.TrainConfig(learning_rate=1e-3)
  fresh = lambda: jax.tree.map(jnp.copy, params)
  want_p, want_o, want_m = one_device("bucketed_train_step", lambda: train_lib.make_bucketed_train_step(
      graphdef, tcfg)(*train_lib.init_train_state(fresh(), tcfg), micro, jax.random.key(0)))

  engine = Engine.build(graphdef, params, mesh, EngineSettings(train=tcfg))
  sp, so = engine.init_train_state(fresh())
  assert_rule_shardings(sp, mesh, cfg)
  for leaf, want in zip(jax.tree.leaves(so), jax.tree.leaves(engine.opt_shardings(so))):
    assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
  new_p, new_o, metrics = engine.bucketed_train_step(sp, so, micro, jax.random.key(0))
  close(metrics["loss"], want_m["loss"])
  tree_close(new_p, want_p)
  tree_close(new_o, want_o)
  assert_rule_shardings(new_p, mesh, cfg)


# ---- sampler -----------------------------------------------------------------------------------------

def test_greedy_sampler_matches_single_device(mesh):
  import importlib
  gen_lib = importlib.import_module("compassplay_jax.sampling.generate")
  from compassplay_jax.sampling.config import SamplingConfig
  cfg = CONFIGS["qwen2"]
  graphdef, params = nnx.split(init_decoder(cfg, seed=1))
  rng = np.random.default_rng(5)
  prompts = [rng.integers(1, cfg.vocab_size, n).tolist() for n in (5, 9, 3, 12, 7, 4, 10, 6)]
  config = SamplingConfig(temperature=0.0, max_new_tokens=8, eos_ids=(0,), bucket_lengths=(16,), micro_batch_size=8)
  want = one_device("greedy", lambda: gen_lib.generate(graphdef, params, None, prompts, config, key=0))

  sampler = ShardedSampler(mesh, cfg.head_dim)
  got = gen_lib.generate(graphdef, sh.shard_params(params, mesh, cfg.head_dim), None, prompts, config, key=0,
                         device_fns=sampler)
  assert len(sampler._cache) == 2  # both device calls went through the explicitly sharded jits
  for a, b in zip(got.tokens, want.tokens):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(got.logprobs, want.logprobs):
    close(a, b)


# ---- loading a Hugging Face checkpoint into its sharded layout ---------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_hf_checkpoint_loads_each_device_slice(tmp_path, monkeypatch, model_type):
  from compassplay_jax.models import hf_io, loading
  from tests.hf_fixtures import save_tiny_hf_model
  directory, _ = save_tiny_hf_model(tmp_path, model_type, heads=8, kv_heads=2, hidden=64, inter=128, vocab=96)
  want = nnx.split(loading.load_hf_model(directory))[1]
  mesh = sh.make_mesh((1, 2, 4))
  cfg = ModelConfig.from_hf_dir(directory)
  requested = []
  real = jax.make_array_from_callback

  def recording(shape, sharding, callback):
    def cb(index):
      value = callback(index)
      requested.append((shape, sharding.spec, value.shape))
      return value
    return real(shape, sharding, cb)

  monkeypatch.setattr(hf_io.jax, "make_array_from_callback", recording)
  model = loading.load_hf_model(directory, shardings=sh.loader_shardings(mesh, cfg.head_dim))
  params = nnx.split(model)[1]
  tree_close(params, want)
  assert_rule_shardings(params, mesh, cfg)
  # Each callback read one device's slice: sharded tensors never came off the file whole.
  assert {full for full, _, _ in requested} == {x.shape for x in jax.tree.leaves(params)}
  for full, spec, part in requested:
    assert part == expected_shard_shape(full, spec, mesh), (full, spec, part)
  assert sum(part != full for full, _, part in requested) > len(requested) // 2


# ---- orbax: save from one mesh, restore onto another -------------------------------------------------

def test_checkpoint_restores_onto_another_mesh(tmp_path):
  from compassplay_jax.infra import checkpoint
  from compassplay_jax.rl import train_step as train_lib
  cfg = CONFIGS["qwen2"]
  tcfg = train_lib.TrainConfig()
  mesh_a = sh.make_mesh((2, 2, 2))
  _, params = sh.init_params_sharded(cfg, mesh_a, seed=1)
  params, opt_state = train_lib.init_train_state(params, tcfg)
  opt_state = jax.tree.map(lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x + 3, opt_state)
  opt_state = jax.device_put(opt_state, sh.tree_shardings(opt_state, mesh_a, cfg.head_dim, strict=False))
  with checkpoint.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(7, params, opt_state, jax.random.key(3), {"note": "mesh a"}, force=True)
    manager.wait_until_finished()
  for shape in [(1, 2, 4), (8, 1, 1)]:
    mesh_b = sh.make_mesh(shape)
    p_target = sh.abstract_sharded(params, sh.tree_shardings(params, mesh_b, cfg.head_dim))
    o_target = sh.abstract_sharded(opt_state, sh.tree_shardings(opt_state, mesh_b, cfg.head_dim, strict=False))
    with checkpoint.CheckpointManager(tmp_path / "ckpt", create=False) as manager:
      step, new_params, new_opt, _, extra = manager.restore(params=p_target, opt_state=o_target)
    assert step == 7 and extra == {"note": "mesh a"}
    tree_close(new_params, params)
    tree_close(new_opt, opt_state)
    assert_rule_shardings(new_params, mesh_b, cfg)
    for leaf, want in zip(jax.tree.leaves((new_params, new_opt)), jax.tree.leaves((p_target, o_target))):
      assert leaf.sharding.is_equivalent_to(want.sharding, leaf.ndim)


# ---- rows stay on their devices ------------------------------------------------------------------------

def fsdp8_collectives(name: str):
  """(the tiny tied model and workload, (op, per-device shape) of each array of every all-reduce and
  all-gather of function `name` compiled on fsdp=8)."""
  from compassplay_jax.costs import memory_report
  cfg, work = memory_report.tiny_workload(CONFIGS["llama_tied"])  # tied: the head reads the embedding table
  lowered, _ = memory_report.lower_function(name, cfg, sh.make_mesh((1, 8, 1)), work)
  results = [(op, shape) for op, arrays, _ in memory_report.hlo_collectives(lowered.compile().as_text())
             if op in ("all-reduce", "all-gather") for _, shape in arrays]
  assert results, "no all-reduce or all-gather: not an FSDP program"
  return cfg, work, results


@pytest.mark.parametrize("name", ["g_ref", "cos8", "train", "prefill"])
def test_fsdp_passes_never_gather_activations_of_all_rows(name):
  """Under FSDP each device runs only its rows of a pass over whole sequences: no collective carries a
  micro-batch's activations of every row (a (rows, length, hidden...) result). Without the rows pinned
  to the batch axes (models/layout.py) XLA took the embedding table's hidden split and all-reduced
  every layer's activations and the full logits over all 8 devices (g_ref 4x slower on 8 simulated CPUs)."""
  _, work, results = fsdp8_collectives(name)
  lengths = {work.seq_len, work.sampler_prompt_len}
  rows = {work.train_micro_batch, work.reward_micro_batch, work.sampler_rows}
  # Per-token scalars (a loss mask's row sums, token counts) may be gathered; a token's hidden state may not.
  activations = [(op, shape) for op, shape in results
                 if len(shape) >= 3 and shape[0] in rows and shape[1] in lengths and math.prod(shape[2:]) >= 8]
  assert not activations, activations[:5]


def test_fsdp_decode_step_moves_activations_not_weights():
  """A decode step (one token a row) is the other way round: its few activations cross devices and the
  weights stay put. With the rows pinned there too, every step all-gathered every weight matrix (the
  paper coding mesh, TPU compiler: 0.03 -> 1.8 GB over the links per step), so the pin skips it."""
  cfg, _, results = fsdp8_collectives("decode")
  largest = max(results, key=lambda r: math.prod(r[1]))
  assert math.prod(largest[1]) < cfg.hidden_size ** 2, largest  # a (d, d) weight or more: a gathered weight


# ---- ahead-of-time memory report ---------------------------------------------------------------------

def test_memory_report_on_tiny_config():
  from compassplay_jax.costs import memory_report
  cfg, work = memory_report.tiny_workload()
  mesh = sh.make_mesh((2, 2, 2))
  row = memory_report.report(cfg, mesh, work)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.split(init_decoder(cfg))[1]))
  assert row["params"] < 4 * n_params / 2  # sharded: well under the replicated size
  assert row["opt_state"] >= 2 * row["params"]  # two Adam moments
  assert row["ref_grad"] == row["params"]
  for step in ("train", "reward"):
    assert row[step]["temp"] > 0 and row[step]["peak"] >= row[step]["argument"]
  table = memory_report.format_table([row])
  assert "| tiny | data=2, fsdp=2, tensor=2 |" in table


def test_per_function_report_script_on_8_devices(tmp_path, monkeypatch, capsys):
  """experiments/memory_report.py --functions (the per-function AOT report, memory_report.report_functions)
  on the tiny config at (2, 2, 2), through the script's main, and its --table rebuild of the rows.
  (Was tests/test_memory_report_functions.py's 8-device subprocess; here it shares this process.)"""
  import importlib.util
  import json

  from compassplay_jax.costs import memory_report as mr
  spec = importlib.util.spec_from_file_location("memory_report_script", REPO / "experiments" / "memory_report.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  out = tmp_path / "rows.json"
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # the script sets the device count itself
  script.main(["--tiny", "--devices", "8", "--mesh", "2,2,2", "--functions", "sampler,g_ref,cos16,train",
               "--attention-chunk", "8", "--remat", "--scan-layers", "--compute-dtype", "float32",
               "--param-dtype", "float32", "--device-memory-gib", "0.0005", "--json", str(out)])
  # What a fresh `python experiments/memory_report.py` process hands jax before importing it.
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
  stdout = capsys.readouterr().out
  rows = json.loads(out.read_text())
  assert [r["function"] for r in rows] == ["prefill", "decode", "g_ref", "cos16", "train"]
  for r in rows:
    assert r["mesh"] == "data=2, fsdp=2, tensor=2" and r["attention_query_chunk"] == 8 and r["remat"]
    # Scanned blocks compile under a sharded mesh: g_ref and train take that path (plain ops, no cache).
    assert r["scan_layers"] == (r["function"] in ("g_ref", "train"))
    assert r["peak"] >= r["argument"] > 0 and r["temp"] >= 0
    assert r["fits"] == ("yes" if r["peak"] <= 0.0005 * mr.GIB else "no: " + r["fits"][4:])
  assert any(r["fits"] == "yes" for r in rows) and any(r["fits"].startswith("no: ") for r in rows)
  # The sampler's decode at the full cache holds the (rows x slots) KV cache among its arguments.
  assert "| tiny | data=2, fsdp=2, tensor=2 | decode | 8 rows, cache 16+16 |" in stdout
  assert "| function | shapes | argument | output | temp | peak | fits | compile s |" in stdout
  assert "| train (scan) | 16 x 32, mb 8 |" in stdout
  # --table rebuilds the same table from the JSON rows alone (how docs/sharding.md's tables are made).
  script.main(["--table", str(out)])
  table = capsys.readouterr().out
  assert table.strip() == "\n".join(stdout.strip().splitlines()[-len(rows) - 2:])
  assert "| cpu x8 | tiny | data=2, fsdp=2, tensor=2 | decode |" in table
  # An unreadable file: sys.exit(message), i.e. exit status 1 and that one line on stderr.
  missing = tmp_path / "none.json"
  with pytest.raises(SystemExit) as exit_info:
    script.main(["--table", str(missing)])
  assert exit_info.value.code == (f"memory_report: cannot read rows from {missing}: "
                                  f"[Errno 2] No such file or directory: '{missing}'")
