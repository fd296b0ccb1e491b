"""The per-function AOT memory report (memory_report.report_functions, experiments/memory_report.py --functions).

The script's report on 8 simulated devices is a case in tests/sharding_cases.py
(test_per_function_report_script_on_8_devices), run by tests/test_eight_devices.py with the other
8-device cases (the main pytest process's jax has one device).
"""
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from compassplay_jax.costs import memory_report as mr
from compassplay_jax.infra import sharding as sh
from compassplay_jax.runtime.engine import Engine, EngineSettings
from compassplay_jax.models.decoder import init_decoder
from compassplay_jax.rl.train_step import TrainConfig

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_parse_functions_and_device_memory():
  assert mr.parse_functions("sampler,g_ref,cos64,cos256,train") == (
      "prefill", "decode", "g_ref", "cos64", "cos256", "train")
  assert mr.parse_functions("all") == mr.FUNCTIONS
  assert mr.parse_functions("cosines,cos16") == ("cos64", "cos256", "cos16")
  with pytest.raises(ValueError, match="unknown function"):
    mr.parse_functions("sampler,nope")
  assert mr.device_memory_bytes() == 80 * mr.GIB
  assert mr.device_memory_bytes("v5p:2x2x2") == int(95.74 * mr.GIB)
  assert mr.device_memory_bytes("v5p:2x2x2", gib=10) == 10 * mr.GIB


def test_suggested_knobs_in_order():
  cfg, work = mr.tiny_workload()
  mesh = sh.make_mesh((1, 1, 1))
  assert mr.suggest_knob("train", cfg, mesh, work).startswith("attention_query_chunk")
  assert mr.suggest_knob("decode", cfg, mesh, work).startswith("fewer sampler rows")
  cfg = cfg.replace(attention_query_chunk=8)
  assert mr.suggest_knob("g_ref", cfg, mesh, work).startswith("remat")
  cfg = cfg.replace(remat=True)
  assert mr.suggest_knob("train", cfg, mesh, work).startswith("scan_layers")
  assert mr.suggest_knob("g_ref", cfg, mesh, work).startswith("scan_layers")
  assert mr.suggest_knob("cos64", cfg, mesh, work).startswith("smaller micro-batch")
  cfg = cfg.replace(scan_layers=True)
  import dataclasses
  work = dataclasses.replace(work, train_micro_batch=1, sampler_rows=1)
  assert mr.suggest_knob("train", cfg, mesh, work).startswith("tensor axis")
  assert mr.suggest_knob("prefill", cfg, mesh, work).startswith("tensor axis")


def _spec(tree):
  """ShapeDtypeStructs of real arrays, with their shardings (host arrays have none: the jit places them)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def test_report_lowers_the_programs_the_engine_runs():
  """Each report row's program is the one a run compiles: the jit an Engine builds and calls on real
  arrays (placed by the engine), lowered at those arrays' shapes and shardings, has the same
  StableHLO text (shardings, donation, micro-batches included) as memory_report.lower_function's."""
  cfg, work = mr.tiny_workload()
  cfg = cfg.replace(param_dtype="bfloat16", dtype="bfloat16", remat=True, attention_query_chunk=8)
  mesh = sh.make_mesh((1, 1, 1))
  train_cfg = TrainConfig()
  settings = EngineSettings(train=train_cfg.replace(micro_batch_size=work.train_micro_batch),
                            reward_chunk_size=work.reward_micro_batch, reward_micro_batch=work.reward_micro_batch)
  graphdef, params = nnx.split(init_decoder(cfg, seed=0))
  engine = Engine.build(graphdef, params, mesh, settings)
  params = engine.place_params(params)
  rng = np.random.default_rng(0)

  def batch(rows, extra=False):
    b = {"tokens": rng.integers(1, cfg.vocab_size, (rows, work.seq_len), dtype=np.int32),
         "loss_mask": np.ones((rows, work.seq_len), np.int32),
         "attention_mask": np.ones((rows, work.seq_len), np.int32)}
    if extra:
      b["old_logprobs"] = np.zeros((rows, work.seq_len), np.float32)
      b["advantages"] = np.ones((rows,), np.float32)
    return engine.put_batch(b)

  called = {}  # function -> (the jit the engine called, the specs of the arrays it was called with)
  ref, cand = batch(work.reference_size), batch(16)
  g_ref = engine.reference_gradient(params, ref["tokens"], ref["loss_mask"], ref["attention_mask"])
  called["g_ref"] = engine._jitted[("reference", 8)], _spec((params, ref["tokens"], ref["loss_mask"],
                                                             ref["attention_mask"]))
  engine.cosines(params, g_ref, cand["tokens"], cand["loss_mask"], cand["attention_mask"])
  called["cos16"] = engine._jitted[("cosines", 8, "fused")], _spec((params, g_ref, cand["tokens"], cand["loss_mask"],
                                                           cand["attention_mask"]))
  master, opt_state = engine.init_train_state(params)
  args = (master, opt_state, batch(work.train_batch, extra=True), jax.random.key(0))
  specs = _spec(args)
  engine.train_step(*args)
  called["train"] = engine._jitted["train"], specs
  static = mr._sampler_static(work)
  rows, length = work.sampler_rows, work.sampler_prompt_len
  prompt = (np.ones((rows, length), np.int32), np.ones((rows, length), np.int32), np.arange(rows, dtype=np.int32),
            np.ones((rows,), bool), jax.random.key(1))
  state = engine.sampler.prefill(graphdef, params, *prompt, **static)
  called["prefill"] = engine.sampler.prefill_jit(graphdef, params, *prompt, **static)[0], _spec((params, *prompt))
  decode_static = {k: static[k] for k in ("sampler", "eos_ids", "pad_id")}
  args = (params, state, np.int32(work.sampler_new_tokens), np.zeros((rows,), bool))
  specs = _spec(args)
  engine.sampler.decode(graphdef, *args, **decode_static)
  called["decode"] = engine.sampler.decode_jit(graphdef, *specs, **decode_static)[0], specs
  assert len(engine.sampler._cache) == 2  # the builders returned the jits prefill / decode ran
  for name, (jitted, specs) in called.items():
    want = jitted.lower(*specs).as_text()
    got = mr.lower_function(name, cfg, mesh, work, train_cfg)[0].as_text()
    assert got == want, name


