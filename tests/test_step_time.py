"""The step-time model (compassplay_jax/costs/step_time_model.py) and experiments/step_time.py.

Decode schedules against a naive step-by-step simulation; call counts against the loops' own
batching; the loop-free premise of experiments/step_time.py (XLA counts a loop body once) against
XLA itself; and the script end to end on the tiny model.
"""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

from compassplay_jax.costs import step_time_model as stm
from compassplay_jax.cli.sweep import load_config

REPO = pathlib.Path(__file__).resolve().parents[1]


# ---- decode schedules vs a naive simulation --------------------------------------------------------

def naive_static(lengths, rows):
  """Step by step: a micro-batch runs until none of its rows has tokens left to decode."""
  steps = 0
  for i in range(0, len(lengths), rows):
    left = [x - 1 for x in lengths[i:i + rows]]  # the prefill samples each row's first token
    while any(v > 0 for v in left):
      left = [v - 1 for v in left]
      steps += 1
  return steps


def naive_continuous(lengths, slots):
  """Step by step: fill every free slot from the queue (a row with nothing to decode frees its slot
  at once), decode one step for every busy slot, free the slots whose rows ended."""
  queue, busy, steps = [x - 1 for x in lengths], [None] * slots, 0
  while True:
    for b in range(slots):
      while busy[b] is None and queue:
        left = queue.pop(0)
        busy[b] = left if left > 0 else None
    if all(v is None for v in busy):
      return steps
    steps += 1
    busy = [None if v is None or v == 1 else v - 1 for v in busy]


@pytest.mark.parametrize("seed", range(6))
def test_schedules_match_naive_simulation(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 90))
  lengths = stm.lognormal_lengths(n, mean=float(rng.uniform(2, 40)), sigma=float(rng.uniform(0, 1.5)), cap=64, rng=rng)
  lengths = [int(x) for x in lengths]
  for width in (1, 3, 8, 32, 100):
    static = stm.static_decode_steps(lengths, width)
    cont = stm.continuous_decode_steps(lengths, width)
    assert static == naive_static(lengths, width)
    assert cont == naive_continuous(lengths, width)
    assert cont <= static  # list scheduling starts every request no later than the static batches do


def test_schedules_by_hand():
  lengths = [10, 2, 2, 2, 6, 1]
  # micro-batches of 2: (10, 2) -> 9, (2, 2) -> 1, (6, 1) -> 5
  assert stm.static_decode_steps(lengths, 2) == 15
  # 2 slots: 10 -> [0, 9); 2 -> [0, 1); 2 -> [1, 2); 2 -> [2, 3); 6 -> [3, 8); 1 -> at 8, nothing to decode
  assert stm.continuous_decode_steps(lengths, 2) == 9
  assert stm.continuous_decode_steps(lengths, 6) == 9 == stm.static_decode_steps(lengths, 6)
  assert stm.static_decode_steps([], 4) == stm.continuous_decode_steps([], 4) == 0
  with pytest.raises(ValueError, match="at least one token"):
    stm.static_decode_steps([3, 0], 2)
  with pytest.raises(ValueError, match="slots=0"):
    stm.continuous_decode_steps([3], 0)


def test_kv_token_reads_match_a_step_loop():
  """Attention over the filled cache: the step that samples token t of a row reads prompt + t entries."""
  rng = np.random.default_rng(1)
  lengths = [int(x) for x in stm.lognormal_lengths(50, mean=30.0, sigma=1.0, cap=200, rng=rng)] + [1]
  naive = sum(prompt + t for x in lengths for t in range(1, x) for prompt in (17,))
  assert stm.kv_token_reads(lengths, 17) == naive
  assert stm.kv_token_reads([1], 5) == 0 and stm.kv_token_reads([3], 5) == 6 + 7