def load_config(config_file: str, variant: str):
  """`get_config(variant)` of a config file (configs/ is not a package)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("paper_config", REPO / config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


# The rows of docs/sharding.md's 7B tables that vouch for each paper config: (mesh, micro-batches).
PAPER_ROWS = {("azr-coding", "configs/coding.py", ""): ((1, -1, 4), 2),
              ("sgs-lean", "configs/lean.py", ""): ((1, -1, 1), 8),
              ("sgs-lean", "configs/lean.py", "80gb"): ((1, -1, 4), 2)}


@pytest.mark.parametrize("workload,config_file,variant", sorted(PAPER_ROWS))
def test_paper_workloads_are_the_paper_configs(workload, config_file, variant):
  """docs/sharding.md's 7B tables are compiled at PAPER_WORKLOADS' shapes with a mesh and micro-batch
  per row: they must be what the paper configs run (mesh, micro-batches, sampler rows and lengths,
  reference size, model knobs), or the tables would vouch for a different program."""
  config = load_config(config_file, variant)
  work = mr.PAPER_WORKLOADS[workload]
  mesh, micro_batch = PAPER_ROWS[(workload, config_file, variant)]
  assert (config.mesh.data, config.mesh.fsdp, config.mesh.tensor) == mesh
  assert config.train.micro_batch_size == config.reward.micro_batch_size == micro_batch
  if micro_batch == 8:  # the workload's own micro-batches; 2 = the tables' --micro-batch 2 rows
    assert work.train_micro_batch == work.reward_micro_batch == 8
  assert work.reference_size == config.reward.reference_size
  assert work.sampler_rows == config.sampling.micro_batch_size
  assert (work.sampler_prompt_len, work.sampler_new_tokens) == (config.sampling.max_prompt_tokens,
                                                                 config.sampling.max_new_tokens)
  assert config.model.remat and config.model.attention_query_chunk == 1024 and config.model.scan_layers
  # Rows packed by length (config_base.pack_update_rows): no pass holds more tokens than a padded
  # micro-batch at the longest row the config allows.
  assert config.train.micro_batch_tokens == micro_batch * (config.sampling.max_prompt_tokens +
                                                           config.sampling.max_new_tokens)


@pytest.mark.parametrize("config_file", ["configs/coding.py", "configs/lean.py"])
def test_small_variants_keep_a_one_device_mesh(config_file):
  for variant in ("demo", "tiny"):
    config = load_config(config_file, variant)
    assert config.mesh.tensor == 1, variant


def test_update_with_engine_adds_the_cache_and_the_weight_copy_by_hand():
  """The engine-alive peak of the update: the train row's peak + half of what the params and optimizer
  state leave free (the engine's default KV budget) + the bf16 weights over one host's sampler devices."""
  from compassplay_jax.costs import memory_report as mr
  cfg = mr.PAPER_MODELS["qwen2.5-coder-7b"]
  # Qwen2.5-Coder-7B: 7.615616512e9 weights (its config.json's layout, tied=False, q/k/v biases).
  assert mr._param_count(cfg) == 7_615_616_512  # pylint: disable=protected-access
  gib = mr.GIB
  row = {"model": "m", "mesh": "x", "function": "train", "peak": 46 * gib, "device_bytes": 80 * gib}
  out = mr.update_with_engine(row, cfg, params_bytes=4 * gib, opt_bytes=8 * gib, sampler_devices=4)
  assert out["engine_cache"] == int(0.5 * (80 - 12) * gib)
  assert out["engine_weights"] == 7_615_616_512 * 2 // 4
  assert out["engine_alive_peak"] == 46 * gib + out["engine_cache"] + out["engine_weights"]
  assert out["fits_released"] and not out["fits_alive"]
  assert "| m | x | 80.00 GiB | 46.00 GiB |" in mr.format_engine_table([out])