def test_lognormal_lengths_mean_and_cap():
  rng = np.random.default_rng(0)
  x = stm.lognormal_lengths(200_000, mean=1000.0, sigma=1.0, cap=10 ** 9, rng=rng)
  assert abs(x.mean() / 1000.0 - 1) < 0.02
  assert abs(np.median(x) / (1000.0 * np.exp(-0.5)) - 1) < 0.02  # median = mean x exp(-sigma^2 / 2)
  capped = stm.lognormal_lengths(10_000, mean=1000.0, sigma=1.0, cap=2000, rng=rng)
  assert capped.max() == 2000 and capped.min() >= 1
  with pytest.raises(ValueError, match="mean"):
    stm.lognormal_lengths(3, mean=1.0, sigma=1.0, cap=10, rng=rng)


# ---- time formula and verifier model ---------------------------------------------------------------

def test_seconds_take_the_slowest_term():
  hw = stm.Hardware("x", peak_flops=100.0, hbm_bytes_s=10.0, link_bytes_s=1.0, source="")
  eff = stm.Efficiency(flops=0.5, hbm=0.5, link=0.5)
  assert stm.seconds(100, 1, 0, hw, eff) == 2.0 and stm.bound(100, 1, 0, hw, eff) == "compute"
  assert stm.seconds(100, 30, 0, hw, eff) == 6.0 and stm.bound(100, 30, 0, hw, eff) == "HBM"
  assert stm.seconds(100, 30, 4, hw, eff) == 8.0 and stm.bound(100, 30, 4, hw, eff) == "link"
  with pytest.raises(ValueError, match="hbm=0"):
    stm.Efficiency(hbm=0)


def test_check_seconds():
  one_pool = stm.CheckBatch("pool", groups=1, jobs_per_group=100, workers=8)
  assert stm.check_seconds(one_pool, 2.0, 0.0, 60.0) == 13 * 2.0  # ceil(100 / 8) rounds of 2 s
  one_by_one = stm.CheckBatch("seq", groups=50, jobs_per_group=1, workers=8)
  assert stm.check_seconds(one_by_one, 2.0, 0.0, 60.0) == 100.0  # workers idle: one job at a time
  # with timeouts: each group waits the timeout with probability 1 - (1 - f)^g
  per_problem = stm.CheckBatch("lean", groups=10, jobs_per_group=8, workers=8)
  assert stm.check_seconds(per_problem, 14.0, 0.01, 60.0) == pytest.approx(10 * (14.0 + (1 - 0.99 ** 8) * 60.0))


# ---- call counts from the configs ---------------------------------------------------------------------

def test_coding_paper_step_plan():
  config = load_config(str(REPO / "configs/coding.py"))
  plan = stm.coding_step_plan(config, batch_divisor=2)
  c = config.coding
  # CodingSelfPlay._propose_all: abduction and deduction share a call, induction (no prefix) has its own.
  assert [(g.label, g.prompts, g.samples) for g in plan.generate] == [
      ("proposals (abduction/deduction)", 2 * c.proposals_per_type, 1),
      ("proposals (induction)", c.proposals_per_type, 1),
      ("solve-rate samples", 3 * c.proposals_per_type, c.solve_samples),
      ("solver rollouts", 3 * c.solver_tasks_per_type, 1)]
  assert plan.sequences == 192 + 192 * 8 + 192 == 1920
  assert (plan.g_ref_passes, plan.g_ref_rows) == (32 // 2, 2)
  assert (plan.cosine_passes, plan.cosine_rows) == (192 // 2, 2)
  assert (plan.train_micro_batches, plan.train_rows, plan.optimizer_steps, plan.logprob_passes) == (384 // 2, 2, 1, 0)
  assert plan.update_chunks == (384,)
  # config_base.pack_update_rows: rows packed by length, at most one padded micro-batch's tokens a pass
  assert config.train.micro_batch_tokens == 2 * (6144 + 8096)
  config.train.ppo_mini_batches = 5  # coding.ppo_mini_batches: 384 rows as 77, 77, 77, 77, 76
  ppo = stm.coding_step_plan(config, batch_divisor=2)
  assert (ppo.optimizer_steps, ppo.train_micro_batches, ppo.logprob_passes) == (5, 4 * 39 + 38, 3 * 39 + 38)
  config.train.ppo_mini_batches = 1
  assert [b.jobs for b in plan.checks] == [192, 192 * 8, 192] and plan.checks[0].workers == 64
  half = stm.coding_step_plan(config, batch_divisor=2, valid_fraction=0.5)
  assert half.generate[2].prompts == 96 and half.cosine_passes == 48
  # a scaffold decodes program and input as two segments of each proposal
  config.coding.input_scaffold = "```input\n"
  scaffolded = stm.coding_step_plan(config, batch_divisor=2)
  assert [g.prompts for g in scaffolded.generate[:3]] == [128, 128, 64]


def test_lean_paper_iteration_plan():
  config = load_config(str(REPO / "configs/lean.py"))
  outcomes = stm.LeanOutcomes(targets=1000, solved_fraction=0.4, valid_fraction=0.5, eligible_fraction=0.25,
                              solver_row_fraction=0.1, conjecture_row_fraction=0.5)
  plan = stm.lean_iteration_plan(config, batch_divisor=8, outcomes=outcomes)
  # 400 seeds -> 400 conjectures -> 200 valid -> 50 eligible; proofs (1000 + 200) x 8
  assert [(g.prompts, g.samples) for g in plan.generate] == [(400, 1), (1200, 8)]
  assert [(b.groups, b.jobs_per_group, b.workers) for b in plan.checks] == [(1, 1200 * 8, config.lean.num_workers)]
  # one g_ref and one cosine call per eligible seed, a single row padded to the mesh's 8
  assert (plan.g_ref_passes, plan.g_ref_rows, plan.cosine_passes, plan.cosine_rows) == (50, 8, 50, 8)
  rows = 960 + 25  # 10% of 9600 proofs + half of 50 conjectures: 30 batches of 32 and one of 25
  assert plan.optimizer_steps == -(-rows // 32) == 31
  assert plan.train_micro_batches == 30 * 4 + 4 and plan.train_rows == 8
  assert plan.update_chunks == (32,) * 30 + (25,)
  assert config.train.micro_batch_tokens == 8 * (2048 + 8192)
  # bf16 compute: old log-probs recomputed by a forward pass for every batch after the first (step.update_params)
  assert config.model.dtype == "bfloat16" and plan.logprob_passes == 30 * 4
  config.train.recompute_logprobs = "off"
  assert stm.lean_iteration_plan(config, batch_divisor=8, outcomes=outcomes).logprob_passes == 0


def test_packed_update_tokens_by_hand():
  """Two optimizer steps packed by length (1,024-token budget, mesh batch divisor 2), counted by hand on
  TRAIN_BUCKETS: step 1 = (128, 384) + (128, 32) in one pass of 2 x 512 tokens, then (128, 32) alone in
  a last pass of 1 row, padded to 2 rows of 160; step 2 = one row of (128, 32), padded to 2 rows."""
  chunks = [[(100, 300), (100, 20), (100, 30)], [(100, 20)]]
  assert stm.packed_update_tokens(chunks, 1024, None, 2) == 2 * 512 + 2 * 160 + 2 * 160
  # A budget that fits every row of step 1 at its longest: one pass of 4 rows (3 real) of 512 columns.
  assert stm.packed_update_tokens(chunks[:1], 4 * 512, None, 1) == 4 * 512


def test_packed_update_share_of_equal_lengths():
  """The paper coding update with every completion at 1,000 tokens (sigma ~ 0): rows (2048, 1024) in
  passes of 8 (the power of two under 28480 / 3072): 48 passes of 8 x 3072 tokens, against 192 padded
  micro-batches of 2 x 10144."""
  script = _script()
  config = load_config(str(REPO / "configs/coding.py"))
  plan = stm.coding_step_plan(config, batch_divisor=2)
  share = script.packed_update_share(plan, config, 2, 2048 + 8096, 2048, 1000.0, 1e-9, 8096, 3, 0)
  assert share == pytest.approx(48 * 8 * 3072 / (192 * 2 * 10144))
  config.train.micro_batch_tokens = 0  # rows padded to one shape: no packed share
  assert script.packed_update_share(plan, config, 2, 10144, 2048, 1000.0, 1.0, 8096, 3, 0) is None


def test_reward_micro_batch_is_the_engines():
  """The plan's rows per g_ref / cosine pass are what engine.Engine.reward_micro_batch returns."""
  import jax
  from compassplay_jax.costs import memory_report as mr
  from compassplay_jax.infra import sharding as sh
  cfg, work = mr.tiny_workload()
  engine, _ = mr.workload_engine(cfg, sh.make_mesh((1, 1, 1), jax.devices()[:1]), dataclasses.replace(
      work, reward_micro_batch=3))
  for rows in (1, 2, 3, 7, 32):
    assert stm.reward_micro_batch(3, rows, engine.batch_divisor) == engine.reward_micro_batch(rows)


# ---- XLA's cost analysis: the premise of the loop-free units ------------------------------------------

def test_xla_counts_a_loop_body_once():
  """experiments/step_time.py multiplies one micro-batch's cost by the micro-batches; that is right
  only while XLA's cost analysis counts a scanned micro-batch once. If this fails (XLA multiplies by
  trip counts), the units would be counted twice over."""
  import jax
  from compassplay_jax.costs import memory_report as mr
  from compassplay_jax.infra import sharding as sh
  cfg, work = mr.tiny_workload()
  mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])

  def flops(w):
    lowered, _ = mr.lower_function("train", cfg, mesh, w)
    return lowered.compile().cost_analysis()["flops"]

  one = flops(dataclasses.replace(work, train_batch=8, train_micro_batch=8))
  two = flops(dataclasses.replace(work, train_batch=16, train_micro_batch=8))
  assert two == pytest.approx(one, rel=0.01)
  # an independent count of one micro-batch's matmul FLOPs: forward 2 x (matmul params) per token,
  # backward twice that; attention adds to it, elementwise work a little
  d, f, layers, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
  kv = cfg.num_key_value_heads * cfg.head_dim
  matmul_params = layers * (2 * d * d + 2 * d * kv + 3 * d * f) + d * v
  assert one > 3 * 2 * matmul_params * 8 * work.seq_len


# ---- the script end to end --------------------------------------------------------------------------

def test_step_time_script_on_the_tiny_model(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  command = [sys.executable, "experiments/step_time.py", "--tiny", "--setting", "lean", "--lean-targets", "8",
             "--lean-prompt-bucket", "16", "--trials", "3", "--cache", str(tmp_path)]
  first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  figures = sorted(tmp_path.glob("*.json"))
  rows = {r["key"]: r for r in (json.loads(p.read_text()) for p in figures)}
  assert set(rows) == {"prefill", "decode", "decode_wide", "g_ref", "cosines", "train"}
  out = first.stdout
  assert "| proofs (targets + valid conjectures) | 10 | 4 | 40 |" in out  # 8 targets + 2 valid conjectures, k = 4
  assert "| verify | proofs: 40 jobs, 2 workers | host CPU | 1 |" in out
  assert rows["train"]["mesh"] == "data=1, fsdp=8, tensor=1" and rows["train"]["link_bytes"] > 0
  # a decode step's HBM bytes in the table: the weights and KV cache one device holds, read once
  decode = rows["decode"]
  assert decode["cache_bytes"] * 2 == rows["decode_wide"]["cache_bytes"]  # 32 and 64 rows
  assert decode["param_bytes"] == rows["prefill"]["param_bytes"] > 0
  # the cache alone rebuilds the same tables
  again = subprocess.run(command + ["--no-compile"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.split("\n", 1)[1] == out.split("\n", 1)[1]
  missing = subprocess.run(command[:-1] + [str(tmp_path / "empty"), "--no-compile"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
  assert missing.returncode == 1 and "no cached figures for prefill" in missing.stderr


def _script():
  import importlib.util
  spec = importlib.util.spec_from_file_location("step_time_script", REPO / "experiments" / "step_time.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def test_collective_bytes_of_hlo_text():
  hlo = "\n".join([
      "  %ag = bf16[8,64]{1,0} all-gather(bf16[2,64]{1,0} %p), replica_groups=[2,4]<=[8], dimensions={0}",
      "  %ar = (f32[16]{0}, f32[4,4]{1,0}) all-reduce(%a, %b), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add",
      "  %rs = f32[4]{0} reduce-scatter(f32[32]{0} %c), replica_groups=mesh['x'=2,'y'=4] {'y'}, dimensions={0}",
      "  %cp = s32[10]{0} collective-permute(s32[10]{0} %d), source_target_pairs={{0,1}}",
      "  %add = f32[16]{0} add(%e, %f)"])
  total, counts = _script().collective_bytes(hlo, devices=8)
  ag = 3 / 4 * 8 * 64 * 2      # groups of 4: receives 3/4 of the gathered output
  ar = 2 * 1 / 2 * (16 + 16) * 4  # groups of 2, a tuple of two f32 arrays
  rs = 3 * 4 * 4               # groups of 4 (mesh axis y): sends 3 output-sized pieces
  assert counts == {"all-gather": 1, "all-reduce": 1, "reduce-scatter": 1, "collective-permute": 1}
  assert total == ag + ar + rs + 10 * 4


def test_decode_bytes_are_weights_and_cache_read_once():
  f = {"flops": 1.0, "bytes": 1000.0, "link_bytes": 0.0, "param_bytes": 40.0, "cache_bytes": 10.0}
  assert _script().decode_figures(f)["bytes"] == 50.0 and _script().decode_figures(f)["xla_bytes"] == 1000.0
  assert _script().decode_figures(f, weight_scale=0.5)["bytes"] == 30.0


# ---- the program that runs (experiments/step_time.py --program) ------------------------------------

def _qwen7b():
  from compassplay_jax.models.config import ModelConfig
  return ModelConfig(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, attention_bias=True,
                     dtype="bfloat16")


def test_param_count_is_the_published_one():
  cfg = _qwen7b()
  assert stm.param_count(cfg) == 7_615_616_512  # Qwen2.5-7B's safetensors total
  assert stm.matmul_params(cfg) == 7_615_616_512 - 152064 * 3584


def test_engine_slots_by_hand():
  cfg = _qwen7b()
  # A slot at 16384 columns, bf16, tensor 4 (one KV head and 7 query heads a chip): its cache row,
  # fp32 scores over the columns and four vocab-sized fp32 buffers.
  per_slot = 2 * 28 * 16384 * 1 * 128 * 2 + 2 * 7 * 16384 * 4 + 4 * 152064 * 4
  # The reserve: one 2048-token prefill row (max_prefill_tokens 2048 // 2048), batching.bytes_per_row.
  reserve = 2 * 28 * 2048 * 4 * 128 * 2 + 2048 * (4 * 3584 + 3 * 18944 + 28 * 2048) * 4 + 4 * 152064 * 4
  budget = 26.5e9
  want = int((budget - reserve) // per_slot)
  assert stm.engine_slots(cfg, 16384, budget, 2048, tensor=4, batch_divisor=2) == 2 * want
  assert stm.engine_slots(cfg, 16384, budget, 2048, tensor=4, batch_divisor=1) == want
  # A 512-token bucket reserves a prefill of 4 rows.
  reserve4 = 4 * (2 * 28 * 512 * 4 * 128 * 2 + 512 * (4 * 3584 + 3 * 18944 + 28 * 512) * 4 + 4 * 152064 * 4)
  assert stm.engine_slots(cfg, 16384, budget, 512, tensor=4, batch_divisor=1) == int((budget - reserve4) // per_slot)
  # free memory: the limit less 12 bytes a parameter over the devices
  assert stm.free_device_bytes(80e9, 8_000_000_000, 8) == 80e9 - 12e9
  with pytest.raises(ValueError, match="exceed"):
    stm.free_device_bytes(10e9, 8_000_000_000, 8)


def test_call_slots_and_windows():
  assert stm.call_slots(216, 1536, 2) == 216
  assert stm.call_slots(216, 128, 2) == 128
  assert stm.call_slots(189, 96, 1) == 128
  assert stm.call_slots(100, 3, 8) == 8  # at least the batch divisor
  assert stm.windows(16384)[:3] == (16384, 8192, 4096) and stm.windows(16384)[-1] == 64
  assert stm.windows(17408) == (17408, 8704, 4352, 2176, 1088, 544, 272, 136, 68)


def test_continuous_run_by_hand():
  # 2 slots, chunks of 8, prompts in a 100-column bucket, cache 256 (windows 256, 128, 64).
  run = stm.continuous_run([5, 3, 9], [100] * 3, 2, cache_length=256, chunk=8)
  # chunk 1: rows 0 (4 steps) and 1 (2 steps), a row waits: ends when row 1 does, after 2 steps;
  # reach = 101 + 8 -> window 128. chunk 2: rows 0 (2 left) and 2 (8): 8 steps, reach 103 + 8 -> 128.
  assert run.steps == 10 and run.chunks == 2 and run.shape_steps == {(2, 128): 10}
  assert run.slot_window_entries == 2 * 2 * 128 + 8 * 2 * 128
  # filled columns read: chunk 1 rows 0, 1: 101 + 102 each; chunk 2 row 0: 103 + 104, row 2: 101..108
  assert run.filled_entries == 2 * (101 + 102) + (103 + 104) + sum(range(101, 109))
  assert run.useful_slot_steps == 4 + 2 + 8
  # prefills: 2 new prompts (one call of 2 rows), then 1 (one row); one insert per admission
  assert run.prefills == [(2, 100), (1, 100)] and run.inserts == 2 and not run.compacts


def test_continuous_run_steps_are_list_scheduling_and_shrinks():
  rng = np.random.default_rng(3)
  lengths = [int(x) for x in stm.lognormal_lengths(300, mean=40.0, sigma=1.0, cap=400, rng=rng)]
  for slots, chunk in ((8, 1), (8, 8), (32, 4)):
    run = stm.continuous_run(lengths, [64] * len(lengths), slots, cache_length=512, chunk=chunk, batch_divisor=2,
                             shrink_floor=1)
    # chunking and shrinking change slot counts and host reads, never when a row ends
    assert run.steps == stm.continuous_decode_steps(lengths, slots)
    assert run.useful_slot_steps == sum(x - 1 for x in lengths)
    assert sum(run.shape_steps.values()) == run.steps
    assert run.filled_entries <= run.slot_window_entries
  # the drain: 8 slots over 2 batch devices shrink to 2 x 2 once at most 4 rows are live, then to 2 x 1
  run = stm.continuous_run([50, 50, 50, 2, 2, 2, 2, 2], [64] * 8, 8, cache_length=512, chunk=8, batch_divisor=2,
                           shrink_floor=1)
  assert (8, 4) in run.compacts and {s for s, _ in run.shape_steps} == {8, 4}
  # samples: rows 0..3 are one prompt's samples, prefilled once
  run = stm.continuous_run([5] * 4, [64] * 4, 4, cache_length=128, chunk=8, samples=4)
  assert run.prefills == [(1, 64)]


def test_sampler_mesh_and_decode_figures_by_hand():
  cfg = _qwen7b()
  one_host = stm.sampler_mesh(8, 2, 4, hosts=1)
  per_host = stm.sampler_mesh(8, 2, 4, hosts=2)
  assert one_host == stm.Mesh(8, 2, 4) and per_host == stm.Mesh(4, 1, 4)
  # a whole bf16 copy per host: twice the weight bytes per chip
  assert stm.sampler_weight_bytes(cfg, per_host) == 2 * stm.sampler_weight_bytes(cfg, one_host) \
      == 7_615_616_512 * 2 / 4
  assert stm.kv_entry_bytes(cfg, per_host) == 2 * 28 * 1 * 128 * 2
  flops, hbm, link = stm.decode_step_figures(cfg, per_host, 100, 4096)
  assert flops == (2 * stm.matmul_params(cfg) * 100 + 4 * 28 * 128 * 28 * 4096 * 100) / 4
  assert hbm == 7_615_616_512 * 2 / 4 + 100 * 4096 * 14336
  assert link == 2 * 28 * 100 * 3584 * 2 * 2 * 3 / 4
  _, hbm8, _ = stm.decode_step_figures(cfg, one_host, 100, 4096)
  assert hbm8 == 7_615_616_512 * 2 / 8 + 50 * 4096 * 14336  # 50 slots a chip
  assert stm.forward_flops(cfg, 2, 10, causal=False) == 2 * (2 * stm.matmul_params(cfg) * 10 + 4 * 28 * 128 * 28 * 100)


def test_run_seconds_fixed_costs_by_hand():
  cfg = _qwen7b()
  run = stm.continuous_run([5, 3, 9], [100] * 3, 2, cache_length=256, chunk=8)
  fixed = stm.FixedCosts(collective_latency_s=1e-5, step_launch_s=1e-4, chunk_sync_s=2e-3, call_s=1e-3)
  mesh = stm.sampler_mesh(8, 2, 4, hosts=1)
  hw, eff = stm.HARDWARE["h100"], stm.Efficiency()
  out = stm.run_seconds(run, cfg, mesh, hw, eff, fixed)
  assert out["decode_fixed"] == pytest.approx(10 * (56 * 1e-5 + 1e-4))
  assert out["sync"] == pytest.approx(2 * 2e-3)
  f, b, link = stm.decode_step_figures(cfg, mesh, 2, 128)
  assert out["decode"] == pytest.approx(10 * stm.seconds(f, b, link, hw, eff))
  assert out["filled_decode"] <= out["decode"]
  prefill = sum(stm.seconds(stm.forward_flops(cfg, r, L) / 8, stm.sampler_weight_bytes(cfg, mesh), 0, hw, eff)
                for r, L in run.prefills)
  assert out["prefill"] == pytest.approx(prefill + (2 + 2) * 1e-3)  # 2 prefills + 2 inserts


def test_checkpoint_and_evaluation_counts():
  # 91.4 GB of fp32 params + AdamW every 10 steps: async blocks on the host copy of each host's half
  assert stm.checkpoint_seconds(91.4e9, 10, async_save=True, write_bytes_s=0.4e9, host_copy_bytes_s=10e9,
                                hosts=2) == pytest.approx(91.4e9 / 2 / 10e9 / 10)
  assert stm.checkpoint_seconds(91.4e9, 10, async_save=False, write_bytes_s=0.4e9, host_copy_bytes_s=10e9) \
      == pytest.approx(91.4e9 / 0.4e9 / 10)
  assert stm.checkpoint_seconds(1e9, 0, async_save=True, write_bytes_s=1, host_copy_bytes_s=1) == 0
  from compassplay_jax.evals import harness
  config = load_config(str(REPO / "configs/coding.py"))
  e = config.eval
  steps = stm.evaluation_steps(config.steps, e.every_steps, e.dense_every_steps, e.dense_from_step, e.at_start)
  assert steps == [s for s in range(config.steps + 1) if harness.due(s, e)]
  assert steps == [0, 25, 50, 75, 100, 125] + list(range(150, 201, 5)) and len(steps) == 17
  rng = np.random.default_rng(0)
  assert (stm.greedy_lengths(50, 100.0, 1.0, 700, 1.0, rng) == 700).all()
  assert stm.greedy_lengths(5000, 100.0, 1.0, 10 ** 6, 0.0, rng).max() < 10 ** 6


@pytest.mark.parametrize("pages", [200, 30, 20])
def test_paged_run_is_the_paged_engines_schedule(pages):
  """stm.paged_run against the real paged engine (tiny model, greedy, no eos: each row runs to its
  budget): the same decode steps, device calls, preemptions and kept slot steps, with a pool that
  holds every row (200 pages of 4), and two that preempt (30, 20)."""
  from compassplay_jax.models.config import ModelConfig
  from compassplay_jax.models.decoder import init_decoder
  from compassplay_jax.sampling import SamplingConfig
  from compassplay_jax.sampling.continuous import ContinuousEngine
  from compassplay_jax.sampling.rollout_engine import Request
  from flax import nnx
  graphdef, params = nnx.split(init_decoder(ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=40), seed=2))
  rng = np.random.default_rng(3)
  prompts = [int(x) for x in rng.integers(2, 20, 24)]
  budgets = [int(x) for x in rng.integers(1, 40, 24)]  # some rows of one token: they end at their insert
  requests = [Request([int(t) for t in rng.integers(1, 61, p)], max_new_tokens=b) for p, b in zip(prompts, budgets)]
  engine = ContinuousEngine(graphdef, None, params, slots=6, chunk_tokens=4, kv_layout="paged", page_size=4,
                            num_pages=pages, shrink_floor=1)
  res = engine.generate(requests, SamplingConfig(temperature=0.0, max_new_tokens=40, eos_ids=()), 0)
  assert [len(t) for t in res.tokens] == budgets
  run = stm.paged_run(budgets, prompts, 6, pages_per_shard=pages, page_size=4, chunk=4, shrink_floor=1)
  got = (run.steps, run.chunks, run.preempted, run.useful_slot_steps)
  assert got == (engine.stats.decode_steps, engine.stats.decode_calls, engine.stats.preempted,
                 engine.stats.useful_slot_steps)
  assert (run.preempted > 0) == (pages < 200)
  assert sum(run.paged_steps.values()) == run.steps


def test_paged_step_reads_held_pages_not_a_window():
  """A paged step's bytes: the weight copy plus the columns its rows hold, whatever the window; the
  dense step of the same slots reads a window per slot."""
  cfg = types.SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              hidden_size=32, intermediate_size=64, vocab_size=100, tie_word_embeddings=False)
  mesh = stm.Mesh(devices=1, batch_divisor=1, tensor=1)
  f0, b0, _ = stm.decode_step_figures(cfg, mesh, 4, 0)
  f, b, _ = stm.paged_step_figures(cfg, mesh, 4, 96)
  assert b - b0 == 96 * 2 * 2 * 2 * 8 * 2  # columns x (K, V) x layers x kv heads x head_dim x bf16
  assert f - f0 == 4 * 4 * 8 * 2 * 96  # q.k and p.v over 96 columns, all heads and layers
  assert stm.paged_step_figures(cfg, mesh, 4, 96, kv_read_factor=4.0)[1] - b0 == 4 * (b - b0)
  fd, bd, _ = stm.decode_step_figures(cfg, mesh, 4, 512)
  assert bd - b0 == 4 * 512 * 2 * 2 * 2 * 8 * 2  # a window of 512 for each of the 4 slots
